// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpora of the fuzz targets (fuzz_target.h):
// corpus/<target>/valid/* from the real encoders, corpus/<target>/invalid/*
// from valid seeds broken one way each (truncated, one byte too many, bad
// magic, another version, a length that lies, a reserved field set...).
// Deterministic: running it again writes the same bytes.
//   kvxfer_make_seeds <corpus dir>
#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wire/bytes.h"
#include "wire/cookie.h"
#include "wire/fence.h"
#include "wire/loopback_blob.h"
#include "wire/metadata.h"
#include "wire/notify.h"
#include "wire/runs.h"
#include "wire/tcp_frame.h"
#include "wire/peer_blob.h"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;
using namespace kvxfer;

fs::path g_root;

void write_seed(const std::string& target, bool valid, const std::string& name, const Bytes& b) {
  const fs::path dir = g_root / target / (valid ? "valid" : "invalid");
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

Bytes text(std::string_view s) { return Bytes(s.begin(), s.end()); }

Bytes pattern(std::size_t n, std::uint8_t seed) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(seed + i * 31);
  return b;
}

Bytes cut(Bytes b, std::size_t drop) {
  b.resize(b.size() - drop);
  return b;
}

Bytes plus_byte(Bytes b) {
  b.push_back(0);
  return b;
}

Bytes set_u16(Bytes b, std::size_t at, std::uint16_t v) {
  wire::store_le(b.data() + at, v);
  return b;
}

Bytes set_u32(Bytes b, std::size_t at, std::uint32_t v) {
  wire::store_le(b.data() + at, v);
  return b;
}

Bytes set_u64(Bytes b, std::size_t at, std::uint64_t v) {
  wire::store_le(b.data() + at, v);
  return b;
}

Bytes flip(Bytes b, std::size_t at) {
  b[at] ^= 0x01;
  return b;
}

// ---------------------------------------------------------------- blobs

wire::TcpAddress ipv4(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  wire::TcpAddress t;
  t.family = 4;
  t.bytes = {a, b, c, d};
  return t;
}

// 2001:db8::<last> (the documentation prefix).
wire::TcpAddress ipv6(std::uint8_t last) {
  wire::TcpAddress t;
  t.family = 6;
  t.bytes = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last};
  return t;
}

// `n` region keys: slots 1.., generation 3, 64 KiB apart, rkeys of
// `rkey_len` bytes.
std::vector<wire::RegionKey> region_keys(std::size_t n, std::size_t rkey_len = 24) {
  std::vector<wire::RegionKey> keys;
  for (std::size_t i = 0; i < n; ++i) {
    keys.push_back({(std::uint64_t{3} << 32) | (i + 1), 0x7f0000000000 + (i << 16), 0x8000,
                    pattern(rkey_len, static_cast<std::uint8_t>(i))});
  }
  return keys;
}

// A blob whose tcp lane listens on port 7000 at `addresses`; without
// addresses, one with no tcp lane (port 0).
Bytes ucx_blob(std::size_t address_len, std::size_t rkey_len, std::uint16_t flags,
               std::vector<wire::TcpAddress> addresses = {},
               std::vector<wire::RegionKey> keys = {}) {
  static Bytes address;
  static Bytes rkey;
  address = pattern(address_len, 7);
  rkey = pattern(rkey_len, 99);
  wire::PeerBlob b;
  b.flags = flags;
  b.pidns_dev = 4;
  b.pidns_ino = 4026531836;
  b.cookie_addr = 0x7f0012345678;
  b.cookie_epoch = 0x1234567890abcdef;
  b.worker_address = address;
  b.rkey = rkey;
  b.tcp_token = 0x0fedcba987654321;
  for (std::size_t i = 0; i < b.tcp_key.size(); ++i)
    b.tcp_key[i] = static_cast<std::uint8_t>(3 * i + 1);
  b.tcp_port = addresses.empty() ? 0 : 7000;
  b.tcp_addresses = std::move(addresses);
  b.region_keys = std::move(keys);
  return wire::encode_blob(b);
}

void ucx_blob_seeds() {
  const std::string t = "ucx_blob";
  const std::vector<wire::TcpAddress> both = {ipv4(10, 1, 2, 3), ipv6(1)};
  const Bytes valid = ucx_blob(72, 16, wire::kBlobAcceptsCma, both);
  const Bytes no_tcp = ucx_blob(72, 16, wire::kBlobAcceptsCma);
  write_seed(t, true, "valid", valid);
  write_seed(t, true, "valid_no_tcp_lane", no_tcp);
  write_seed(t, true, "valid_empty_fields", ucx_blob(0, 0, 0));
  write_seed(t, true, "valid_4k_address", ucx_blob(4096, 75, wire::kBlobAcceptsCma, both));
  write_seed(t, true, "valid_max_field", ucx_blob(wire::kMaxBlobField, 1, 0));
  write_seed(t, true, "valid_rdma", ucx_blob(72, 16, wire::kBlobAcceptsCma | wire::kBlobHasRdma, both));
  // Bits 1 and 2, which blobs of the retired message protocols set: unused,
  // and still accepted.
  write_seed(t, true, "valid_unused_flag_bits", ucx_blob(72, 16, 0x06 | wire::kBlobHasRdma, both));
  std::vector<wire::TcpAddress> most;
  for (std::uint8_t i = 0; i < wire::kMaxTcpAddresses; ++i) {
    most.push_back(i % 2 == 0 ? ipv4(192, 168, i, 1) : ipv6(i));
  }
  write_seed(t, true, "valid_max_tcp_addresses", ucx_blob(72, 16, 0, most));
  // The UCX lane's region keys: a few, beside a pool or alone (no pool
  // rkey), and the longest rkeys.
  const Bytes keyed = ucx_blob(72, 16, wire::kBlobHasRdma, both, region_keys(3));
  write_seed(t, true, "valid_region_keys", keyed);
  write_seed(t, true, "valid_region_keys_no_pool", ucx_blob(72, 0, 0, {}, region_keys(64)));
  write_seed(t, true, "valid_region_key_max_rkey",
             ucx_blob(72, 16, 0, {}, region_keys(2, wire::kMaxRegionRkey)));
  constexpr std::size_t kAddressLenAt = 4 + 2 + 2 + 4 * 8;
  // With a 72-byte worker address and a 16-byte rkey (`valid`).
  constexpr std::size_t kTcpTokenAt = kAddressLenAt + 4 + 72 + 4 + 16 + 4;
  constexpr std::size_t kTcpKeyAt = kTcpTokenAt + 8;
  constexpr std::size_t kTcpPortAt = kTcpKeyAt + 32;
  constexpr std::size_t kAddressCountAt = kTcpPortAt + 2;
  constexpr std::size_t kFirstAddressAt = kAddressCountAt + 2;  // 10.1.2.3
  constexpr std::size_t kKeyCountAt = kFirstAddressAt + 2 * 17;
  constexpr std::size_t kFirstKeyAt = kKeyCountAt + 4;
  constexpr std::size_t kKeyLen = 8 + 8 + 8 + 4 + 24;
  write_seed(t, false, "empty", {});
  write_seed(t, false, "truncated_header", Bytes(valid.begin(), valid.begin() + 20));
  write_seed(t, false, "truncated_tcp_part", cut(no_tcp, 5));
  write_seed(t, false, "truncated_address", cut(valid, 5));
  write_seed(t, false, "truncated_key_count", cut(valid, 1));
  write_seed(t, false, "truncated_region_key", cut(keyed, 1));
  write_seed(t, false, "trailing_byte", plus_byte(valid));
  write_seed(t, false, "bad_magic", flip(valid, 0));
  write_seed(t, false, "bad_version", set_u16(valid, 4, wire::kBlobVersion + 1));
  // Version 2 (no tcp part), as its encoder wrote it, and its number on a
  // version-3 blob.
  write_seed(t, false, "version_2", set_u16(cut(no_tcp, 48), 4, 2));
  write_seed(t, false, "version_2_number", set_u16(valid, 4, 2));
  // Version 3 (no tcp key), as its encoder wrote it, and its number on a
  // version-4 blob.
  Bytes v3 = valid;
  v3.erase(v3.begin() + kTcpKeyAt, v3.begin() + kTcpPortAt);
  write_seed(t, false, "version_3", set_u16(v3, 4, 3));
  write_seed(t, false, "version_3_number", set_u16(valid, 4, 3));
  write_seed(t, false, "version_3_layout_as_4", v3);
  // Version 4: this layout, but a tcp lane of frames version 2.
  write_seed(t, false, "version_4_number", set_u16(valid, 4, 4));
  // Version 5: no region keys (its UCX lane carried the pool only), as its
  // encoder wrote it, and its number on a version-6 blob.
  write_seed(t, false, "version_5", set_u16(cut(valid, 4), 4, 5));
  write_seed(t, false, "version_5_number", set_u16(keyed, 4, 5));
  write_seed(t, false, "key_count_says_more", set_u32(keyed, kKeyCountAt, 4));
  write_seed(t, false, "key_count_says_fewer", set_u32(keyed, kKeyCountAt, 2));
  write_seed(t, false, "key_count_over_limit",
             set_u32(keyed, kKeyCountAt, static_cast<std::uint32_t>(wire::kMaxRegionKeys + 1)));
  write_seed(t, false, "huge_key_count", set_u32(keyed, kKeyCountAt, 0xffffffff));
  std::vector<wire::RegionKey> swapped = region_keys(3);
  std::swap(swapped[0], swapped[2]);
  write_seed(t, false, "region_keys_out_of_order", ucx_blob(72, 16, 0, both, swapped));
  std::vector<wire::RegionKey> twice = region_keys(3);
  twice[1].id = twice[0].id;
  write_seed(t, false, "region_key_twice", ucx_blob(72, 16, 0, both, twice));
  write_seed(t, false, "region_key_of_pool_slot", set_u32(keyed, kFirstKeyAt, 0));
  write_seed(t, false, "region_key_empty", set_u64(keyed, kFirstKeyAt + 16, 0));
  write_seed(t, false, "region_key_wraps",
             set_u64(keyed, kFirstKeyAt + kKeyLen + 8, ~std::uint64_t{0} - 0x100));
  std::vector<wire::RegionKey> no_rkey = region_keys(2);
  no_rkey[1].rkey.clear();
  write_seed(t, false, "region_key_empty_rkey", ucx_blob(72, 16, 0, both, no_rkey));
  write_seed(t, false, "region_key_rkey_over_limit",
             ucx_blob(72, 16, 0, {}, region_keys(1, wire::kMaxRegionRkey + 1)));
  write_seed(t, false, "region_key_huge_rkey_len", set_u32(keyed, kFirstKeyAt + 24, 0xffffffff));
  write_seed(t, false, "region_keys_over_byte_limit",
             ucx_blob(0, 0, 0, {},
                      region_keys(wire::kMaxRegionKeyBytes / wire::kMaxRegionRkey + 1,
                                  wire::kMaxRegionRkey)));
  write_seed(t, false, "address_len_off_by_one", set_u32(valid, kAddressLenAt, 73));
  write_seed(t, false, "huge_address_len", set_u32(valid, kAddressLenAt, 0xffffffff));
  write_seed(t, false, "over_limit_address_len", set_u32(valid, kAddressLenAt, wire::kMaxBlobField + 1));
  write_seed(t, false, "huge_rkey_len", set_u32(valid, kAddressLenAt + 4 + 72, 0xffffffff));
  Bytes family = valid;
  family[kFirstAddressAt] = 5;
  write_seed(t, false, "family_5", family);
  family[kFirstAddressAt] = 10;  // Linux's AF_INET6, not the wire's 6
  write_seed(t, false, "family_af_inet6", family);
  Bytes tail = valid;
  tail[kFirstAddressAt + 1 + 4] = 1;
  write_seed(t, false, "ipv4_nonzero_tail", tail);
  tail = valid;
  tail[kFirstAddressAt + 16] = 0xff;
  write_seed(t, false, "ipv4_nonzero_last_byte", tail);
  most.push_back(ipv4(192, 168, 99, 1));
  write_seed(t, false, "too_many_addresses", ucx_blob(72, 16, 0, most));
  write_seed(t, false, "address_count_says_more", set_u16(valid, kAddressCountAt, 3));
  write_seed(t, false, "address_count_says_fewer", set_u16(valid, kAddressCountAt, 1));
  write_seed(t, false, "huge_address_count", set_u16(valid, kAddressCountAt, 0xffff));
  write_seed(t, false, "addresses_without_port", set_u16(valid, kTcpPortAt, 0));
  write_seed(t, false, "loopback_blob", wire::encode_loopback_blob({1, 2}));
}

void loopback_blob_seeds() {
  const std::string t = "loopback_blob";
  const Bytes valid = wire::encode_loopback_blob({0x0102030405060708, 0x1122334455667788});
  write_seed(t, true, "valid", valid);
  write_seed(t, true, "valid_zero", wire::encode_loopback_blob({0, 0}));
  write_seed(t, false, "empty", {});
  write_seed(t, false, "magic_only", Bytes(valid.begin(), valid.begin() + 4));
  write_seed(t, false, "truncated", cut(valid, 1));
  write_seed(t, false, "trailing_byte", plus_byte(valid));
  Bytes two = valid;
  two.insert(two.end(), valid.begin(), valid.end());
  write_seed(t, false, "two_blobs", two);
  write_seed(t, false, "bad_magic", flip(valid, 3));
  write_seed(t, false, "ucx_magic", set_u32(valid, 0, wire::kBlobMagic));
}

// ---------------------------------------------------------------- metadata

wire::AgentMetadata agent(const std::string& engine, Bytes blob) {
  wire::AgentMetadata m;
  m.engine = engine;
  m.agent_name = "agent-0";
  m.config_fingerprint = "addf234ab11ac58f";
  m.boot_id = "0f0e0d0c-0b0a-0908-0706-050403020100";
  m.base_addr = 0x7f0000100000;
  m.num_blocks = 16;
  m.block_len = 4096;
  m.pid = 4242;
  m.engine_blob = std::move(blob);
  return m;
}

// Metadata with regions besides (or instead of) the pool: the list as
// register_memory leaves it, and each way a list can be wrong.
void region_seeds(const std::string& t) {
  using R = wire::AgentMetadata::Region;
  const auto with = [](std::vector<R> regions, bool pool = true) {
    wire::AgentMetadata m = agent("UCX", ucx_blob(72, 16, wire::kBlobAcceptsCma));
    if (!pool) {
      m.base_addr = 0;
      m.num_blocks = 0;
      m.block_len = 0;
    }
    m.regions = std::move(regions);
    return wire::encode(m);
  };
  const std::uint64_t base = 0x7f1000000000;
  const std::uint64_t gen1 = std::uint64_t{1} << 32;
  write_seed(t, true, "valid_regions", with({{gen1 | 1, base, 4096}, {gen1 | 2, base + 8192, 65536}}));
  write_seed(t, true, "valid_regions_no_pool",
             with({{gen1 | 1, base, 4096}, {(gen1 << 1) | 7, base + 4096, 1}}, false));
  write_seed(t, false, "region_id_zero", with({{0, base, 4096}}));
  write_seed(t, false, "region_empty", with({{gen1 | 1, base, 0}}));
  write_seed(t, false, "region_wraps", with({{gen1 | 1, ~std::uint64_t{0} - 10, 64}}));
  write_seed(t, false, "regions_overlap",
             with({{gen1 | 1, base, 4096}, {gen1 | 2, base + 4095, 16}}));
  write_seed(t, false, "regions_unsorted",
             with({{gen1 | 1, base + 8192, 4096}, {gen1 | 2, base, 16}}));
  Bytes count_says_more = with({{gen1 | 1, base, 4096}});
  // The region count is the u32 before the last region's 24 bytes.
  wire::store_le<std::uint32_t>(count_says_more.data() + count_says_more.size() - 28, 2);
  write_seed(t, false, "region_count_says_more", count_says_more);
  Bytes huge_count = with({});
  wire::store_le<std::uint32_t>(huge_count.data() + huge_count.size() - 4, 0xffffffff);
  write_seed(t, false, "region_count_huge", huge_count);
}

void metadata_seeds() {
  const std::string t = "metadata";
  const Bytes valid = wire::encode(agent("UCX", ucx_blob(72, 16, wire::kBlobAcceptsCma)));
  write_seed(t, true, "valid_ucx", valid);
  write_seed(t, true, "valid_loopback",
             wire::encode(agent("LOOPBACK", wire::encode_loopback_blob({1, 2}))));
  write_seed(t, true, "valid_empty_fields", wire::encode(wire::AgentMetadata{}));
  write_seed(t, true, "valid_big_blob", wire::encode(agent("UCX", pattern(2048, 3))));
  constexpr std::size_t kVersionAt = 8;
  constexpr std::size_t kHeaderLenAt = 10;
  constexpr std::size_t kEngineLenAt = 12 + 32;
  write_seed(t, false, "empty", {});
  write_seed(t, false, "magic_only", text("KVXFMETA"));
  write_seed(t, false, "truncated", Bytes(valid.begin(), valid.begin() + 30));
  write_seed(t, false, "truncated_blob", cut(valid, 1));
  write_seed(t, false, "trailing_byte", plus_byte(valid));
  write_seed(t, false, "bad_magic", flip(valid, 0));
  write_seed(t, false, "bad_version", set_u16(valid, kVersionAt, wire::kMetadataVersion + 1));
  write_seed(t, false, "bad_header_len", set_u16(valid, kHeaderLenAt, 41));
  write_seed(t, false, "huge_len", set_u32(valid, kEngineLenAt, 0xffffffff));
  write_seed(t, false, "bad_checksum", flip(valid, valid.size() - 1));
  wire::AgentMetadata long_name = agent("UCX", {});
  long_name.agent_name.assign(wire::kMaxNameLen + 1, 'a');
  write_seed(t, false, "over_limit_name", wire::encode(long_name));
  region_seeds(t);
}

void handshake_seeds() {
  const std::string t = "handshake";
  const Bytes meta = wire::encode(agent("UCX", ucx_blob(72, 16, wire::kBlobAcceptsCma)));
  std::string hex;
  for (const std::uint8_t b : meta) hex += fmt::format("{:02x}", b);
  const auto ready = [&](const std::string& metadata_hex, const std::string& rest) {
    return text(fmt::format("READY metadata={} {}", metadata_hex, rest));
  };
  const std::string geometry = "base=139637976727552 num_blocks=16 block_len=4096";
  write_seed(t, true, "ready", ready(hex, geometry + " fingerprint=addf234ab11ac58f"));
  write_seed(t, true, "ready_no_fingerprint", ready(hex, geometry + " fingerprint="));
  write_seed(t, false, "empty", {});
  write_seed(t, false, "refused", text("REFUSED block length 4096 differs from ours (65536)"));
  write_seed(t, false, "ready_bad_hex", ready("4b56zz", geometry + " fingerprint="));
  write_seed(t, false, "ready_odd_hex", ready(hex.substr(1), geometry + " fingerprint="));
  write_seed(t, false, "ready_missing", ready(hex, "base=1 fingerprint="));
  write_seed(t, false, "ready_huge_number",
             ready(hex, "base=99999999999999999999999 num_blocks=16 block_len=4096 fingerprint="));
  std::string corrupt = hex;
  corrupt.back() = corrupt.back() == '0' ? '1' : '0';
  write_seed(t, false, "ready_corrupt_metadata", ready(corrupt, geometry + " fingerprint="));
  write_seed(t, false, "hostport_v4", text("127.0.0.1:7000"));
  write_seed(t, false, "hostport_v6", text("[::1]:7000"));
}

// ---------------------------------------------------------------- fence

Bytes fence(const wire::Fence& f) {
  Bytes b(wire::fence_len(f.name.size()));
  wire::encode_fence(b.data(), f);
  return b;
}

void fence_seeds() {
  const std::string t = "fence";
  const Bytes valid =
      fence(wire::Fence{0x1234567890abcdef, 0x0102030405060708, 1, 0xa1a2a3a4a5a6a7a8, "initiator"});
  constexpr std::size_t kVersionAt = 4;
  constexpr std::size_t kNameLenAt = 6;
  write_seed(t, true, "valid", valid);
  write_seed(t, true, "valid_gen_2",
             fence(wire::Fence{0x1234567890abcdef, 0x0102030405060708, 2, 9, "initiator"}));
  write_seed(t, true, "valid_zero_token", fence(wire::Fence{0, 1, 1, 1, "initiator"}));
  write_seed(t, true, "valid_one_char_name", fence(wire::Fence{1, 1, 1, 1, "a"}));
  const std::string longest(wire::kMaxFenceName, 'n');
  write_seed(t, true, "valid_max_fields", fence(wire::Fence{~0ull, ~0ull, ~0ull, ~0ull, longest}));
  write_seed(t, false, "empty", {});
  write_seed(t, false, "fixed_only", Bytes(valid.begin(), valid.begin() + wire::kFenceFixedLen));
  write_seed(t, false, "truncated_fixed", Bytes(valid.begin(), valid.begin() + wire::kFenceFixedLen - 1));
  write_seed(t, false, "truncated_name", cut(valid, 1));
  write_seed(t, false, "trailing_byte", plus_byte(valid));
  write_seed(t, false, "bad_magic", flip(valid, 0));
  write_seed(t, false, "bad_version", set_u16(valid, kVersionAt, wire::kFenceVersion + 1));
  // Version 1 (no name: a zero where its length is), as its encoder wrote
  // it, and its number on a version-2 fence.
  write_seed(t, false, "version_1",
             set_u16(set_u16(Bytes(valid.begin(), valid.begin() + wire::kFenceFixedLen), kVersionAt, 1),
                     kNameLenAt, 0));
  write_seed(t, false, "version_1_number", set_u16(valid, kVersionAt, 1));
  write_seed(t, false, "zero_name_length",
             set_u16(Bytes(valid.begin(), valid.begin() + wire::kFenceFixedLen), kNameLenAt, 0));
  write_seed(t, false, "name_too_long",
             fence(wire::Fence{1, 1, 1, 1, std::string(wire::kMaxFenceName + 1, 'n')}));
  write_seed(t, false, "name_length_says_more", set_u16(valid, kNameLenAt, 10));
  write_seed(t, false, "name_length_says_fewer", set_u16(valid, kNameLenAt, 8));
  write_seed(t, false, "zero_lineage", fence(wire::Fence{1, 0, 1, 1, "initiator"}));
  write_seed(t, false, "zero_gen", fence(wire::Fence{1, 1, 0, 1, "initiator"}));
  write_seed(t, false, "zero_epoch", fence(wire::Fence{1, 1, 1, 0, "initiator"}));
  write_seed(t, false, "notify_magic", set_u32(valid, 0, wire::kNotifyMagic));
}

// ---------------------------------------------------------------- notify

Bytes notify_header(const wire::NotifyHeader& h) {
  Bytes b(wire::notify_header_len(h.name.size()));
  wire::encode_notify_header(b.data(), h);
  return b;
}

Bytes ack(const wire::NotifyAck& a) {
  Bytes b(wire::kAckLen);
  wire::encode_ack(b.data(), a);
  return b;
}

void notify_seeds() {
  const std::string t = "notify";
  const Bytes valid = notify_header(wire::NotifyHeader{0x1234, 0x99, 7, 0x55, 0x66, "initiator"});
  write_seed(t, true, "valid", valid);
  write_seed(t, true, "valid_one_char_name", notify_header(wire::NotifyHeader{1, 2, 3, 4, 5, "a"}));
  const std::string longest(wire::kMaxNotifyName, 'n');
  write_seed(t, true, "valid_longest_name", notify_header(wire::NotifyHeader{1, 2, 3, 4, 5, longest}));
  write_seed(t, false, "empty", {});
  write_seed(t, false, "fixed_only", cut(valid, 9));
  write_seed(t, false, "truncated_name", cut(valid, 1));
  write_seed(t, false, "trailing_byte", plus_byte(valid));
  write_seed(t, false, "bad_magic", flip(valid, 0));
  write_seed(t, false, "bad_version", set_u16(valid, 4, wire::kNotifyVersion + 1));
  write_seed(t, false, "zero_name_length", set_u16(cut(valid, 9), 6, 0));
  write_seed(t, false, "name_too_long",
             notify_header(wire::NotifyHeader{1, 2, 3, 4, 5, std::string(wire::kMaxNotifyName + 1, 'n')}));
  write_seed(t, false, "reserved_set", set_u32(valid, 28, 1));
  write_seed(t, false, "a_fence", fence(wire::Fence{1, 1, 1, 1, "initiator"}));
  write_seed(t, false, "an_ack", ack(wire::NotifyAck{3, 7, 0}));
}

void ack_seeds() {
  const std::string t = "ack";
  const Bytes valid = ack(wire::NotifyAck{3, 7, 0});
  write_seed(t, true, "ack", valid);
  write_seed(t, true, "ack_error", ack(wire::NotifyAck{3, 7, -25}));
  write_seed(t, true, "ack_max_fields", ack(wire::NotifyAck{0xffffffff, ~0ull, -1}));
  write_seed(t, false, "empty", {});
  write_seed(t, false, "truncated", cut(valid, 1));
  write_seed(t, false, "trailing_byte", plus_byte(valid));
  write_seed(t, false, "bad_magic", flip(valid, 0));
  write_seed(t, false, "notify_magic", set_u32(valid, 0, wire::kNotifyMagic));
  write_seed(t, false, "fence_magic", set_u32(valid, 0, wire::kFenceMagic));
  write_seed(t, false, "reserved_set", set_u32(valid, 20, 1));
  write_seed(t, false, "a_notification", notify_header(wire::NotifyHeader{1, 2, 3, 4, 5, "a"}));
  write_seed(t, false, "a_fence", fence(wire::Fence{1, 1, 1, 1, "a"}));
}

// ---------------------------------------------------------------- cookie

Bytes cookie(const wire::CookieDeclaration& d) {
  Bytes b(wire::kCookieLen);
  wire::encode_cookie(b.data(), d);
  return b;
}

void cookie_seeds() {
  const std::string t = "cookie";
  const Bytes valid = cookie({0x1234567890abcdef, 0x7f0000100000, 16, 4096});
  write_seed(t, true, "valid", valid);
  write_seed(t, true, "valid_one_byte_pool", cookie({1, 0, 1, 1}));
  write_seed(t, true, "valid_pool_ends_at_top", cookie({~0ull, ~0ull - 8192, 2, 4096}));
  write_seed(t, true, "valid_huge_blocks", cookie({7, 0, 1, ~0ull}));
  write_seed(t, true, "valid_pool_fd", cookie({7, 0x7f0000100000, 16, 4096, 5, 4100}));
  write_seed(t, true, "valid_pool_fd_max",
             cookie({7, 0x7f0000100000, 16, 4096, wire::kMaxFd, ~0ull}));
  write_seed(t, false, "pool_fd_past_int",
             cookie({7, 0x7f0000100000, 16, 4096, wire::kMaxFd + 1, 0}));
  write_seed(t, false, "offset_without_fd",
             cookie({7, 0x7f0000100000, 16, 4096, wire::kNoFd, 4096}));
  write_seed(t, true, "valid_cookie_fd", cookie({7, 0x7f0000100000, 16, 4096, 5, 0, 6}));
  write_seed(t, false, "cookie_fd_past_int", set_u32(valid, 44, wire::kMaxFd + 1));
  write_seed(t, true, "valid_no_pool", cookie({7, 0, 0, 0}));
  write_seed(t, true, "valid_region_table",
             cookie({7, 0x7f0000100000, 16, 4096, wire::kNoFd, 0, wire::kNoFd, 0x7f0000200000,
                     wire::kCookieMaxSlots}));
  write_seed(t, false, "no_pool_with_fd", cookie({7, 0, 0, 0, 5, 0}));
  write_seed(t, false, "table_too_long",
             cookie({7, 0x7f0000100000, 16, 4096, wire::kNoFd, 0, wire::kNoFd, 0x7f0000200000,
                     wire::kCookieMaxSlots + 1}));
  write_seed(
      t, false, "table_misaligned",
      cookie({7, 0x7f0000100000, 16, 4096, wire::kNoFd, 0, wire::kNoFd, 0x7f0000200004, 16}));
  write_seed(t, false, "table_wraps",
             cookie({7, 0x7f0000100000, 16, 4096, wire::kNoFd, 0, wire::kNoFd, ~0ull - 7, 16}));
  write_seed(t, false, "table_without_slots", set_u64(valid, 56, 0x7f0000200000));
  write_seed(t, true, "valid_fence_fd", set_u32(valid, 68, 9));
  write_seed(t, false, "fence_fd_past_int", set_u32(valid, 68, wire::kMaxFd + 1));
  write_seed(t, false, "version_3", set_u16(valid, 12, 3));
  write_seed(t, false, "version_1", set_u16(valid, 12, 1));
  write_seed(t, false, "version_2", set_u16(valid, 12, 2));
  constexpr std::size_t kMagicAt = 8;
  constexpr std::size_t kVersionAt = 12;
  constexpr std::size_t kReservedAt = 14;
  write_seed(t, false, "empty", {});
  write_seed(t, false, "epoch_only", Bytes(valid.begin(), valid.begin() + 8));
  write_seed(t, false, "truncated", cut(valid, 1));
  write_seed(t, false, "trailing_byte", plus_byte(valid));
  Bytes page = valid;
  page.resize(4096, 0);
  write_seed(t, false, "whole_page", page);
  write_seed(t, false, "bad_magic", flip(valid, kMagicAt));
  write_seed(t, false, "fence_magic", set_u32(valid, kMagicAt, wire::kFenceMagic));
  write_seed(t, false, "bad_version", set_u16(valid, kVersionAt, wire::kCookieVersion + 1));
  write_seed(t, false, "version_0", set_u16(valid, kVersionAt, 0));
  write_seed(t, false, "reserved_set", set_u16(valid, kReservedAt, 1));
  write_seed(t, false, "zero_epoch", set_u64(valid, 0, 0));
  write_seed(t, false, "retired_page", Bytes(wire::kCookieLen, 0));
  write_seed(t, false, "zero_num_blocks", cookie({1, 0x7f0000100000, 0, 4096}));
  write_seed(t, false, "zero_block_len", cookie({1, 0x7f0000100000, 16, 0}));
  write_seed(t, false, "size_overflows", cookie({1, 0, (1ull << 52) + 1, 1ull << 12}));
  write_seed(t, false, "end_overflows", cookie({1, ~0ull - 4095, 2, 4096}));
  // What the page held before it was a wire format: four native words.
  Bytes native(32);
  for (std::size_t i = 0; i < 4; ++i) {
    const std::uint64_t word[4] = {0x1234567890abcdef, 0x7f0000100000, 16, 4096};
    wire::store_le(native.data() + 8 * i, word[i]);
  }
  write_seed(t, false, "native_layout", native);
  write_seed(t, false, "a_fence", fence(wire::Fence{1, 1, 1, 1, "initiator"}));
}

// ---------------------------------------------------------------- tcp frames


// A run in the pool unless it names a region.
struct Run {
  std::uint64_t offset;
  std::uint64_t length;
  std::uint64_t region = 0;
};

std::vector<Run> runs_of(std::size_t count, std::uint64_t length) {
  std::vector<Run> runs;
  for (std::size_t i = 0; i < count; ++i) runs.push_back({i * 2 * length, length});
  return runs;
}

// The pool tcp_frame_fuzz.cc checks runs against (its kPool), and its one
// region besides (kRegionId, kRegion).
constexpr std::uint64_t kTcpPool = 1 << 20;
constexpr std::uint64_t kTcpRegionId = (std::uint64_t{1} << 32) | 1;
constexpr std::uint64_t kTcpRegion = 1 << 16;

wire::FrameHeader frame_header(wire::FrameType type, std::uint32_t count, std::uint64_t length,
                         std::uint16_t flags = 0, std::uint32_t status = 0) {
  wire::FrameHeader h;
  h.type = type;
  h.flags = flags;
  h.count = count;
  h.status = status;
  h.seq = 42;
  h.length = length;
  return h;
}

Bytes frame(const wire::FrameHeader& h, const Bytes& body = {}) {
  Bytes b(wire::kHeaderLen);
  wire::encode_header(b.data(), h);
  b.insert(b.end(), body.begin(), body.end());
  return b;
}

Bytes hello_frame(const std::string& name, std::uint64_t lineage = 0x0102030405060708,
                  std::uint64_t gen = 1, std::uint64_t epoch = 0xa1a2a3a4a5a6a7a8,
                  std::uint16_t flags = 0) {
  Bytes body(wire::kHelloFixedLen + name.size() + wire::kHelloProofLen);
  wire::Hello hello{0x1234567890abcdef, lineage, gen, epoch, name};
  for (std::size_t i = 0; i < hello.key.size(); ++i)
    hello.key[i] = static_cast<std::uint8_t>(i + 9);
  for (std::size_t i = 0; i < hello.nonce.size(); ++i)
    hello.nonce[i] = static_cast<std::uint8_t>(0x70 + i);
  wire::encode_hello_body(body.data(), hello);
  // A proof the wire format cannot judge (the lane checks it): any bytes.
  for (std::size_t i = 0; i < wire::kHelloProofLen; ++i) {
    body[body.size() - wire::kHelloProofLen + i] = static_cast<std::uint8_t>(0xc0 + i);
  }
  wire::FrameHeader h =
      frame_header(wire::FrameType::kHello, static_cast<std::uint32_t>(name.size()), 0, flags);
  h.seq = 0;
  return frame(h, body);
}

Bytes challenge_frame() {
  std::array<std::uint8_t, wire::kNonceLen> nonce{};
  for (std::size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<std::uint8_t>(0x30 + i);
  Bytes b(wire::kHeaderLen + wire::kNonceLen);
  wire::encode_challenge(b.data(), nonce);
  return b;
}

// `b` with a tag in its header (any bytes: a decoder cannot judge a tag).
Bytes with_tag(Bytes b) {
  for (std::size_t i = 0; i < wire::kTagLen; ++i) {
    b[wire::kFieldsLen + i] = static_cast<std::uint8_t>(0xd0 + i);
  }
  return b;
}

Bytes runs_body(const std::vector<Run>& runs) {
  Bytes b(runs.size() * wire::kRunLen);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    wire::put_run_at(b.data() + i * wire::kRunLen, runs[i].region, runs[i].offset,
                     runs[i].length);
  }
  return b;
}

std::uint64_t total_of(const std::vector<Run>& runs) {
  std::uint64_t total = 0;
  for (const Run& r : runs) total += r.length;
  return total;
}

// A write (or read request) of `runs`; its length is their total unless
// `length` says otherwise.
Bytes runs_frame(wire::FrameType type, const std::vector<Run>& runs, std::uint16_t flags = 0,
                 std::optional<std::uint64_t> length = std::nullopt) {
  return frame(frame_header(type, static_cast<std::uint32_t>(runs.size()),
                            length.value_or(total_of(runs)), flags),
               runs_body(runs));
}

Bytes write_frame(const std::vector<Run>& runs, std::uint16_t flags = 0) {
  return runs_frame(wire::FrameType::kWrite, runs, flags);
}

Bytes notify_frame(const Bytes& message, std::uint16_t flags = 0) {
  return frame(frame_header(wire::FrameType::kNotify, 0, message.size(), flags), message);
}

void tcp_frame_seeds() {
  const std::string t = "tcp_frame";
  using wire::FrameType;
  const std::vector<Run> three = {{0, 16}, {4096, 32}, {kTcpPool - 16, 16}};
  write_seed(t, true, "challenge", challenge_frame());
  write_seed(t, true, "hello", hello_frame("agent-0"));
  write_seed(t, true, "hello_encrypt",
             hello_frame("agent-0", 0x0102030405060708, 1, 0xa1a2a3a4a5a6a7a8, wire::kEncrypt));
  write_seed(t, false, "hello_encrypt_and_more",
             hello_frame("agent-0", 0x0102030405060708, 1, 0xa1a2a3a4a5a6a7a8,
                         wire::kEncrypt | wire::kMore));
  write_seed(t, true, "hello_longest_name", hello_frame(std::string(wire::kMaxName, 'n')));
  write_seed(t, true, "welcome", frame(frame_header(wire::FrameType::kWelcome, 0, 0)));
  write_seed(t, true, "welcome_refused_stale",
             frame(frame_header(wire::FrameType::kWelcome, 0, 0, 0, wire::kStatusStaleFence)));
  write_seed(t, true, "write_1run", write_frame({{4096, 4096}}));
  Bytes with_payload = write_frame(three);
  const Bytes payload = pattern(total_of(three), 5);
  with_payload.insert(with_payload.end(), payload.begin(), payload.end());
  write_seed(t, true, "write_3runs_and_payload", with_payload);
  write_seed(t, true, "write_more", write_frame(three, wire::kMore));
  Bytes then_notify = write_frame(three, wire::kNotifyFollows);
  const Bytes note = notify_frame(text("done:42"));
  then_notify.insert(then_notify.end(), note.begin(), note.end());
  write_seed(t, true, "write_notify_follows", then_notify);
  write_seed(t, true, "write_whole_pool", write_frame({{0, kTcpPool}}));
  write_seed(t, true, "write_max_runs", write_frame(runs_of(wire::kMaxRuns, 16)));
  write_seed(t, true, "notify", note);
  write_seed(t, true, "notify_longest", notify_frame(pattern(wire::kMaxMessage, 1)));
  write_seed(t, true, "read_req", runs_frame(wire::FrameType::kReadReq, {{0, 4096}, {8192, 4096}}));
  write_seed(t, true, "read_req_more", runs_frame(wire::FrameType::kReadReq, three, wire::kMore));
  // Runs in a region besides the pool, alone and beside pool runs.
  write_seed(t, true, "write_region", write_frame({{0, kTcpRegion, kTcpRegionId}}));
  write_seed(t, true, "write_pool_and_region",
             write_frame({{0, 16}, {kTcpRegion - 16, 16, kTcpRegionId}, {64, 16}}));
  write_seed(t, true, "read_req_region",
             runs_frame(wire::FrameType::kReadReq, {{4096, 4096, kTcpRegionId}}));
  write_seed(t, true, "ack", frame(frame_header(wire::FrameType::kAck, 0, 0)));
  write_seed(t, true, "ack_tagged", with_tag(frame(frame_header(wire::FrameType::kAck, 0, 0))));
  write_seed(t, true, "write_tagged", with_tag(write_frame(three)));
  write_seed(t, true, "ack_refused",
             frame(frame_header(wire::FrameType::kAck, 0, 0, 0, wire::kStatusRefused)));
  write_seed(t, true, "ack_queue_full",
             frame(frame_header(wire::FrameType::kAck, 0, 0, 0, wire::kStatusQueueFull)));
  write_seed(t, true, "read_data", frame(frame_header(wire::FrameType::kReadData, 0, 8192)));
  write_seed(t, true, "read_data_refused",
             frame(frame_header(wire::FrameType::kReadData, 0, 0, 0, wire::kStatusRefused)));

  const Bytes valid = write_frame(three);
  constexpr std::size_t kTypeAt = 5;
  constexpr std::size_t kFlagsAt = 6;
  constexpr std::size_t kCountAt = 8;
  constexpr std::size_t kStatusAt = 12;
  constexpr std::size_t kLengthAt = 24;
  write_seed(t, false, "empty", {});
  write_seed(t, false, "truncated_header", Bytes(valid.begin(), valid.begin() + 47));
  write_seed(t, false, "fields_without_tag", Bytes(valid.begin(), valid.begin() + 32));
  write_seed(t, false, "bad_magic", flip(valid, 0));
  Bytes version = valid;
  version[4] = wire::kFrameVersion + 1;
  write_seed(t, false, "bad_version", version);
  Bytes type = valid;
  type[kTypeAt] = 0;
  write_seed(t, false, "type_0", type);
  type[kTypeAt] = 9;
  write_seed(t, false, "type_9", type);
  const Bytes good_challenge = challenge_frame();
  write_seed(t, false, "challenge_tagged", with_tag(good_challenge));
  write_seed(t, false, "challenge_with_seq", set_u64(good_challenge, 16, 1));
  write_seed(t, false, "challenge_with_length", set_u64(good_challenge, kLengthAt, 1));
  write_seed(t, false, "challenge_truncated", cut(good_challenge, 1));
  const Bytes good_hello = hello_frame("agent-0");
  write_seed(t, false, "hello_no_name", set_u32(good_hello, kCountAt, 0));
  write_seed(t, false, "hello_name_too_long", hello_frame(std::string(wire::kMaxName + 1, 'n')));
  write_seed(t, false, "hello_with_length", set_u64(good_hello, kLengthAt, 1));
  write_seed(t, false, "hello_with_flags", set_u16(good_hello, kFlagsAt, wire::kMore));
  write_seed(t, false, "hello_zero_lineage", hello_frame("agent-0", 0));
  write_seed(t, false, "hello_zero_gen", hello_frame("agent-0", 1, 0));
  write_seed(t, false, "hello_zero_epoch", hello_frame("agent-0", 1, 1, 0));
  write_seed(t, false, "hello_truncated_name", cut(good_hello, 1));
  write_seed(t, false, "hello_tagged", with_tag(good_hello));
  write_seed(t, false, "hello_with_seq", set_u64(good_hello, 16, 1));
  // Version 1 frames (hellos without key and MAC): refused from the header.
  Bytes v1 = good_hello;
  v1[4] = 1;
  write_seed(t, false, "frame_version_1", v1);
  // Version 2 frames (32-byte headers without a tag, hellos without nonce
  // and proof, replayable): refused from the header.
  Bytes v2 = good_hello;
  v2[4] = 2;
  write_seed(t, false, "frame_version_2", v2);
  // Version 3 frames (runs without a region): refused from the header.
  Bytes v3 = valid;
  v3[4] = 3;
  write_seed(t, false, "frame_version_3", v3);
  write_seed(t, false, "hello_without_proof", cut(good_hello, wire::kHelloProofLen));
  write_seed(t, false, "welcome_with_count", frame(frame_header(wire::FrameType::kWelcome, 1, 0)));
  write_seed(t, false, "write_zero_runs", set_u32(valid, kCountAt, 0));
  write_seed(t, false, "write_too_many_runs", write_frame(runs_of(wire::kMaxRuns + 1, 16)));
  write_seed(t, false, "write_zero_length", set_u64(valid, kLengthAt, 0));
  write_seed(t, false, "write_more_and_notify_follows",
             write_frame(three, wire::kMore | wire::kNotifyFollows));
  write_seed(t, false, "write_unknown_flag", write_frame(three, 1u << 2));
  write_seed(t, false, "write_with_status", set_u32(valid, kStatusAt, 1));
  write_seed(t, false, "write_truncated_runs", cut(valid, 1));
  write_seed(t, false, "write_count_says_more", set_u32(valid, kCountAt, 4));
  write_seed(t, false, "write_run_past_pool", write_frame({{kTcpPool, 16}}));
  write_seed(t, false, "write_run_over_pool_end", write_frame({{0, 16}, {kTcpPool - 8, 16}}));
  write_seed(t, false, "write_zero_length_run", write_frame({{0, 16}, {4096, 0}}));
  // Regions the receiver does not have: another slot, its region's slot of
  // another generation; and runs past its region's end.
  write_seed(t, false, "write_unknown_region", write_frame({{0, 16, (1ull << 32) | 2}}));
  write_seed(t, false, "write_region_other_generation", write_frame({{0, 16, (2ull << 32) | 1}}));
  write_seed(t, false, "write_run_past_region",
             write_frame({{0, 16}, {kTcpRegion - 8, 16, kTcpRegionId}}));
  write_seed(t, false, "read_req_run_past_region",
             runs_frame(wire::FrameType::kReadReq, {{kTcpRegion, 16, kTcpRegionId}}));
  write_seed(t, false, "write_length_short",
             runs_frame(wire::FrameType::kWrite, three, 0, total_of(three) - 1));
  write_seed(t, false, "write_length_long",
             runs_frame(wire::FrameType::kWrite, three, 0, total_of(three) + 1));
  write_seed(t, false, "write_end_overflows", write_frame({{~0ull - 100, 4096}}));
  // Two runs whose lengths wrap to the header's length in 64 bits.
  write_seed(t, false, "write_sum_overflows",
             runs_frame(wire::FrameType::kWrite, {{0, 1ull << 63}, {0, (1ull << 63) + 16}}, 0, 16));
  write_seed(t, false, "read_req_notify_follows",
             runs_frame(wire::FrameType::kReadReq, three, wire::kNotifyFollows));
  write_seed(t, false, "read_req_run_past_pool",
             runs_frame(wire::FrameType::kReadReq, {{kTcpPool - 16, 32}}));
  write_seed(t, false, "notify_empty", frame(frame_header(wire::FrameType::kNotify, 0, 0)));
  write_seed(t, false, "notify_too_long", notify_frame(pattern(wire::kMaxMessage + 1, 1)));
  write_seed(t, false, "notify_truncated", cut(note, 1));
  write_seed(t, false, "notify_with_flags", notify_frame(text("done:42"), wire::kMore));
  write_seed(t, false, "ack_with_length", frame(frame_header(wire::FrameType::kAck, 0, 16)));
  write_seed(t, false, "ack_with_count", frame(frame_header(wire::FrameType::kAck, 1, 0)));
  write_seed(t, false, "read_data_refusal_with_bytes",
             frame(frame_header(wire::FrameType::kReadData, 0, 8192, 0, wire::kStatusRefused)));
  write_seed(t, false, "a_ucx_blob", ucx_blob(72, 16, 0, {ipv4(10, 1, 2, 3)}));
  write_seed(t, false, "a_fence", fence(wire::Fence{1, 1, 1, 1, "initiator"}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  ucx_blob_seeds();
  loopback_blob_seeds();
  metadata_seeds();
  handshake_seeds();
  fence_seeds();
  notify_seeds();
  ack_seeds();
  cookie_seeds();
  tcp_frame_seeds();
  std::printf("seeds written under %s\n", g_root.c_str());
  return 0;
}
