// SPDX-License-Identifier: Apache-2.0
#include "wire/metadata.h"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>
#include <string_view>

#include "wire/bytes.h"

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

std::invalid_argument truncated(const ByteReader& in, std::size_t needed, const char* what) {
  return std::invalid_argument(
      fmt::format("kvxfer metadata is truncated: {} needs {} bytes at offset {}, {} left", what,
                  needed, in.position(), in.remaining()));
}

// decode() reads through these: they turn the reader's soft failures into
// the one exception it promises, saying which field was cut off and where.
template <WireInt T>
T get_int(ByteReader& in, const char* what) {
  if (const auto value = in.get<T>()) return *value;
  throw truncated(in, sizeof(T), what);
}

std::span<const std::uint8_t> get_bytes(ByteReader& in, const char* what, std::size_t max_len) {
  const auto len = get_int<std::uint32_t>(in, what);
  if (len > max_len) {
    throw std::invalid_argument(
        fmt::format("kvxfer metadata: {} is {} bytes, more than the limit {}", what, len, max_len));
  }
  if (const auto bytes = in.take(len)) return *bytes;
  throw truncated(in, len, what);
}

std::string get_string(ByteReader& in, const char* what, std::size_t max_len) {
  const auto b = get_bytes(in, what, max_len);
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// The region list: at most kMaxRegions, each non-empty, inside the address
// space, with a non-zero id, in increasing address order without overlap.
void get_regions(ByteReader& in, std::vector<AgentMetadata::Region>& out) {
  const auto count = get_int<std::uint32_t>(in, "region count");
  if (count > kMaxRegions) {
    throw std::invalid_argument(
        fmt::format("kvxfer metadata lists {} regions, more than the limit {}", count, kMaxRegions));
  }
  if (in.remaining() < std::size_t{count} * 24) throw truncated(in, std::size_t{count} * 24, "regions");
  out.resize(count);
  std::uint64_t end = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    AgentMetadata::Region& r = out[i];
    r.id = get_int<std::uint64_t>(in, "region id");
    r.addr = get_int<std::uint64_t>(in, "region address");
    r.len = get_int<std::uint64_t>(in, "region length");
    if (r.id == 0 || r.len == 0 || r.addr > ~std::uint64_t{0} - r.len || (i > 0 && r.addr < end)) {
      throw std::invalid_argument(fmt::format(
          "kvxfer metadata: region {} (id {:#x}, {:#x}, {} bytes) is {}", i, r.id, r.addr, r.len,
          r.id == 0                                 ? "id 0, which is the pool's"
          : r.len == 0                              ? "empty"
          : r.addr > ~std::uint64_t{0} - r.len      ? "past the end of the address space"
                                                    : "not after the one before it"));
    }
    end = r.addr + r.len;
  }
}

}  // namespace

std::vector<std::uint8_t> encode(const AgentMetadata& m) {
  std::vector<std::uint8_t> out;
  out.reserve(kPreambleLen + kFixedLen + 5 * 4 + m.engine.size() + m.agent_name.size() +
              m.config_fingerprint.size() + m.boot_id.size() + m.engine_blob.size() + 4 +
              24 * m.regions.size());
  ByteWriter w(out);
  w.raw(byte_view(kMagic));
  w.u16(kMetadataVersion);
  w.u16(static_cast<std::uint16_t>(kFixedLen));
  w.u64(m.base_addr);
  w.u64(m.num_blocks);
  w.u64(m.block_len);
  w.u32(m.pid);
  const std::size_t checksum_at = w.written();
  w.u32(0);  // the checksum, once the body it covers is written
  w.prefixed(byte_view(m.engine));
  w.prefixed(byte_view(m.agent_name));
  w.prefixed(byte_view(m.config_fingerprint));
  w.prefixed(byte_view(m.boot_id));
  w.prefixed(m.engine_blob);
  w.u32(static_cast<std::uint32_t>(m.regions.size()));
  for (const AgentMetadata::Region& r : m.regions) {
    w.u64(r.id);
    w.u64(r.addr);
    w.u64(r.len);
  }
  store_le(out.data() + checksum_at,
           fnv1a(std::span<const std::uint8_t>(out).subspan(kPreambleLen + kFixedLen)));
  return out;
}

AgentMetadata decode(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) throw std::invalid_argument("kvxfer metadata is empty");
  if (bytes.size() < kMagic.size() ||
      std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    throw std::invalid_argument("not kvxfer metadata (bad magic): metadata of another format?");
  }
  ByteReader in(bytes.subspan(kMagic.size()));
  const auto version = get_int<std::uint16_t>(in, "version");
  if (version != kMetadataVersion) {
    throw std::invalid_argument(
        fmt::format("kvxfer metadata version {} is not supported (this build reads version {})",
                    version, kMetadataVersion));
  }
  const auto header_len = get_int<std::uint16_t>(in, "header length");
  if (header_len != kFixedLen) {
    throw std::invalid_argument(
        fmt::format("kvxfer metadata header length {} is not {}", header_len, kFixedLen));
  }
  AgentMetadata m;
  m.base_addr = get_int<std::uint64_t>(in, "base_addr");
  m.num_blocks = get_int<std::uint64_t>(in, "num_blocks");
  m.block_len = get_int<std::uint64_t>(in, "block_len");
  m.pid = get_int<std::uint32_t>(in, "pid");
  const auto checksum = get_int<std::uint32_t>(in, "checksum");
  const std::size_t body_at = kMagic.size() + in.position();
  m.engine = get_string(in, "engine", kMaxNameLen);
  m.agent_name = get_string(in, "agent name", kMaxNameLen);
  m.config_fingerprint = get_string(in, "config fingerprint", kMaxNameLen);
  m.boot_id = get_string(in, "boot id", kMaxNameLen);
  const auto blob = get_bytes(in, "engine blob", kMaxBlobLen);
  m.engine_blob.assign(blob.begin(), blob.end());
  get_regions(in, m.regions);
  if (!in.at_end()) {
    throw std::invalid_argument(
        fmt::format("kvxfer metadata has {} unexpected trailing bytes", in.remaining()));
  }
  if (fnv1a(bytes.subspan(body_at)) != checksum) {
    throw std::invalid_argument("kvxfer metadata is corrupt (checksum mismatch)");
  }
  return m;
}

}  // namespace kvxfer::wire
