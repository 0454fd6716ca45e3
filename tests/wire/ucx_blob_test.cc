// SPDX-License-Identifier: Apache-2.0
// The UCX engine's blob inside the agent metadata: its exact bytes, round
// trips (the tcp part's IPv4 and IPv6 addresses and the UCX lane's region
// keys included), and every malformed blob refused without reading outside
// it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "wire/peer_blob.h"

namespace kvxfer::internal::ucx {
namespace {

const std::vector<std::uint8_t> kAddress = {0xa1, 0xa2, 0xa3};
const std::vector<std::uint8_t> kRkey = {0xb1, 0xb2};

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

// Slot 2 of generation 1, and slot 5 of generation 2.
constexpr std::uint64_t kFirstKeyId = (std::uint64_t{1} << 32) | 2;
constexpr std::uint64_t kSecondKeyId = (std::uint64_t{2} << 32) | 5;

wire::PeerBlob golden_value() {
  wire::PeerBlob b;
  b.flags = wire::kBlobAcceptsCma | wire::kBlobHasRdma;
  b.pidns_dev = 0x0102030405060708ull;
  b.pidns_ino = 0x1112131415161718ull;
  b.cookie_addr = 0x2122232425262728ull;
  b.cookie_epoch = 0x3132333435363738ull;
  b.worker_address = kAddress;
  b.rkey = kRkey;
  b.notify_fd = 0x41424344;
  b.tcp_token = 0x5152535455565758ull;
  for (std::size_t i = 0; i < b.tcp_key.size(); ++i)
    b.tcp_key[i] = static_cast<std::uint8_t>(0x60 + i);
  b.tcp_port = 7000;
  b.tcp_addresses = {ipv4(10, 1, 2, 3), ipv6(0x01)};
  b.region_keys = {{kFirstKeyId, 0x8182838485868788ull, 0x1000, {0xc1, 0xc2, 0xc3}},
                   {kSecondKeyId, 0x9192939495969798ull, 0x20, {0xd1}}};
  return b;
}

// Written out by hand: peers built from other sources read and write these
// bytes, so a change of layout must fail here, not only round trip.
const std::vector<std::uint8_t> kGoldenBytes = {
    'K',  'V',  'X',  'U',  0x06, 0x00, 0x09, 0x00,  // magic, version 6, flags cma|rdma
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // pid namespace device
    0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // pid namespace inode
    0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,  // cookie address
    0x38, 0x37, 0x36, 0x35, 0x34, 0x33, 0x32, 0x31,  // cookie epoch
    0x03, 0x00, 0x00, 0x00, 0xa1, 0xa2, 0xa3,        // worker address
    0x02, 0x00, 0x00, 0x00, 0xb1, 0xb2,              // packed rkey
    0x44, 0x43, 0x42, 0x41,                          // notify fd
    0x58, 0x57, 0x56, 0x55, 0x54, 0x53, 0x52, 0x51,  // tcp token
    0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67,  // tcp key (32 bytes)
    0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f,  //
    0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77,  //
    0x78, 0x79, 0x7a, 0x7b, 0x7c, 0x7d, 0x7e, 0x7f,  //
    0x58, 0x1b,                                      // tcp port 7000
    0x02, 0x00,                                      // address count
    0x04,                                            // family 4
    0x0a, 0x01, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00,  // 10.1.2.3,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  //   the rest zero
    0x06,                                            // family 6
    0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,  // 2001:db8::1
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,  //
    0x02, 0x00, 0x00, 0x00,                          // region key count
    0x02, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,  // id: slot 2, generation 1
    0x88, 0x87, 0x86, 0x85, 0x84, 0x83, 0x82, 0x81,  // base
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // length
    0x03, 0x00, 0x00, 0x00, 0xc1, 0xc2, 0xc3,        // packed rkey
    0x05, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,  // id: slot 5, generation 2
    0x98, 0x97, 0x96, 0x95, 0x94, 0x93, 0x92, 0x91,  // base
    0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // length
    0x01, 0x00, 0x00, 0x00, 0xd1,                    // packed rkey
};
constexpr std::size_t kTcpKeyAt = 65;
constexpr std::size_t kTcpPortAt = 97;
constexpr std::size_t kAddressCountAt = 99;
constexpr std::size_t kFirstAddressAt = 101;
constexpr std::size_t kAddressLen = 17;
constexpr std::size_t kKeyCountAt = 135;
constexpr std::size_t kFirstKeyAt = 139;

// A version-2 blob as the previous encoder wrote it: no tcp part.
const std::vector<std::uint8_t> kVersion2Bytes = {
    'K',  'V',  'X',  'U',  0x02, 0x00, 0x03, 0x00,  // magic, version 2, flags
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // pid namespace device
    0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,  // pid namespace inode
    0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,  // cookie address
    0x38, 0x37, 0x36, 0x35, 0x34, 0x33, 0x32, 0x31,  // cookie epoch
    0x03, 0x00, 0x00, 0x00, 0xa1, 0xa2, 0xa3,        // worker address
    0x02, 0x00, 0x00, 0x00, 0xb1, 0xb2,              // packed rkey
    0x44, 0x43, 0x42, 0x41,                          // notify fd
};

std::vector<std::uint8_t> bytes_of(std::span<const std::uint8_t> s) { return {s.begin(), s.end()}; }

// True when `bytes` is refused and the output, filled beforehand, is left
// as it was.
bool refused(std::span<const std::uint8_t> bytes) {
  wire::PeerBlob out;
  out.flags = 0x7777;
  out.tcp_port = 0x6666;
  out.tcp_addresses = {ipv6(0x99)};
  const wire::RegionKey key{kFirstKeyId, 0x1000, 0x10, {0x99}};
  out.region_keys = {key};
  if (wire::decode_blob(bytes, &out)) return false;
  return out.flags == 0x7777 && out.tcp_port == 0x6666 &&
         out.tcp_addresses == std::vector<wire::TcpAddress>{ipv6(0x99)} &&
         out.region_keys == std::vector<wire::RegionKey>{key};
}

TEST(UcxBlob, EncodesToTheGoldenBytes) { EXPECT_EQ(wire::encode_blob(golden_value()), kGoldenBytes); }

TEST(UcxBlob, FlagsKeepTheirBits) {
  EXPECT_EQ(wire::kBlobAcceptsCma, 0x01);
  EXPECT_EQ(wire::kBlobHasRdma, 0x08);
}

TEST(UcxBlob, CarriesTheUnusedFlagBits) {
  // Bits 1 and 2 (set by blobs of the retired message protocols) decode,
  // and come back as they were.
  wire::PeerBlob in = golden_value();
  in.flags = 0x06 | wire::kBlobHasRdma;
  wire::PeerBlob out;
  ASSERT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
  EXPECT_EQ(out.flags, 0x06 | wire::kBlobHasRdma);
}

TEST(UcxBlob, DecodesTheGoldenBytesIntoViewsOfThem) {
  wire::PeerBlob b;
  ASSERT_TRUE(wire::decode_blob(kGoldenBytes, &b));
  EXPECT_EQ(b.flags, wire::kBlobAcceptsCma | wire::kBlobHasRdma);
  EXPECT_EQ(b.pidns_dev, 0x0102030405060708ull);
  EXPECT_EQ(b.pidns_ino, 0x1112131415161718ull);
  EXPECT_EQ(b.cookie_addr, 0x2122232425262728ull);
  EXPECT_EQ(b.cookie_epoch, 0x3132333435363738ull);
  EXPECT_EQ(bytes_of(b.worker_address), kAddress);
  EXPECT_EQ(bytes_of(b.rkey), kRkey);
  EXPECT_EQ(b.worker_address.data(), kGoldenBytes.data() + 44);
  EXPECT_EQ(b.rkey.data(), kGoldenBytes.data() + 51);
  EXPECT_EQ(b.notify_fd, 0x41424344u);
  EXPECT_EQ(b.tcp_token, 0x5152535455565758ull);
  EXPECT_EQ(b.tcp_key, golden_value().tcp_key);
  EXPECT_EQ(b.tcp_port, 7000);
  EXPECT_EQ(b.tcp_addresses, (std::vector<wire::TcpAddress>{ipv4(10, 1, 2, 3), ipv6(0x01)}));
  EXPECT_EQ(b.region_keys, golden_value().region_keys);
}

TEST(UcxBlob, RoundTripsEmptyFieldsWithoutATcpLane) {
  wire::PeerBlob in;
  in.flags = wire::kBlobAcceptsCma;
  in.tcp_token = 0x1234;  // a token with no lane is carried, not judged
  const auto bytes = wire::encode_blob(in);
  EXPECT_EQ(bytes.size(), 100u);  // 68 fixed bytes besides the 32-byte tcp key
  wire::PeerBlob out;
  ASSERT_TRUE(wire::decode_blob(bytes, &out));
  EXPECT_EQ(out.flags, in.flags);
  EXPECT_TRUE(out.worker_address.empty());
  EXPECT_TRUE(out.rkey.empty());
  EXPECT_EQ(out.notify_fd, wire::kNoNotifyFd);
  EXPECT_EQ(out.tcp_token, 0x1234u);
  EXPECT_EQ(out.tcp_port, 0);
  EXPECT_TRUE(out.tcp_addresses.empty());
  EXPECT_TRUE(out.region_keys.empty());
}

TEST(UcxBlob, RoundTripsTheMostRegionKeysWithTheLongestRkeys) {
  wire::PeerBlob in = golden_value();
  in.region_keys.clear();
  // kMaxRegionKeyBytes in all: as many of the longest rkeys as fit, then
  // short ones up to kMaxRegionKeys.
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < wire::kMaxRegionKeys; ++i) {
    const std::size_t left = wire::kMaxRegionKeys - i;
    const std::size_t len =
        std::min(wire::kMaxRegionRkey, wire::kMaxRegionKeyBytes - bytes - left + 1);
    bytes += len;
    in.region_keys.push_back({(std::uint64_t{7} << 32) | (i + 1), 4096 * (i + 1), 4096,
                              std::vector<std::uint8_t>(len, static_cast<std::uint8_t>(i))});
  }
  ASSERT_EQ(bytes, wire::kMaxRegionKeyBytes);
  wire::PeerBlob out;
  ASSERT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
  EXPECT_EQ(out.region_keys, in.region_keys);
}

TEST(UcxBlob, RoundTripsATcpPartOfIPv4AndIPv6Addresses) {
  wire::PeerBlob in = golden_value();
  in.tcp_token = std::numeric_limits<std::uint64_t>::max();
  in.tcp_port = 0xffff;
  in.tcp_addresses.clear();
  for (std::uint8_t i = 0; i < wire::kMaxTcpAddresses; ++i) {
    in.tcp_addresses.push_back(i % 2 == 0 ? ipv4(192, 168, i, 255) : ipv6(i));
  }
  // An IPv6 address may use all 16 bytes, the ones an IPv4 address must
  // leave zero included.
  in.tcp_addresses.back().bytes.fill(0xff);
  const auto bytes = wire::encode_blob(in);
  EXPECT_EQ(bytes.size(), kGoldenBytes.size() + (wire::kMaxTcpAddresses - 2) * kAddressLen);
  wire::PeerBlob out;
  ASSERT_TRUE(wire::decode_blob(bytes, &out));
  EXPECT_EQ(out.tcp_token, in.tcp_token);
  EXPECT_EQ(out.tcp_port, in.tcp_port);
  EXPECT_EQ(out.tcp_addresses, in.tcp_addresses);
  EXPECT_EQ(wire::encode_blob(out), bytes);
}

TEST(UcxBlob, RoundTripsAPortWithoutAddresses) {
  wire::PeerBlob in = golden_value();
  in.tcp_addresses.clear();
  wire::PeerBlob out;
  ASSERT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
  EXPECT_EQ(out.tcp_port, 7000);
  EXPECT_TRUE(out.tcp_addresses.empty());
}

TEST(UcxBlob, RefusesEveryTruncationAndLeavesTheOutputAlone) {
  for (std::size_t len = 0; len < kGoldenBytes.size(); ++len) {
    EXPECT_TRUE(refused(std::span(kGoldenBytes.data(), len))) << len;
  }
}

TEST(UcxBlob, RefusesTrailingBytes) {
  auto bytes = kGoldenBytes;
  bytes.push_back(0);
  EXPECT_TRUE(refused(bytes));
  // A whole address more than the count says is trailing bytes too.
  bytes = kGoldenBytes;
  bytes[kAddressCountAt] = 1;
  EXPECT_TRUE(refused(bytes));
  // And a whole region key more than its count says.
  bytes = kGoldenBytes;
  bytes[kKeyCountAt] = 1;
  EXPECT_TRUE(refused(bytes));
}

TEST(UcxBlob, RefusesWrongMagic) {
  for (const std::size_t at : {0u, 1u, 2u, 3u}) {
    auto bytes = kGoldenBytes;
    bytes[at] ^= 0x01;
    EXPECT_TRUE(refused(bytes)) << "accepted a flipped byte " << at;
  }
}

TEST(UcxBlob, RefusesEveryOtherVersion) {
  for (const std::uint16_t version : {0, 1, 2, 3, 4, 5, 7, 0x0106, 0xffff}) {
    auto bytes = kGoldenBytes;
    wire::store_le(bytes.data() + 4, version);
    EXPECT_TRUE(refused(bytes)) << "version " << version;
  }
}

TEST(UcxBlob, RefusesAVersion2BlobAsItsEncoderWroteIt) {
  // Its peer has no tcp part to offer: refused, not read as a blob with
  // none.
  EXPECT_TRUE(refused(kVersion2Bytes));
  auto as_v3 = kVersion2Bytes;
  as_v3[4] = 0x03;
  EXPECT_TRUE(refused(as_v3));
}

TEST(UcxBlob, RefusesAVersion3BlobAsItsEncoderWroteIt) {
  // Version 3 had no tcp key: its peer cannot prove who it is to ours.
  std::vector<std::uint8_t> v3 = kGoldenBytes;
  v3.erase(v3.begin() + kTcpKeyAt, v3.begin() + kTcpPortAt);
  v3[4] = 0x03;
  EXPECT_TRUE(refused(v3));
  v3[4] = 0x04;
  EXPECT_TRUE(refused(v3));
}

TEST(UcxBlob, RefusesAVersion4BlobThoughItsLayoutIsTheSame) {
  // Version 4's tcp lane spoke frames of version 2 (replayable hellos,
  // unauthenticated frames): a peer of it could never connect to ours, so
  // it is refused when its metadata is read, saying so, not at connect.
  auto v4 = std::vector<std::uint8_t>(kGoldenBytes.begin(), kGoldenBytes.begin() + kKeyCountAt);
  v4[4] = 0x04;
  EXPECT_TRUE(refused(v4));
}

TEST(UcxBlob, RefusesAVersion5BlobAsItsEncoderWroteIt) {
  // Version 5 had no region keys: its UCX lane carried the pool only.
  auto v5 = std::vector<std::uint8_t>(kGoldenBytes.begin(), kGoldenBytes.begin() + kKeyCountAt);
  v5[4] = 0x05;
  EXPECT_TRUE(refused(v5));
  v5[4] = 0x06;  // nor is it a version-6 blob without its count
  EXPECT_TRUE(refused(v5));
}

TEST(UcxBlob, RefusesMoreThanKMaxRegionKeysWhetherOrNotTheyFollow) {
  auto bytes = kGoldenBytes;
  wire::store_le<std::uint32_t>(bytes.data() + kKeyCountAt, wire::kMaxRegionKeys + 1);
  EXPECT_TRUE(refused(bytes));
  wire::store_le<std::uint32_t>(bytes.data() + kKeyCountAt, 0xffffffff);
  EXPECT_TRUE(refused(bytes));
  wire::PeerBlob in = golden_value();
  in.region_keys.clear();
  for (std::size_t i = 0; i <= wire::kMaxRegionKeys; ++i) {
    in.region_keys.push_back({(std::uint64_t{1} << 32) | (i + 1), 64 * (i + 1), 64, {0x01}});
  }
  EXPECT_TRUE(refused(wire::encode_blob(in)));
  in.region_keys.pop_back();
  wire::PeerBlob out;
  EXPECT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
}

TEST(UcxBlob, RefusesRegionKeysOutOfIdOrderOrTwice) {
  wire::PeerBlob in = golden_value();
  std::swap(in.region_keys[0], in.region_keys[1]);
  EXPECT_TRUE(refused(wire::encode_blob(in)));
  in = golden_value();
  in.region_keys[1].id = in.region_keys[0].id;
  EXPECT_TRUE(refused(wire::encode_blob(in)));
}

TEST(UcxBlob, RefusesARegionKeyOfThePoolsSlot) {
  // Slot 0 (any generation) is the pool, whose key is the blob's rkey.
  for (const std::uint64_t id : {std::uint64_t{0}, std::uint64_t{1} << 32}) {
    wire::PeerBlob in = golden_value();
    in.region_keys[0].id = id;
    EXPECT_TRUE(refused(wire::encode_blob(in))) << id;
  }
}

TEST(UcxBlob, RefusesAnEmptyOrWrappingRegion) {
  auto bytes = kGoldenBytes;
  wire::store_le<std::uint64_t>(bytes.data() + kFirstKeyAt + 16, 0);  // length 0
  EXPECT_TRUE(refused(bytes));
  wire::PeerBlob in = golden_value();
  // Its end (one past its last byte) is the highest address, as
  // register_memory allows; one byte further wraps.
  in.region_keys[1].base = ~std::uint64_t{0} - 0x20;
  wire::PeerBlob out;
  EXPECT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
  in.region_keys[1].base += 1;
  EXPECT_TRUE(refused(wire::encode_blob(in)));
}

TEST(UcxBlob, RefusesAnEmptyRkeyOrOneLongerThanTheLimit) {
  wire::PeerBlob in = golden_value();
  in.region_keys[0].rkey.clear();
  EXPECT_TRUE(refused(wire::encode_blob(in)));
  in.region_keys[0].rkey.assign(wire::kMaxRegionRkey + 1, 0x5a);
  EXPECT_TRUE(refused(wire::encode_blob(in)));
  in.region_keys[0].rkey.pop_back();
  wire::PeerBlob out;
  EXPECT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
  // A length past the limit is refused before its bytes are looked for.
  auto bytes = kGoldenBytes;
  wire::store_le<std::uint32_t>(bytes.data() + kFirstKeyAt + 24, 0xffffffff);
  EXPECT_TRUE(refused(bytes));
}

TEST(UcxBlob, RefusesRkeysOfMoreThanKMaxRegionKeyBytesInAll) {
  wire::PeerBlob in = golden_value();
  in.region_keys.clear();
  const std::size_t n = wire::kMaxRegionKeyBytes / wire::kMaxRegionRkey;
  for (std::size_t i = 0; i < n; ++i) {
    in.region_keys.push_back({(std::uint64_t{1} << 32) | (i + 1), 4096 * (i + 1), 4096,
                              std::vector<std::uint8_t>(wire::kMaxRegionRkey, 0x11)});
  }
  wire::PeerBlob out;
  ASSERT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
  in.region_keys.push_back({(std::uint64_t{1} << 32) | (n + 1), 4096 * (n + 1), 4096, {0x22}});
  EXPECT_TRUE(refused(wire::encode_blob(in)));
}

TEST(UcxBlob, RefusesAnAddressFamilyOtherThan4Or6) {
  // 2 and 10 are Linux's AF_INET and AF_INET6: the wire says 4 and 6.
  for (const std::uint8_t family : {0, 2, 5, 10, 0xff}) {
    for (const std::size_t address : {0u, 1u}) {
      auto bytes = kGoldenBytes;
      bytes[kFirstAddressAt + address * kAddressLen] = family;
      EXPECT_TRUE(refused(bytes)) << "family " << int{family} << " address " << address;
    }
  }
}

TEST(UcxBlob, RefusesAnIPv4AddressWithANonzeroBytePastItsFour) {
  for (std::size_t at = 4; at < 16; ++at) {
    auto bytes = kGoldenBytes;
    bytes[kFirstAddressAt + 1 + at] = 0x01;
    EXPECT_TRUE(refused(bytes)) << "byte " << at;
  }
  // The same bytes as an IPv6 address are one.
  auto bytes = kGoldenBytes;
  bytes[kFirstAddressAt] = 6;
  bytes[kFirstAddressAt + 1 + 15] = 0x01;
  wire::PeerBlob out;
  ASSERT_TRUE(wire::decode_blob(bytes, &out));
  EXPECT_EQ(out.tcp_addresses[0].family, 6);
}

TEST(UcxBlob, RefusesMoreThanKMaxTcpAddresses) {
  wire::PeerBlob in = golden_value();
  in.tcp_addresses.assign(wire::kMaxTcpAddresses + 1, ipv4(10, 0, 0, 1));
  EXPECT_TRUE(refused(wire::encode_blob(in)));
  in.tcp_addresses.pop_back();
  wire::PeerBlob out;
  EXPECT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
}

TEST(UcxBlob, RefusesACountOfMoreAddressesThanFollow) {
  for (const std::uint16_t count : {3, 16, 17, 0xffff}) {
    auto bytes = kGoldenBytes;
    wire::store_le(bytes.data() + kAddressCountAt, count);
    EXPECT_TRUE(refused(bytes)) << count;
  }
}

TEST(UcxBlob, RefusesAddressesWithoutAPort) {
  auto bytes = kGoldenBytes;
  wire::store_le<std::uint16_t>(bytes.data() + kTcpPortAt, 0);
  EXPECT_TRUE(refused(bytes));
  // Port 0 and no addresses: the agent has no tcp lane.
  wire::PeerBlob in = golden_value();
  in.tcp_port = 0;
  in.tcp_addresses.clear();
  wire::PeerBlob out;
  EXPECT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
}

TEST(UcxBlob, RefusesAFieldLongerThanTheLimit) {
  // A worker address of wire::kMaxBlobField + 1 bytes, all present.
  std::vector<std::uint8_t> address(wire::kMaxBlobField + 1, 0x5a);
  wire::PeerBlob in = golden_value();
  in.worker_address = address;
  EXPECT_TRUE(refused(wire::encode_blob(in)));
  address.pop_back();
  in.worker_address = address;
  wire::PeerBlob out;
  EXPECT_TRUE(wire::decode_blob(wire::encode_blob(in), &out));
}

}  // namespace
}  // namespace kvxfer::internal::ucx
