// SPDX-License-Identifier: Apache-2.0
// The gather-read wire format of the UCX lane: requests and replies round
// trip with a fixed little-endian layout, hostile bytes (truncated,
// extended, wrong magic or version, bad run counts, reserved fields set, a
// refusal that announces bytes) are refused, a refused request still names
// its read when it can, and runs are checked against the region and the
// byte limit without overflowing.
#include "wire/gather.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "wire/scatter.h"

namespace kvxfer::internal::ucx {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

std::vector<std::uint8_t> request_bytes(const std::vector<GatherRun>& runs,
                                        std::uint64_t token = 0x1122334455667788ull,
                                        std::uint64_t sequence = 42, std::uint32_t slot = 7,
                                        std::uint32_t chunk = 3,
                                        std::uint64_t lineage = 0x0badc0ffee0ddf00ull,
                                        std::uint64_t epoch = 0x5eed5eed5eed5eedull) {
  std::vector<std::uint8_t> out(gather_request_len(runs.size()));
  put_gather_fixed(out.data(), static_cast<std::uint16_t>(runs.size()), token, sequence, slot,
                   chunk, lineage, epoch);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    put_gather_run(out.data(), i, runs[i].offset, runs[i].length);
  }
  return out;
}

bool decodes(const std::vector<std::uint8_t>& bytes) {
  GatherRequest r;
  return decode_gather_request(bytes, &r);
}

// Encodes `runs` into a request, decodes it and asks whether they fit; the
// total is written to *total only when they do.
bool fits(const std::vector<GatherRun>& runs, std::uint64_t region_len, std::uint64_t limit,
          std::uint64_t* total = nullptr) {
  const auto bytes = request_bytes(runs);
  GatherRequest r;
  EXPECT_TRUE(decode_gather_request(bytes, &r));
  std::uint64_t sum = 0xdeadull;
  const bool ok = gather_runs_fit(r, region_len, limit, &sum);
  if (!ok) {
    EXPECT_EQ(sum, 0xdeadull) << "a refusal wrote the total";
  }
  if (total != nullptr) *total = sum;
  return ok;
}

std::vector<GatherRun> three_runs() { return {{0, 4096}, {8192, 4096}, {65536, 12288}}; }

template <typename T>
void poke(std::vector<std::uint8_t>& bytes, std::size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

// --- request ---------------------------------------------------------------

TEST(GatherRequest, RoundTripsEveryFieldAndTheRuns) {
  const auto runs = three_runs();
  const auto bytes = request_bytes(runs, 0xdeadbeefcafef00dull, 0x0102030405060708ull, 0x9abcdef0u,
                                   0x13572468u, 0x1111222233334444ull, 0x5555666677778888ull);
  ASSERT_EQ(bytes.size(), kGatherFixedLen + 3 * kGatherRunLen);
  GatherRequest r;
  ASSERT_TRUE(decode_gather_request(bytes, &r));
  EXPECT_EQ(r.token, 0xdeadbeefcafef00dull);
  EXPECT_EQ(r.sequence, 0x0102030405060708ull);
  EXPECT_EQ(r.slot, 0x9abcdef0u);
  EXPECT_EQ(r.chunk, 0x13572468u);
  EXPECT_EQ(r.lineage, 0x1111222233334444ull);
  EXPECT_EQ(r.epoch, 0x5555666677778888ull);
  ASSERT_EQ(r.run_count(), runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(r.run(i).offset, runs[i].offset) << "run " << i;
    EXPECT_EQ(r.run(i).length, runs[i].length) << "run " << i;
  }
  EXPECT_EQ(r.runs.data(), bytes.data() + kGatherFixedLen);
}

TEST(GatherRequest, RoundTripsExtremeValues) {
  const auto bytes =
      request_bytes({{kMax, kMax}, {0, 0}}, kMax, kMax, 0xffffffffu, 0xffffffffu, kMax, kMax);
  GatherRequest r;
  ASSERT_TRUE(decode_gather_request(bytes, &r));
  EXPECT_EQ(r.token, kMax);
  EXPECT_EQ(r.sequence, kMax);
  EXPECT_EQ(r.slot, 0xffffffffu);
  EXPECT_EQ(r.chunk, 0xffffffffu);
  EXPECT_EQ(r.lineage, kMax);
  EXPECT_EQ(r.epoch, kMax);
  ASSERT_EQ(r.run_count(), 2u);
  EXPECT_EQ(r.run(0).offset, kMax);
  EXPECT_EQ(r.run(1).length, 0u);
}

TEST(GatherRequest, LayoutIsLittleEndianWithMagicKVXG) {
  const auto bytes = request_bytes({{0x10, 0x20}}, 1, 2, 3, 4, 0x0807060504030201ull, 5);
  const std::vector<std::uint8_t> expected = {
      'K',  'V', 'X', 'G', 1, 0, 1, 0,  // magic, version 1, one run
      1,    0,   0,   0,   0, 0, 0, 0,  // token
      2,    0,   0,   0,   0, 0, 0, 0,  // sequence
      3,    0,   0,   0,   4, 0, 0, 0,  // slot, chunk
      1,    2,   3,   4,   5, 6, 7, 8,  // lineage
      5,    0,   0,   0,   0, 0, 0, 0,  // epoch
      0x10, 0,   0,   0,   0, 0, 0, 0,  // run 0 offset
      0x20, 0,   0,   0,   0, 0, 0, 0,  // run 0 length
  };
  EXPECT_EQ(bytes, expected);
}

TEST(GatherRequest, AcceptsMaxGatherRuns) {
  std::vector<GatherRun> runs(kMaxGatherRuns);
  for (std::size_t i = 0; i < runs.size(); ++i) runs[i] = {i * 4096, 4096};
  GatherRequest r;
  const auto bytes = request_bytes(runs);
  ASSERT_TRUE(decode_gather_request(bytes, &r));
  EXPECT_EQ(r.run_count(), kMaxGatherRuns);
}

TEST(GatherRequest, RefusesEveryTruncation) {
  for (const auto& runs : {std::vector<GatherRun>{{0, 1}}, three_runs()}) {
    const auto bytes = request_bytes(runs);
    for (std::size_t len = 0; len < bytes.size(); ++len) {
      const std::vector<std::uint8_t> cut(bytes.begin(),
                                          bytes.begin() + static_cast<std::ptrdiff_t>(len));
      EXPECT_FALSE(decodes(cut)) << "accepted a prefix of " << len << " bytes";
    }
  }
}

TEST(GatherRequest, RefusesEveryOneByteExtensionAndAnUncountedRun) {
  const auto bytes = request_bytes(three_runs());
  for (unsigned value = 0; value < 256; ++value) {
    auto longer = bytes;
    longer.push_back(static_cast<std::uint8_t>(value));
    EXPECT_FALSE(decodes(longer)) << "accepted a trailing byte " << value;
  }
  auto extra = bytes;
  extra.resize(extra.size() + kGatherRunLen, 0);
  EXPECT_FALSE(decodes(extra));
}

TEST(GatherRequest, RefusesWrongMagicAndOtherFormats) {
  const auto good = request_bytes(three_runs());
  for (std::size_t at = 0; at < 4; ++at) {
    auto bytes = good;
    bytes[at] ^= 0x01;
    EXPECT_FALSE(decodes(bytes)) << "accepted a flipped magic byte " << at;
  }
  for (const std::uint32_t magic : {kScatterMagic, kGatherReplyMagic, kAckMagic}) {
    auto bytes = good;
    poke(bytes, 0, magic);
    EXPECT_FALSE(decodes(bytes)) << std::hex << magic;
  }
  // A scatter write header of the same length is not a read.
  std::vector<std::uint8_t> scatter(scatter_header_len(3));
  put_scatter_fixed(scatter.data(), 3, 1, 2, 3, 4, 5);
  EXPECT_FALSE(decodes(scatter));
}

TEST(GatherRequest, RefusesWrongVersion) {
  for (const std::uint16_t version : {0, 2, 0x100, 0xffff}) {
    auto bytes = request_bytes(three_runs());
    poke(bytes, 4, version);
    EXPECT_FALSE(decodes(bytes)) << "accepted version " << version;
  }
}

TEST(GatherRequest, RefusesZeroRunsAndMoreThanMax) {
  std::vector<std::uint8_t> zero(kGatherFixedLen);
  put_gather_fixed(zero.data(), 0, 1, 2, 3, 4, 5, 6);
  EXPECT_FALSE(decodes(zero));
  zero.resize(kGatherFixedLen + kGatherRunLen, 0);
  EXPECT_FALSE(decodes(zero));
  for (const std::size_t count : {kMaxGatherRuns + 1, std::size_t{0xffff}}) {
    std::vector<std::uint8_t> bytes(gather_request_len(count), 0);
    put_gather_fixed(bytes.data(), static_cast<std::uint16_t>(count), 1, 2, 3, 4, 5, 6);
    EXPECT_FALSE(decodes(bytes)) << "accepted " << count << " runs";
  }
}

TEST(GatherRequest, RefusesRunCountThatDisagreesWithLength) {
  auto bytes = request_bytes(three_runs());
  for (const std::uint16_t count : {1, 2, 4, 5}) {
    poke(bytes, 6, count);
    EXPECT_FALSE(decodes(bytes)) << "accepted count " << count << " over 3 runs of bytes";
  }
}

TEST(GatherRequest, RefusedRequestsStillNameTheirReadWhenTheyCan) {
  // Wrong version, bad count, truncated runs: decode refuses, but slot,
  // sequence and chunk are readable, so the target can answer with a refusal.
  auto bad_version = request_bytes(three_runs(), 1, 0xabcdef, 9, 4);
  poke(bad_version, 4, std::uint16_t{7});
  auto bad_count = request_bytes(three_runs(), 1, 0xabcdef, 9, 4);
  poke(bad_count, 6, std::uint16_t{0});
  auto truncated = request_bytes(three_runs(), 1, 0xabcdef, 9, 4);
  truncated.resize(kGatherAddressLen);
  for (const auto& bytes : {bad_version, bad_count, truncated}) {
    EXPECT_FALSE(decodes(bytes));
    GatherAddress a;
    ASSERT_TRUE(peek_gather_address(bytes, &a));
    EXPECT_EQ(a.slot, 9u);
    EXPECT_EQ(a.chunk, 4u);
    EXPECT_EQ(a.sequence, 0xabcdefu);
  }
}

TEST(GatherRequest, UnaddressableBytesNameNoRead) {
  const auto good = request_bytes(three_runs());
  GatherAddress a{1, 2, 3};
  for (std::size_t len = 0; len < kGatherAddressLen; ++len) {
    EXPECT_FALSE(peek_gather_address(std::span(good.data(), len), &a)) << len;
  }
  auto scatter_magic = good;
  poke(scatter_magic, 0, kScatterMagic);
  EXPECT_FALSE(peek_gather_address(scatter_magic, &a));
  EXPECT_EQ(a.slot, 1u);  // left alone
  EXPECT_EQ(a.chunk, 2u);
  EXPECT_EQ(a.sequence, 3u);
}

// --- runs against the region and the limit ---------------------------------

TEST(GatherRunsFit, AcceptsRunsInsideTheRegionAndReportsTheirTotal) {
  std::uint64_t total = 0;
  EXPECT_TRUE(fits(three_runs(), 1 << 20, kMaxGatherBytes, &total));
  EXPECT_EQ(total, 4096u + 4096u + 12288u);
  EXPECT_TRUE(fits({{0, 16384}}, 16384, 16384, &total));
  EXPECT_EQ(total, 16384u);
  EXPECT_TRUE(fits({{kMax - 1, 1}}, kMax, 1));
  // Order and overlap are the initiator's business; each run is checked.
  EXPECT_TRUE(fits({{8192, 4096}, {0, 4096}, {0, 4096}}, 16384, 12288, &total));
  EXPECT_EQ(total, 12288u);
}

TEST(GatherRunsFit, RefusesEmptyRuns) {
  EXPECT_FALSE(fits({{0, 4096}, {4096, 0}}, 16384, kMaxGatherBytes));
  EXPECT_FALSE(fits({{0, 0}}, 16384, kMaxGatherBytes));
}

TEST(GatherRunsFit, RefusesRunsPastTheRegion) {
  EXPECT_FALSE(fits({{12289, 4096}}, 16384, kMaxGatherBytes));
  EXPECT_FALSE(fits({{16384, 1}}, 16384, kMaxGatherBytes));
  EXPECT_FALSE(fits({{0, 16385}}, 16384, kMaxGatherBytes));
  EXPECT_FALSE(fits({{0, 4096}, {kMax, 1}}, 16384, kMaxGatherBytes));
  EXPECT_FALSE(fits({{0, 1}}, 0, kMaxGatherBytes));
}

TEST(GatherRunsFit, RefusesOffsetsWhoseEndOverflows) {
  EXPECT_FALSE(fits({{kMax, 2}}, 16384, kMaxGatherBytes));
  EXPECT_FALSE(fits({{kMax - 4095, 4097}}, 16384, kMaxGatherBytes));
  EXPECT_FALSE(fits({{kMax - 4095, 8192}}, kMax, kMax));
  EXPECT_FALSE(fits({{kMax, kMax}}, kMax, kMax));
}

TEST(GatherRunsFit, RefusesTotalsOverTheLimit) {
  EXPECT_TRUE(fits(three_runs(), 1 << 20, 20480));
  EXPECT_FALSE(fits(three_runs(), 1 << 20, 20479));
  EXPECT_FALSE(fits({{0, kMaxGatherBytes + 1}}, kMax, kMaxGatherBytes));
  EXPECT_FALSE(fits(three_runs(), 1 << 20, 0));
}

TEST(GatherRunsFit, RefusesSumsThatWouldOverflow) {
  // Each run fits the region and the limit is huge; the sum wraps modulo
  // 2^64 to something small.
  const std::uint64_t half = (kMax / 2) + 1;  // 2^63
  EXPECT_FALSE(fits({{0, half}, {0, half}}, kMax, kMax));
  EXPECT_FALSE(fits({{0, half}, {0, half}, {0, 4096}}, kMax, kMax));
  EXPECT_FALSE(fits({{0, kMax}, {0, 2}}, kMax, kMax));
}

// --- reply -----------------------------------------------------------------

std::vector<std::uint8_t> reply_bytes(const GatherReply& reply) {
  std::vector<std::uint8_t> out(kGatherReplyLen);
  encode_gather_reply(out.data(), reply);
  return out;
}

bool reply_decodes(const std::vector<std::uint8_t>& bytes) {
  GatherReply r;
  return decode_gather_reply(bytes, &r);
}

TEST(GatherReply, RoundTripsEveryField) {
  for (const GatherReply in :
       {GatherReply{7, 3, 42, 0, 20480}, GatherReply{0xffffffffu, 0xffffffffu, kMax, 0, kMax},
        GatherReply{1, 0, 2, -22, 0},
        GatherReply{0, 0, 0, std::numeric_limits<std::int32_t>::min(), 0}}) {
    const auto bytes = reply_bytes(in);
    GatherReply out;
    ASSERT_TRUE(decode_gather_reply(bytes, &out));
    EXPECT_EQ(out.slot, in.slot);
    EXPECT_EQ(out.chunk, in.chunk);
    EXPECT_EQ(out.sequence, in.sequence);
    EXPECT_EQ(out.status, in.status);
    EXPECT_EQ(out.length, in.length);
  }
}

TEST(GatherReply, LayoutIsLittleEndianWithMagicKVXR) {
  const auto bytes = reply_bytes({3, 4, 2, 0, 0x0102});
  const std::vector<std::uint8_t> expected = {
      'K', 'V', 'X', 'R', 1, 0, 0, 0,  // magic, version 1, zero
      3,   0,   0,   0,   4, 0, 0, 0,  // slot, chunk
      2,   0,   0,   0,   0, 0, 0, 0,  // sequence
      0,   0,   0,   0,   0, 0, 0, 0,  // status, zero
      2,   1,   0,   0,   0, 0, 0, 0,  // byte length
  };
  EXPECT_EQ(bytes, expected);
}

TEST(GatherReply, RefusesWrongLength) {
  const auto good = reply_bytes({1, 2, 3, 0, 4096});
  for (std::size_t len = 0; len < kGatherReplyLen; ++len) {
    EXPECT_FALSE(reply_decodes({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)}))
        << "accepted a prefix of " << len << " bytes";
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_FALSE(reply_decodes(longer));
}

TEST(GatherReply, RefusesWrongMagicVersionAndReservedFields) {
  const auto good = reply_bytes({1, 2, 3, 0, 4096});
  for (std::size_t at = 0; at < 4; ++at) {
    auto bytes = good;
    bytes[at] ^= 0x20;
    EXPECT_FALSE(reply_decodes(bytes)) << "accepted a flipped magic byte " << at;
  }
  for (const std::uint32_t magic : {kGatherMagic, kAckMagic, kScatterMagic}) {
    auto bytes = good;
    poke(bytes, 0, magic);
    EXPECT_FALSE(reply_decodes(bytes)) << std::hex << magic;
  }
  for (const std::uint16_t version : {0, 2, 0xffff}) {
    auto bytes = good;
    poke(bytes, 4, version);
    EXPECT_FALSE(reply_decodes(bytes)) << "accepted version " << version;
  }
  for (const std::size_t at : {6u, 7u, 28u, 29u, 30u, 31u}) {
    auto bytes = good;
    bytes[at] = 0x01;
    EXPECT_FALSE(reply_decodes(bytes)) << "accepted a nonzero reserved byte " << at;
  }
}

TEST(GatherReply, RefusesARefusalThatAnnouncesBytes) {
  EXPECT_TRUE(reply_decodes(reply_bytes({1, 2, 3, -25, 0})));
  EXPECT_FALSE(reply_decodes(reply_bytes({1, 2, 3, -25, 1})));
  EXPECT_FALSE(reply_decodes(reply_bytes({1, 2, 3, 1, kMax})));
}

TEST(GatherReply, IsNeitherAnAckNorARequest) {
  std::vector<std::uint8_t> ack(kAckLen);
  encode_ack(ack.data(), ScatterAck{1, 2, 0});
  EXPECT_FALSE(reply_decodes(ack));
  ack.resize(kGatherReplyLen, 0);
  EXPECT_FALSE(reply_decodes(ack));
  EXPECT_FALSE(decodes(reply_bytes({1, 2, 3, 0, 4096})));
  auto request = request_bytes({{0, 1}});
  request.resize(kGatherReplyLen);
  EXPECT_FALSE(reply_decodes(request));
}

}  // namespace
}  // namespace kvxfer::internal::ucx
