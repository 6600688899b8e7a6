// `safetensors inspect FILE|URL|INDEX [--json]`: a file's (or a sharded checkpoint's) metadata,
// every tensor (name, dtype, shape, bytes, offset) and the totals by dtype, as a table or as
// JSON. Reads only headers (the read backend reads the header and nothing else; a URL is
// opened header-only).
#include <safetensors/safetensors.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"

namespace cli {

namespace {

using safetensors::Backend;

struct Row {
  std::string name;
  safetensors::TensorInfo info;
  std::string shard;  // empty for a single file
};

/// What the headers say: every tensor, in file order for a single file.
struct Listing {
  bool index = false;
  std::vector<Row> rows;
  std::map<std::string, std::string> metadata;
  bool has_metadata = false;
  std::uint64_t file_bytes = 0;
  std::uint64_t header_bytes = 0;  // a single file's only
  std::size_t shards = 1;
};

/// `text` with each `%XX` turned back into its byte.
std::string percent_decoded(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

/// `shard` as the index names it: relative to the index's folder (shards in different folders
/// may share a file name), or whole where it is not below it.
std::string shard_name(const Location& index, const std::string& shard) {
  if (index.is_url()) {
    // A remote index's shards are URLs next to it, each name percent-encoded in them: shown
    // relative to its directory, decoded, as the index spells them.
    const std::string& i = index.text();
    const std::string base = i.substr(0, i.rfind('/') + 1);
    return shard.starts_with(base) ? percent_decoded(shard.substr(base.size())) : shard;
  }
  std::error_code ec;
  fs::path dir = fs::absolute(local_path(index, {}), ec).parent_path().lexically_normal();
  fs::path relative = fs::path(shard).lexically_normal().lexically_relative(dir);
  return ec || relative.empty() || *relative.begin() == ".." ? shard : relative.string();
}

Listing list_checkpoint(const Location& path) {
  // A URL: the index, then each shard's header only.
  safetensors::Checkpoint ckpt = open_checkpoint(path, {Backend::Read}, /*header_only=*/true);
  Listing l;
  l.index = true;
  l.metadata = ckpt.metadata();
  l.has_metadata = ckpt.has_metadata();
  l.shards = ckpt.shard_count();
  for (const auto& k : ckpt.keys()) l.rows.push_back({k, ckpt.info(k), shard_name(path, ckpt.shard_of(k))});
  // The lengths the checkpoint validated (measuring the paths again could find other files).
  for (std::size_t s = 0; s < l.shards; ++s) l.file_bytes += ckpt.shard_sizes(s).file();
  return l;
}

Listing list_file(const Location& path) {
  // A URL: its header only (one or two ranged GETs).
  safetensors::SafeOpen f = open_file(path, {Backend::Read}, /*header_only=*/true);
  Listing l;
  l.metadata = f.metadata();
  l.has_metadata = f.has_metadata();
  for (const auto& k : f.offset_keys()) l.rows.push_back({k, f.info(k), {}});
  l.file_bytes = f.data_offset() + f.data_size();  // the length validated, not measured again
  l.header_bytes = f.header_size();
  return l;
}

struct Totals {
  std::uint64_t parameters = 0, bytes = 0;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_dtype;  // parameters, bytes
};

Totals totals_of(const std::vector<Row>& rows) {
  Totals t;
  for (const auto& r : rows) {
    t.parameters += r.info.numel();
    t.bytes += r.info.byte_size();
    auto& d = t.by_dtype[std::string(safetensors::to_string(r.info.dtype))];
    d.first += r.info.numel();
    d.second += r.info.byte_size();
  }
  return t;
}

// ---- --json -------------------------------------------------------------------------------

Json tensor_json(const Row& r) {
  Json t =
      Json::object({{"name", r.name},
                    {"dtype", safetensors::to_string(r.info.dtype)},
                    {"shape", r.info.shape},
                    {"bytes", r.info.byte_size()},
                    {"data_offsets", Json::array({r.info.data_offsets.first, r.info.data_offsets.second})}});
  if (!r.shard.empty()) t["shard"] = r.shard;
  return t;
}

Json totals_json(const Totals& totals, std::size_t tensors) {
  Json by_dtype = Json::object();
  for (const auto& [dtype, pb] : totals.by_dtype)
    by_dtype[dtype] = Json::object({{"parameters", pb.first}, {"bytes", pb.second}});
  return Json::object({{"tensors", tensors},
                       {"parameters", totals.parameters},
                       {"bytes", totals.bytes},
                       {"by_dtype", std::move(by_dtype)}});
}

void print_json(const Location& path, const Listing& l, const Totals& totals) {
  Json doc = Json::object({{"path", path.text()}, {"file_bytes", l.file_bytes}});
  if (!l.index) doc["header_bytes"] = l.header_bytes;
  doc["shards"] = l.shards;
  doc["metadata"] = l.has_metadata ? Json(l.metadata) : Json(nullptr);
  Json tensors = Json::array();
  for (const auto& r : l.rows) tensors.push_back(tensor_json(r));
  doc["tensors"] = std::move(tensors);
  doc["totals"] = totals_json(totals, l.rows.size());
  std::puts(json_text(doc).c_str());
}

// ---- the table ----------------------------------------------------------------------------

void print_heading(const Location& path, const Listing& l) {
  std::printf("%s: %s bytes", printable(path.text()).c_str(), with_commas(l.file_bytes).c_str());
  if (l.index) {
    std::printf(" in %zu shards\n", l.shards);
  } else {
    std::printf(", header %s bytes\n", with_commas(l.header_bytes).c_str());
  }
  if (!l.has_metadata) {
    std::printf("metadata: none\n");
    return;
  }
  std::printf("metadata:\n");
  for (const auto& [k, v] : l.metadata) std::printf("  %s: %s\n", printable(k).c_str(), printable(v).c_str());
}

void print_tensors(const Listing& l) {
  // Columns fit the longest name and shape up to a cap: one huge name (a hostile file can hold
  // a 100,000-byte one) is printed whole on its own row instead of padding every row to it.
  constexpr std::size_t kMaxName = 60, kMaxShape = 32;
  std::size_t wn = 4, ws = 5;
  for (const auto& r : l.rows) {
    wn = std::max(wn, std::min(kMaxName, display_width(printable(r.name))));
    ws = std::max(ws, std::min(kMaxShape, shape_text(r.info.shape).size()));
  }
  std::printf("tensors (%zu):\n", l.rows.size());
  std::printf("  %s  %-11s  %s  %15s  %15s%s\n", padded("name", wn).c_str(), "dtype",
              padded("shape", ws).c_str(), "bytes", "offset", l.index ? "  shard" : "");
  for (const auto& r : l.rows) {
    std::printf("  %s  %-11s  %s  %15s  %15s%s%s\n", padded(printable(r.name), wn).c_str(),
                std::string(safetensors::to_string(r.info.dtype)).c_str(),
                padded(shape_text(r.info.shape), ws).c_str(), with_commas(r.info.byte_size()).c_str(),
                with_commas(r.info.data_offsets.first).c_str(), r.shard.empty() ? "" : "  ",
                printable(r.shard).c_str());
  }
}

void print_totals(const Totals& t) {
  std::printf("totals: %s parameters, %s bytes\n", with_commas(t.parameters).c_str(),
              with_commas(t.bytes).c_str());
  for (const auto& [d, pb] : t.by_dtype) {
    std::printf("  %-11s %s parameters, %s bytes\n", d.c_str(), with_commas(pb.first).c_str(),
                with_commas(pb.second).c_str());
  }
}

}  // namespace

int inspect_command(const std::vector<std::string>& args) {
  auto a = read_file_arguments("inspect", args, {"--json"});
  if (!a.more.empty()) throw UsageError("inspect takes one file");
  const Location& path = a.file;
  const bool json = a.flags.count("--json") > 0;
  Listing listing = path.is_index() ? list_checkpoint(path) : list_file(path);
  Totals totals = totals_of(listing.rows);
  if (json) {
    print_json(path, listing, totals);
  } else {
    print_heading(path, listing);
    print_tensors(listing);
    print_totals(totals);
  }
  return 0;
}

}  // namespace cli
