// The JSON documents the `safetensors` tool prints (`--json`): a small value type, so that every
// command builds its output as data rather than by pasting text, and the tool needs no JSON
// library to build. `json_text` (cli_output.cpp) writes one, escaping strings by the same rule
// as `printable`.
#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace cli {

class Json {
 public:
  using Array = std::vector<Json>;
  /// Keys in insertion order, as the tool has always printed them.
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() = default;  // null
  Json(std::nullptr_t) {}
  Json(bool b) : value_(b) {}
  template <std::integral T>
  requires(!std::same_as<T, bool>) Json(T n) {
    if constexpr (std::is_signed_v<T>) {
      value_ = static_cast<std::int64_t>(n);
    } else {
      value_ = static_cast<std::uint64_t>(n);
    }
  }
  Json(double x) : value_(x) {}
  Json(std::string s) : value_(std::move(s)) {}
  Json(const char* s) : value_(std::string(s)) {}
  Json(std::string_view s) : value_(std::string(s)) {}
  template <class T>
  Json(const std::vector<T>& items) : value_(Array(items.begin(), items.end())) {}
  Json(const std::map<std::string, std::string>& entries) : value_(Object(entries.begin(), entries.end())) {}

  /// `{"k": v, ...}` in the order given.
  static Json object(Object entries = {}) {
    Json j;
    j.value_ = std::move(entries);
    return j;
  }
  static Json array(Array items = {}) {
    Json j;
    j.value_ = std::move(items);
    return j;
  }

  /// The member `key` of an object (appended, null, when absent).
  Json& operator[](std::string_view key) {
    auto& entries = std::get<Object>(value_);
    for (auto& [k, v] : entries) {
      if (k == key) return v;
    }
    return entries.emplace_back(std::string(key), Json()).second;
  }
  void push_back(Json item) { std::get<Array>(value_).push_back(std::move(item)); }

  using Value =
      std::variant<std::nullptr_t, bool, std::int64_t, std::uint64_t, double, std::string, Array, Object>;
  [[nodiscard]] const Value& value() const { return value_; }

 private:
  Value value_ = nullptr;
};

}  // namespace cli
