// SPDX-License-Identifier: Apache-2.0
// The UCX engine through src/engine.h, two engines in this process: what the
// core relies on (handles, states, counts) without the core in between.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "engine_agent.h"
#include "wire/peer_blob.h"
#include "it_support.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using internal::Engine;
using internal::PeerHandle;
using internal::XferHandle;

class UcxEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  UcxEngineTest()
      : a("engine-a", GetParam(), 64, 16 * 1024), b("engine-b", GetParam(), 64, 16 * 1024) {}

  PeerHandle connect_a_to_b() {
    PeerHandle peer = 0;
    const std::vector<std::uint8_t> blob = b.engine->local_blob();
    EXPECT_EQ(a.engine->connect(blob, b.region(), &peer), Status::kSuccess);
    return peer;
  }

  [[nodiscard]] bool landed(std::int64_t local, std::int64_t remote) const {
    return bytes_equal(a.pool.block(static_cast<std::uint64_t>(local)),
                       b.pool.block(static_cast<std::uint64_t>(remote)), a.pool.block_len());
  }

  EngineAgent a;
  EngineAgent b;
};

TEST_P(UcxEngineTest, WriteLandsAndItsHandlesAreGivenBack) {
  const PeerHandle peer = connect_a_to_b();
  ASSERT_NE(peer, 0u);
  const std::vector<std::int64_t> local = {3, 4, 5, 9, 0};
  const std::vector<std::int64_t> remote = {10, 11, 12, 63, 1};
  XferHandle xfer = 0;
  ASSERT_EQ(a.engine->post_write(peer, 1, local, remote, &xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->live().transfers, 1u);
  const auto [check, state] = wait_state(*a.engine, xfer);
  EXPECT_EQ(check, Status::kSuccess);
  EXPECT_EQ(state, Status::kSuccess);
  for (std::size_t i = 0; i < local.size(); ++i) EXPECT_TRUE(landed(local[i], remote[i])) << i;
  EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
  a.engine->shutdown();
  EXPECT_EQ(a.engine->live(), HandleCounts{});
}

TEST_P(UcxEngineTest, ReleasedWhileInFlightIsReclaimedByTheEngine) {
  const PeerHandle peer = connect_a_to_b();
  for (std::int64_t i = 0; i < 32; ++i) {
    XferHandle xfer = 0;
    const std::vector<std::int64_t> local = {i, i + 32};
    const std::vector<std::int64_t> remote = {63 - i, 31 - i};
    ASSERT_EQ(a.engine->post_write(peer, static_cast<TransferId>(i), local, remote, &xfer),
              Status::kSuccess);
    ASSERT_EQ(a.engine->release(xfer), Status::kSuccess);
  }
  EXPECT_EQ(a.engine->live().transfers, 0u);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (a.engine->live().requests > 0 && std::chrono::steady_clock::now() < deadline) {
    a.engine->progress();
    std::this_thread::sleep_for(100us);
  }
  EXPECT_EQ(a.engine->live().requests, 0u);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

TEST_P(UcxEngineTest, DisconnectFinishesEveryTransferStillPosted) {
  const PeerHandle peer = connect_a_to_b();
  std::vector<XferHandle> xfers;
  for (std::int64_t i = 0; i < 16; ++i) {
    XferHandle xfer = 0;
    const std::vector<std::int64_t> local = {i, i + 16, i + 32};
    const std::vector<std::int64_t> remote = {i + 32, i + 16, i};
    ASSERT_EQ(a.engine->post_write(peer, static_cast<TransferId>(i), local, remote, &xfer),
              Status::kSuccess);
    xfers.push_back(xfer);
  }
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  for (const XferHandle xfer : xfers) {
    Status state = Status::kInProgress;
    EXPECT_EQ(a.engine->check(xfer, &state), Status::kSuccess);
    // Landed before the close, or cancelled by it; never left in progress.
    EXPECT_TRUE(state == Status::kSuccess || state == Status::kCanceled) << status_name(state);
    EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  }
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// Writes of several MiB are split into chunks that the copier threads and
// every caller of progress() share (two polling threads here); each lands
// whole, and only once all its chunks did.
TEST_P(UcxEngineTest, MultiChunkWritesLandWithSeveralThreadsPolling) {
  constexpr std::uint64_t kBlockLen = 768 * 1024;  // runs split at 1 MiB
  EngineAgent src("engine-src", GetParam(), 32, kBlockLen);
  EngineAgent dst("engine-dst", GetParam(), 32, kBlockLen);
  dst.pool.fill_generation(2);
  PeerHandle peer = 0;
  ASSERT_EQ(src.engine->connect(dst.engine->local_blob(), dst.region(), &peer), Status::kSuccess);
  // One 6 MiB run, one of 1.5 MiB, and scattered blocks; no remote block twice.
  const std::vector<std::vector<std::int64_t>> locals = {
      {0, 1, 2, 3, 4, 5, 6, 7}, {8, 9}, {20, 13, 31, 17}};
  const std::vector<std::vector<std::int64_t>> remotes = {
      {16, 17, 18, 19, 20, 21, 22, 23}, {0, 1}, {3, 30, 7, 11}};
  std::vector<XferHandle> xfers(locals.size());
  for (std::size_t w = 0; w < locals.size(); ++w) {
    ASSERT_EQ(
        src.engine->post_write(peer, static_cast<TransferId>(w), locals[w], remotes[w], &xfers[w]),
        Status::kSuccess);
  }
  std::atomic<bool> stop{false};
  std::thread helper([&] {
    while (!stop.load()) src.engine->progress();
  });
  for (const XferHandle xfer : xfers) {
    const auto [check, state] = wait_state(*src.engine, xfer);
    EXPECT_EQ(check, Status::kSuccess);
    EXPECT_EQ(state, Status::kSuccess);
  }
  stop.store(true);
  helper.join();
  for (std::size_t w = 0; w < locals.size(); ++w) {
    for (std::size_t i = 0; i < locals[w].size(); ++i) {
      EXPECT_TRUE(bytes_equal(src.pool.block(static_cast<std::uint64_t>(locals[w][i])),
                              dst.pool.block(static_cast<std::uint64_t>(remotes[w][i])), kBlockLen))
          << w << ' ' << i;
    }
    EXPECT_EQ(src.engine->release(xfers[w]), Status::kSuccess);
  }
  EXPECT_EQ(src.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(src.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

TEST_P(UcxEngineTest, MalformedBlobsAreRejectedWithoutLeavingAPeer) {
  const std::vector<std::uint8_t> good = b.engine->local_blob();
  std::vector<std::vector<std::uint8_t>> bad = {
      {},
      std::vector<std::uint8_t>(good.begin(), good.begin() + 10),
      std::vector<std::uint8_t>(good.begin(), good.end() - 1),
      good,
      good,
  };
  bad[3].push_back(0);  // trailing byte
  bad[4][0] ^= 0xff;    // wrong magic
  // A worker-address length that runs past the end.
  std::vector<std::uint8_t> long_len = good;
  long_len[40] = 0xff;
  long_len[41] = 0xff;
  bad.push_back(long_len);
  for (std::size_t i = 0; i < bad.size(); ++i) {
    PeerHandle peer = 0;
    EXPECT_EQ(a.engine->connect(bad[i], b.region(), &peer), Status::kInvalidParam) << i;
  }
  EXPECT_EQ(a.engine->live().peers, 0u);
  EXPECT_EQ(a.engine->live().remote_keys, 0u);
}

TEST_P(UcxEngineTest, DisconnectOfAnUnknownHandleIsNotFound) {
  EXPECT_EQ(a.engine->disconnect(12345), Status::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxEngineTest, ::testing::Values("sm,self", "tcp", "ucx"),
                         [](const ::testing::TestParamInfo<std::string>& tls) {
                           return tls.param == "sm,self" ? std::string("sm") : tls.param;
                         });

TEST(UcxBlobTest, RoundTripsAndRejectsEveryTruncation) {
  const std::vector<std::uint8_t> address = {1, 2, 3, 4, 5};
  const std::vector<std::uint8_t> rkey = {9, 8, 7};
  wire::PeerBlob blob;
  blob.flags = wire::kBlobAcceptsCma;
  blob.pidns_dev = 11;
  blob.pidns_ino = 22;
  blob.cookie_addr = 0x1000;
  blob.cookie_epoch = 0xdeadbeef;
  blob.worker_address = address;
  blob.rkey = rkey;
  const auto bytes = wire::encode_blob(blob);
  wire::PeerBlob decoded;
  ASSERT_TRUE(wire::decode_blob(bytes, &decoded));
  EXPECT_EQ(decoded.flags, blob.flags);
  EXPECT_EQ(decoded.pidns_ino, 22u);
  EXPECT_EQ(decoded.cookie_epoch, 0xdeadbeefu);
  EXPECT_TRUE(std::equal(decoded.worker_address.begin(), decoded.worker_address.end(),
                         address.begin(), address.end()));
  EXPECT_TRUE(std::equal(decoded.rkey.begin(), decoded.rkey.end(), rkey.begin(), rkey.end()));
  for (std::size_t len = 0; len < bytes.size(); ++len) {
    EXPECT_FALSE(wire::decode_blob(std::span(bytes.data(), len), &decoded)) << len;
  }
}

}  // namespace
}  // namespace kvxfer::it
