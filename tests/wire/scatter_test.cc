// SPDX-License-Identifier: Apache-2.0
// The scatter-write wire format of the UCX lane: headers and acks round trip,
// and hostile bytes (truncated, extended, wrong magic or version, bad run
// counts, runs outside the region or not matching the payload) are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "wire/scatter.h"

namespace kvxfer::internal::ucx {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

std::vector<std::uint8_t> header_bytes(const std::vector<ScatterRun>& runs,
                                       std::uint64_t token = 0x1122334455667788ull,
                                       std::uint64_t sequence = 42, std::uint32_t slot = 7,
                                       std::uint64_t lineage = 0x0badc0ffee0ddf00ull,
                                       std::uint64_t epoch = 0x5eed5eed5eed5eedull) {
  std::vector<std::uint8_t> out(scatter_header_len(runs.size()));
  put_scatter_fixed(out.data(), static_cast<std::uint16_t>(runs.size()), token, sequence, slot,
                    lineage, epoch);
  for (std::size_t i = 0; i < runs.size(); ++i)
    put_scatter_run(out.data(), i, runs[i].offset, runs[i].length);
  return out;
}

bool decodes(const std::vector<std::uint8_t>& bytes) {
  ScatterHeader h;
  return decode_scatter_header(bytes, &h);
}

// Encodes `runs` into a header, decodes it and asks whether the runs fit.
bool fits(const std::vector<ScatterRun>& runs, std::uint64_t region_len,
          std::uint64_t payload_len) {
  const auto bytes = header_bytes(runs);
  ScatterHeader h;
  EXPECT_TRUE(decode_scatter_header(bytes, &h));
  return scatter_runs_fit(h, region_len, payload_len);
}

std::vector<ScatterRun> three_runs() { return {{0, 4096}, {8192, 4096}, {65536, 12288}}; }

template <typename T>
void poke(std::vector<std::uint8_t>& bytes, std::size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

// --- write header --------------------------------------------------------

TEST(ScatterHeader, RoundTripsTokenSequenceSlotLineageEpochAndRuns) {
  const auto runs = three_runs();
  const auto bytes = header_bytes(runs, 0xdeadbeefcafef00dull, 0x0102030405060708ull, 0x9abcdef0u,
                                  0x1111222233334444ull, 0x5555666677778888ull);
  ASSERT_EQ(bytes.size(), kScatterFixedLen + 3 * kScatterRunLen);
  ScatterHeader h;
  ASSERT_TRUE(decode_scatter_header(bytes, &h));
  EXPECT_EQ(h.token, 0xdeadbeefcafef00dull);
  EXPECT_EQ(h.sequence, 0x0102030405060708ull);
  EXPECT_EQ(h.slot, 0x9abcdef0u);
  EXPECT_EQ(h.lineage, 0x1111222233334444ull);
  EXPECT_EQ(h.epoch, 0x5555666677778888ull);
  ASSERT_EQ(h.run_count(), runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(h.run(i).offset, runs[i].offset) << "run " << i;
    EXPECT_EQ(h.run(i).length, runs[i].length) << "run " << i;
  }
  // The runs view points into the caller's bytes, right after the fixed part.
  EXPECT_EQ(h.runs.data(), bytes.data() + kScatterFixedLen);
}

TEST(ScatterHeader, RoundTripsExtremeValues) {
  const std::vector<ScatterRun> runs = {{kMax, kMax}, {0, 0}};
  const auto bytes =
      header_bytes(runs, kMax, kMax, std::numeric_limits<std::uint32_t>::max(), kMax, kMax);
  ScatterHeader h;
  ASSERT_TRUE(decode_scatter_header(bytes, &h));
  EXPECT_EQ(h.lineage, kMax);
  EXPECT_EQ(h.epoch, kMax);
  EXPECT_EQ(h.token, kMax);
  EXPECT_EQ(h.sequence, kMax);
  EXPECT_EQ(h.slot, std::numeric_limits<std::uint32_t>::max());
  ASSERT_EQ(h.run_count(), 2u);
  EXPECT_EQ(h.run(0).offset, kMax);
  EXPECT_EQ(h.run(0).length, kMax);
  EXPECT_EQ(h.run(1).offset, 0u);
  EXPECT_EQ(h.run(1).length, 0u);
}

TEST(ScatterHeader, LayoutIsLittleEndianWithMagicKVXS) {
  const auto bytes = header_bytes({{0x10, 0x20}}, 1, 2, 3, 0x0807060504030201ull, 5);
  ASSERT_EQ(bytes.size(), 64u);
  const std::vector<std::uint8_t> expected = {
      'K',  'V', 'X', 'S', 2, 0, 1, 0,  // magic, version 2, one run
      1,    0,   0,   0,   0, 0, 0, 0,  // token
      2,    0,   0,   0,   0, 0, 0, 0,  // sequence
      3,    0,   0,   0,   0, 0, 0, 0,  // slot, zero
      1,    2,   3,   4,   5, 6, 7, 8,  // lineage
      5,    0,   0,   0,   0, 0, 0, 0,  // epoch
      0x10, 0,   0,   0,   0, 0, 0, 0,  // run 0 offset
      0x20, 0,   0,   0,   0, 0, 0, 0,  // run 0 length
  };
  EXPECT_EQ(bytes, expected);
}

TEST(ScatterHeader, AcceptsMaxScatterRuns) {
  std::vector<ScatterRun> runs(kMaxScatterRuns);
  for (std::size_t i = 0; i < runs.size(); ++i) runs[i] = {i * 4096, 4096};
  const auto bytes = header_bytes(runs);
  ScatterHeader h;
  ASSERT_TRUE(decode_scatter_header(bytes, &h));
  EXPECT_EQ(h.run_count(), kMaxScatterRuns);
  EXPECT_EQ(h.run(kMaxScatterRuns - 1).offset, (kMaxScatterRuns - 1) * 4096);
}

TEST(ScatterHeader, RefusesEmpty) { EXPECT_FALSE(decodes({})); }

TEST(ScatterHeader, RefusesEveryTruncation) {
  for (const auto& runs : {std::vector<ScatterRun>{{0, 1}}, three_runs()}) {
    const auto bytes = header_bytes(runs);
    for (std::size_t len = 0; len < bytes.size(); ++len) {
      const std::vector<std::uint8_t> cut(bytes.begin(),
                                          bytes.begin() + static_cast<std::ptrdiff_t>(len));
      EXPECT_FALSE(decodes(cut)) << "accepted a prefix of " << len << " of " << bytes.size()
                                 << " bytes";
    }
  }
}

TEST(ScatterHeader, RefusesEveryOneByteExtension) {
  for (const auto& runs : {std::vector<ScatterRun>{{0, 1}}, three_runs()}) {
    const auto bytes = header_bytes(runs);
    for (unsigned value = 0; value < 256; ++value) {
      auto longer = bytes;
      longer.push_back(static_cast<std::uint8_t>(value));
      EXPECT_FALSE(decodes(longer)) << "accepted a trailing byte " << value;
    }
  }
}

TEST(ScatterHeader, RefusesAWholeExtraRunNotCounted) {
  auto bytes = header_bytes(three_runs());
  bytes.resize(bytes.size() + kScatterRunLen, 0);
  EXPECT_FALSE(decodes(bytes));
}

TEST(ScatterHeader, RefusesWrongMagic) {
  const auto good = header_bytes(three_runs());
  for (std::size_t at = 0; at < 4; ++at) {
    auto bytes = good;
    bytes[at] ^= 0x01;
    EXPECT_FALSE(decodes(bytes)) << "accepted a flipped magic byte " << at;
  }
  auto ack_magic = good;
  poke(ack_magic, 0, kAckMagic);
  EXPECT_FALSE(decodes(ack_magic));
}

TEST(ScatterHeader, RefusesWrongVersion) {
  // 1: the format before lineage and epoch, whose writes cannot be fenced.
  for (const std::uint16_t version : {0, 1, 3, 0x100, 0xffff}) {
    auto bytes = header_bytes(three_runs());
    poke(bytes, 4, std::uint16_t{version});
    EXPECT_FALSE(decodes(bytes)) << "accepted version " << version;
  }
}

TEST(ScatterHeader, RefusesNonzeroReservedWord) {
  for (const std::uint32_t reserved : {1u, 0x80000000u, 0xffffffffu}) {
    auto bytes = header_bytes(three_runs());
    poke(bytes, 28, reserved);
    EXPECT_FALSE(decodes(bytes)) << "accepted reserved word " << reserved;
  }
  for (std::size_t at = 28; at < 32; ++at) {
    auto bytes = header_bytes(three_runs());
    bytes[at] = 0x01;
    EXPECT_FALSE(decodes(bytes)) << "accepted a nonzero reserved byte " << at;
  }
}

TEST(ScatterHeader, RefusesZeroRuns) {
  std::vector<std::uint8_t> bytes(kScatterFixedLen);
  put_scatter_fixed(bytes.data(), 0, 1, 2, 3, 4, 5);
  EXPECT_FALSE(decodes(bytes));
  // Nor a zero count followed by a run's worth of bytes.
  bytes.resize(kScatterFixedLen + kScatterRunLen, 0);
  EXPECT_FALSE(decodes(bytes));
}

TEST(ScatterHeader, RefusesMoreThanMaxScatterRuns) {
  for (const std::size_t count : {kMaxScatterRuns + 1, std::size_t{0xffff}}) {
    std::vector<std::uint8_t> bytes(scatter_header_len(count), 0);
    put_scatter_fixed(bytes.data(), static_cast<std::uint16_t>(count), 1, 2, 3, 4, 5);
    for (std::size_t i = 0; i < count; ++i) put_scatter_run(bytes.data(), i, i * 4096, 4096);
    EXPECT_FALSE(decodes(bytes)) << "accepted " << count << " runs";
  }
}

TEST(ScatterHeader, RefusesRunCountThatDisagreesWithLength) {
  auto bytes = header_bytes(three_runs());
  for (const std::uint16_t count : {1, 2, 4, 5}) {
    poke(bytes, 6, count);
    EXPECT_FALSE(decodes(bytes)) << "accepted count " << count << " over 3 runs of bytes";
  }
}

// --- runs against region and payload ---------------------------------------

TEST(ScatterRunsFit, AcceptsExactFit) {
  EXPECT_TRUE(fits(three_runs(), 1 << 20, 4096 + 4096 + 12288));
}

TEST(ScatterRunsFit, AcceptsRunEndingExactlyAtRegionEnd) {
  EXPECT_TRUE(fits({{0, 4096}, {12288, 4096}}, 16384, 8192));
  EXPECT_TRUE(fits({{0, 16384}}, 16384, 16384));
  EXPECT_TRUE(fits({{kMax - 1, 1}}, kMax, 1));
  EXPECT_TRUE(fits({{0, kMax}}, kMax, kMax));
}

TEST(ScatterRunsFit, AcceptsOverlappingAndUnorderedRuns) {
  // The format does not require order or disjointness; the handler copies
  // run by run.
  EXPECT_TRUE(fits({{8192, 4096}, {0, 4096}, {0, 4096}}, 16384, 12288));
}

TEST(ScatterRunsFit, RejectsZeroLengthRun) {
  EXPECT_FALSE(fits({{0, 4096}, {4096, 0}}, 16384, 4096));
  EXPECT_FALSE(fits({{0, 0}}, 16384, 0));
}

TEST(ScatterRunsFit, RejectsRunPastRegionEnd) {
  EXPECT_FALSE(fits({{12289, 4096}}, 16384, 4096));
  EXPECT_FALSE(fits({{16384, 1}}, 16384, 1));
  EXPECT_FALSE(fits({{0, 16385}}, 16384, 16385));
  EXPECT_FALSE(fits({{0, 4096}, {kMax, 1}}, 16384, 4097));
  EXPECT_FALSE(fits({{0, 1}}, 0, 1));
}

TEST(ScatterRunsFit, RejectsOffsetNearMaxWhoseEndOverflows) {
  // offset + length wraps to a small number: a naive end check would pass.
  EXPECT_FALSE(fits({{kMax, 2}}, 16384, 2));
  EXPECT_FALSE(fits({{kMax - 4095, 4097}}, 16384, 4097));
  EXPECT_FALSE(fits({{kMax - 4095, 8192}}, kMax, 8192));
  EXPECT_FALSE(fits({{kMax, kMax}}, kMax, kMax));
}

TEST(ScatterRunsFit, RejectsLengthsSummingToMoreThanPayload) {
  EXPECT_FALSE(fits(three_runs(), 1 << 20, 4096 + 4096 + 12288 - 1));
  EXPECT_FALSE(fits(three_runs(), 1 << 20, 0));
}

TEST(ScatterRunsFit, RejectsLengthsSummingToLessThanPayload) {
  EXPECT_FALSE(fits(three_runs(), 1 << 20, 4096 + 4096 + 12288 + 1));
  EXPECT_FALSE(fits(three_runs(), 1 << 20, kMax));
}

TEST(ScatterRunsFit, RejectsSumsThatWouldOverflow) {
  // Each run fits the region; their sum wraps modulo 2^64 to the payload.
  const std::uint64_t half = (kMax / 2) + 1;  // 2^63
  EXPECT_FALSE(fits({{0, half}, {0, half}}, kMax, 0));
  EXPECT_FALSE(fits({{0, half}, {0, half}, {0, 4096}}, kMax, 4096));
  EXPECT_FALSE(fits({{0, kMax}, {0, 2}}, kMax, 1));
  EXPECT_FALSE(fits({{0, kMax}, {0, kMax}}, kMax, kMax - 1));
}

// --- ack -------------------------------------------------------------------

std::vector<std::uint8_t> ack_bytes(const ScatterAck& ack) {
  std::vector<std::uint8_t> out(kAckLen);
  encode_ack(out.data(), ack);
  return out;
}

bool ack_decodes(const std::vector<std::uint8_t>& bytes) {
  ScatterAck a;
  return decode_ack(bytes, &a);
}

TEST(ScatterAck, RoundTripsSlotSequenceAndStatus) {
  for (const ScatterAck in : {ScatterAck{7, 42, 0}, ScatterAck{0xffffffffu, kMax, -22},
                              ScatterAck{0, 0, std::numeric_limits<std::int32_t>::min()}}) {
    const auto bytes = ack_bytes(in);
    ScatterAck out;
    ASSERT_TRUE(decode_ack(bytes, &out));
    EXPECT_EQ(out.slot, in.slot);
    EXPECT_EQ(out.sequence, in.sequence);
    EXPECT_EQ(out.status, in.status);
  }
}

TEST(ScatterAck, LayoutIsLittleEndianWithMagicKVXA) {
  const auto bytes = ack_bytes({3, 2, -1});
  const std::vector<std::uint8_t> expected = {
      'K',  'V',  'X',  'A',  3, 0, 0, 0,  // magic, slot
      2,    0,    0,    0,    0, 0, 0, 0,  // sequence
      0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0,  // status, zero
  };
  EXPECT_EQ(bytes, expected);
}

TEST(ScatterAck, RefusesWrongLength) {
  const auto good = ack_bytes({1, 2, 0});
  for (std::size_t len = 0; len < kAckLen; ++len) {
    const std::vector<std::uint8_t> cut(good.begin(),
                                        good.begin() + static_cast<std::ptrdiff_t>(len));
    EXPECT_FALSE(ack_decodes(cut)) << "accepted a prefix of " << len << " bytes";
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_FALSE(ack_decodes(longer));
}

TEST(ScatterAck, RefusesWrongMagic) {
  const auto good = ack_bytes({1, 2, 0});
  for (std::size_t at = 0; at < 4; ++at) {
    auto bytes = good;
    bytes[at] ^= 0x20;
    EXPECT_FALSE(ack_decodes(bytes)) << "accepted a flipped magic byte " << at;
  }
  auto scatter_magic = good;
  poke(scatter_magic, 0, kScatterMagic);
  EXPECT_FALSE(ack_decodes(scatter_magic));
}

TEST(ScatterAck, RefusesNonzeroReservedWord) {
  for (std::size_t at = 20; at < 24; ++at) {
    auto bytes = ack_bytes({1, 2, 0});
    bytes[at] = 0x80;
    EXPECT_FALSE(ack_decodes(bytes)) << "accepted a nonzero reserved byte " << at;
  }
}

TEST(ScatterAck, IsNotAWriteHeaderAndViceVersa) {
  // An ack delivered to the write handler (or the reverse) is refused.
  EXPECT_FALSE(decodes(ack_bytes({1, 2, 0})));
  auto header = header_bytes({{0, 1}});
  header.resize(kAckLen);
  EXPECT_FALSE(ack_decodes(header));
}

}  // namespace
}  // namespace kvxfer::internal::ucx
