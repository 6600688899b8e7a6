// How the `safetensors` tool prints what a file controls (names, metadata, paths, messages that
// embed them): escaped for a terminal by `printable`, or as JSON by `json_text`, by one rule of
// what counts as a control character, so a file can neither forge output nor drive the terminal.
// Also the small formatting helpers every command's tables use, and when progress is shown.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <type_traits>
#include <utility>

#include "cli.hpp"

namespace cli {

namespace {

/// One UTF-8 sequence at `s[i]`: its code point and length, or length 0 where the bytes are not
/// valid UTF-8 (overlong forms, surrogates and values above U+10FFFF included).
std::pair<char32_t, std::size_t> decode_utf8(std::string_view s, std::size_t i) {
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b = byte(i);
  if (b < 0x80) return {b, 1};
  std::size_t len = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc2 ? 2 : 0;
  if (len == 0 || b > 0xf4 || i + len > s.size()) return {0, 0};
  char32_t c = b & (0x7f >> len);
  for (std::size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return {0, 0};
    c = (c << 6) | (byte(i + k) & 0x3f);
  }
  if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10ffff)) ||
      (c >= 0xd800 && c <= 0xdfff)) {
    return {0, 0};
  }
  return {c, len};
}

/// Characters that could move the cursor, rewrite a line, switch the terminal's state or
/// reorder what is shown: C0 and C1 controls, DEL, and Unicode's invisible direction and line
/// controls.
bool is_control(char32_t c) {
  return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f) || c == 0x200e || c == 0x200f ||
         (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069) || c == 0x2028 || c == 0x2029 ||
         c == 0xfeff;
}

/// The inside of a JSON string for `run`, which is valid UTF-8: `"` and `\` escaped, \n, \r and
/// \t by name, and every other control (C0, DEL, C1, Unicode's direction and line controls, as
/// `printable` counts them) as `\uNNNN`, \b and \f included, as the tool has always written them.
std::string json_escaped(std::string_view run) {
  std::string out;
  out.reserve(run.size());
  char buf[16];  // "\\u" and up to 8 hex digits of an unsigned, as far as the compiler can tell
  for (std::size_t i = 0; i < run.size();) {
    auto [c, len] = decode_utf8(run, i);
    if (len == 0) len = 1;  // not reached: `run` is UTF-8
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
    } else if (is_control(c)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out.append(run, i, len);
    }
    i += len;
  }
  return out;
}

/// A JSON string. Each byte that is not UTF-8 (possible in paths; JSON cannot carry it) is
/// written `\ufffd`, one per byte, as the tool has always written it.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  std::size_t run = 0;
  for (std::size_t i = 0; i < s.size();) {
    auto [c, len] = decode_utf8(s, i);
    if (len != 0) {
      i += len;
      continue;
    }
    out += json_escaped(std::string_view(s).substr(run, i - run)) + "\\ufffd";
    run = ++i;
  }
  return out + json_escaped(std::string_view(s).substr(run)) + "\"";
}

void write_json(const Json& value, JsonLayout layout, std::string& out) {
  const char* between = layout == JsonLayout::Compact ? "," : ", ";
  const char* after_key = layout == JsonLayout::Compact ? ":" : ": ";
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, Json::Object>) {
          out += '{';
          for (std::size_t i = 0; i < v.size(); ++i) {
            if (i) out += between;
            out += json_string(v[i].first) + after_key;
            write_json(v[i].second, layout, out);
          }
          out += '}';
        } else if constexpr (std::is_same_v<T, Json::Array>) {
          out += '[';
          for (std::size_t i = 0; i < v.size(); ++i) {
            if (i) out += between;
            write_json(v[i], layout, out);
          }
          out += ']';
        } else if constexpr (std::is_same_v<T, std::string>) {
          out += json_string(v);
        } else if constexpr (std::is_same_v<T, double>) {
          char buf[40];
          std::snprintf(buf, sizeof buf, "%.17g", v);
          out += std::isfinite(v) ? buf : "null";
        } else if constexpr (std::is_same_v<T, bool>) {
          out += v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::nullptr_t>) {
          out += "null";
        } else {
          out += std::to_string(v);  // integers, exactly
        }
      },
      value.value());
}

}  // namespace

std::string json_text(const Json& value, JsonLayout layout) {
  std::string out;
  write_json(value, layout, out);
  return out;
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  for (std::size_t i = 0; i < text.size();) {
    auto [c, len] = decode_utf8(text, i);
    if (len == 0) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(text[i]));
      out += buf;
      ++i;
      continue;
    }
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n' || c == '\r' || c == '\t') {
      out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
    } else if (is_control(c)) {
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : "\\u{%04x}", static_cast<unsigned>(c));
      out += buf;
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::string printable_path(const fs::path& p) {
  return printable(std::string_view(p.native()));
}

std::size_t display_width(std::string_view text) {
  std::size_t n = 0;
  for (char ch : text) n += (static_cast<unsigned char>(ch) & 0xc0) != 0x80;
  return n;
}

std::string padded(std::string text, std::size_t width) {
  std::size_t w = display_width(text);
  if (w < width) text.append(width - w, ' ');
  return text;
}

bool shows_progress(bool json) {
  return !json && ::isatty(STDOUT_FILENO) == 1 && ::isatty(STDERR_FILENO) == 1;
}

std::string with_commas(std::uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace cli
