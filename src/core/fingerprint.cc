// SPDX-License-Identifier: Apache-2.0
// config_fingerprint: byte-identical to the reference's
//   hashlib.sha256(json.dumps(fields, sort_keys=True,
//                  separators=(",", ":")).encode()).hexdigest()[:16]
// for a string -> string map, which we write as that JSON ourselves.
// json.dumps escapes non-ASCII as \uXXXX (ensure_ascii), so we do too;
// nlohmann::json would emit raw UTF-8. Fields of any JSON value come as the
// canonical text itself (config_fingerprint_json): writing Python's float
// repr in C++ is not worth it when the caller already has json.dumps.
#include <openssl/evp.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kvxfer/transport.h"

namespace kvxfer {
namespace {

// Appends s as a JSON string literal the way Python's json.dumps does.
void append_json_string(std::string& out, const std::string& s) {
  out.push_back('"');
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      default: break;
    }
    if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\u{:04x}", c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // Decode one UTF-8 sequence to a code point.
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (extra < 0 || i + static_cast<std::size_t>(extra) >= s.size()) {
      throw std::invalid_argument("config_fields: invalid UTF-8");
    }
    std::uint32_t cp = c & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      if ((cc & 0xC0) != 0x80) throw std::invalid_argument("config_fields: invalid UTF-8");
      cp = (cp << 6) | (cc & 0x3F);
    }
    i += static_cast<std::size_t>(extra) + 1;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", cp);
    }
  }
  out.push_back('"');
}

std::string sha256_prefix(std::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(text.data(), text.size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("config_fingerprint: SHA-256 failed");
  }
  std::string hex;
  for (unsigned int k = 0; k < 8; ++k) hex += fmt::format("{:02x}", digest[k]);
  return hex;
}

}  // namespace

std::string config_fingerprint_json(std::string_view canonical_json) {
  if (canonical_json.empty() || canonical_json == "{}") return {};
  // Cheap shape checks only: json.dumps with ensure_ascii writes printable
  // ASCII (every other character is escaped), and fields are an object.
  if (canonical_json.size() < 2 || canonical_json.front() != '{' ||
      canonical_json.back() != '}') {
    throw std::invalid_argument(
        "config_json must be a JSON object as json.dumps(fields, sort_keys=True, "
        "separators=(\",\", \":\")) writes it: {...}");
  }
  for (std::size_t i = 0; i < canonical_json.size(); ++i) {
    const auto c = static_cast<unsigned char>(canonical_json[i]);
    if (c < 0x20 || c > 0x7E) {
      throw std::invalid_argument(fmt::format(
          "config_json byte {} is {:#04x}: canonical JSON (ensure_ascii) is printable ASCII "
          "only",
          i, c));
    }
  }
  return sha256_prefix(canonical_json);
}

std::string config_fingerprint(const std::map<std::string, std::string>& fields) {
  if (fields.empty()) return {};
  // std::map iterates in byte order of the keys, which is Python's sort
  // order for str keys as long as both are compared by code point: UTF-8
  // byte order and code point order agree.
  std::string json = "{";
  bool first = true;
  for (const auto& [key, value] : fields) {
    if (!first) json.push_back(',');
    first = false;
    append_json_string(json, key);
    json.push_back(':');
    append_json_string(json, value);
  }
  json.push_back('}');
  return sha256_prefix(json);
}

}  // namespace kvxfer
