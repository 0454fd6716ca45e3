#include "wire/metadata.h"

#include <cstring>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

namespace kvxfer::wire {
namespace {

constexpr std::string_view kMagic = "KVXFMETA";
constexpr std::size_t kFixedLen = 8 + 8 + 8 + 4 + 4;  // after magic/version/header_len
constexpr std::size_t kPreambleLen = 8 + 2 + 2;

std::uint32_t fnv1a(std::span<const std::uint8_t> bytes) {
  std::uint32_t h = 2166136261u;
  for (const std::uint8_t b : bytes) {
    h ^= b;
    h *= 16777619u;
  }
  return h;
}

template <typename T>
void put_int(std::vector<std::uint8_t>& out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
  }
}

void put_bytes(std::vector<std::uint8_t>& out, const void* data, std::size_t len) {
  put_int<std::uint32_t>(out, static_cast<std::uint32_t>(len));
  // resize + memcpy rather than insert(): GCC 12 reports a false
  // -Wstringop-overflow for vector::insert of a possibly empty range.
  const std::size_t at = out.size();
  out.resize(at + len);
  if (len != 0) std::memcpy(out.data() + at, data, len);
}

// A bounds-checked cursor over peer bytes.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  template <typename T>
  T get_int(const char* what) {
    need(sizeof(T), what);
    T value = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      value |= static_cast<T>(static_cast<T>(bytes_[pos_ + i]) << (8 * i));
    }
    pos_ += sizeof(T);
    return value;
  }

  std::span<const std::uint8_t> get_bytes(const char* what, std::size_t max_len) {
    const auto len = get_int<std::uint32_t>(what);
    if (len > max_len) {
      throw std::invalid_argument(
          fmt::format("kvxfer metadata: {} is {} bytes, more than the limit {}", what, len, max_len));
    }
    need(len, what);
    auto out = bytes_.subspan(pos_, len);
    pos_ += len;
    return out;
  }

  std::string get_string(const char* what, std::size_t max_len) {
    const auto b = get_bytes(what, max_len);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }

  [[nodiscard]] std::size_t pos() const { return pos_; }
  [[nodiscard]] std::size_t remaining() const { return bytes_.size() - pos_; }

 private:
  void need(std::size_t n, const char* what) const {
    if (remaining() < n) {
      throw std::invalid_argument(fmt::format(
          "kvxfer metadata is truncated: {} needs {} bytes at offset {}, {} left", what, n, pos_,
          remaining()));
    }
  }

  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
};

}  // namespace

std::vector<std::uint8_t> encode(const AgentMetadata& m) {
  std::vector<std::uint8_t> out;
  out.reserve(kPreambleLen + kFixedLen + 5 * 4 + m.engine.size() + m.agent_name.size() +
              m.config_fingerprint.size() + m.boot_id.size() + m.engine_blob.size());
  out.resize(kMagic.size());
  std::memcpy(out.data(), kMagic.data(), kMagic.size());
  put_int<std::uint16_t>(out, kMetadataVersion);
  put_int<std::uint16_t>(out, static_cast<std::uint16_t>(kFixedLen));
  put_int<std::uint64_t>(out, m.base_addr);
  put_int<std::uint64_t>(out, m.num_blocks);
  put_int<std::uint64_t>(out, m.block_len);
  put_int<std::uint32_t>(out, m.pid);
  const std::size_t checksum_at = out.size();
  put_int<std::uint32_t>(out, 0);
  put_bytes(out, m.engine.data(), m.engine.size());
  put_bytes(out, m.agent_name.data(), m.agent_name.size());
  put_bytes(out, m.config_fingerprint.data(), m.config_fingerprint.size());
  put_bytes(out, m.boot_id.data(), m.boot_id.size());
  put_bytes(out, m.engine_blob.data(), m.engine_blob.size());
  const std::uint32_t sum =
      fnv1a(std::span<const std::uint8_t>(out).subspan(kPreambleLen + kFixedLen));
  for (std::size_t i = 0; i < 4; ++i) out[checksum_at + i] = static_cast<std::uint8_t>(sum >> (8 * i));
  return out;
}

AgentMetadata decode(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) throw std::invalid_argument("kvxfer metadata is empty");
  if (bytes.size() < kMagic.size() ||
      std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    throw std::invalid_argument("not kvxfer metadata (bad magic): metadata of another format?");
  }
  Reader r(bytes.subspan(kMagic.size()));
  const auto version = r.get_int<std::uint16_t>("version");
  if (version != kMetadataVersion) {
    throw std::invalid_argument(fmt::format(
        "kvxfer metadata version {} is not supported (this build reads version {})", version,
        kMetadataVersion));
  }
  const auto header_len = r.get_int<std::uint16_t>("header length");
  if (header_len != kFixedLen) {
    throw std::invalid_argument(
        fmt::format("kvxfer metadata header length {} is not {}", header_len, kFixedLen));
  }
  AgentMetadata m;
  m.base_addr = r.get_int<std::uint64_t>("base_addr");
  m.num_blocks = r.get_int<std::uint64_t>("num_blocks");
  m.block_len = r.get_int<std::uint64_t>("block_len");
  m.pid = r.get_int<std::uint32_t>("pid");
  const auto checksum = r.get_int<std::uint32_t>("checksum");
  const std::size_t body_at = kMagic.size() + r.pos();
  m.engine = r.get_string("engine", kMaxNameLen);
  m.agent_name = r.get_string("agent name", kMaxNameLen);
  m.config_fingerprint = r.get_string("config fingerprint", kMaxNameLen);
  m.boot_id = r.get_string("boot id", kMaxNameLen);
  const auto blob = r.get_bytes("engine blob", kMaxBlobLen);
  m.engine_blob.assign(blob.begin(), blob.end());
  if (r.remaining() != 0) {
    throw std::invalid_argument(
        fmt::format("kvxfer metadata has {} unexpected trailing bytes", r.remaining()));
  }
  if (fnv1a(bytes.subspan(body_at)) != checksum) {
    throw std::invalid_argument("kvxfer metadata is corrupt (checksum mismatch)");
  }
  return m;
}

}  // namespace kvxfer::wire
