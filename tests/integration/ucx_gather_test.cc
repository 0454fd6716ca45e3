// SPDX-License-Identifier: Apache-2.0
// Gather reads (wire/gather.h) over TCP, engines in this process through
// src/engine.h: reads of random and consecutive blocks, and of blocks larger
// than a message, land byte for byte in our pool, handed off or inline; a
// read the target refuses (fence, token, a hostile request) fails and writes
// nothing; a read ended by disconnect or release takes no byte afterwards;
// replies that are not exactly what a read awaits, from its peer, are
// dropped; and every handle is given back.
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine.h"
#include "engine_agent.h"
#include "it_support.h"
#include "raw_ucp.h"
#include "wire/fence.h"
#include "wire/gather.h"
#include "wire/ucx_blob.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using internal::PeerHandle;
using internal::XferHandle;

constexpr std::uint64_t kBlocks = 64;
constexpr std::uint64_t kBlockLen = 16 * 1024;
constexpr std::uint64_t kOwnGen = 1;     // the reader's pool
constexpr std::uint64_t kTargetGen = 2;  // the target's pool

struct Agent : EngineAgent {
  Agent(std::string agent_name, std::uint64_t gen,
        std::map<std::string, std::string> engine_config = {})
      : EngineAgent(std::move(agent_name), with_tcp(std::move(engine_config)), kBlocks, kBlockLen,
                    gen) {}
  static std::map<std::string, std::string> with_tcp(std::map<std::string, std::string> config) {
    config["TLS"] = "tcp";
    // The UCX lane itself, over UCX's tcp transport (the only one with puts
    // here), not the tcp lane remote peers get by default.
    config["KVXFER_LANES"] = "ucx";
    return config;
  }
  PeerHandle connect(const Agent& target) {
    PeerHandle peer = 0;
    EXPECT_EQ(engine->connect(target.engine->local_blob(), target.region(), &peer),
              Status::kSuccess);
    return peer;
  }
};

std::vector<std::int64_t> shuffled(std::uint64_t seed, std::size_t count = kBlocks) {
  std::mt19937_64 rng(seed);
  return random_sample(rng, kBlocks, count);
}

std::vector<std::int64_t> range(std::int64_t first, std::int64_t count) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) v[static_cast<std::size_t>(i)] = first + i;
  return v;
}

// Whether our block `local` holds the target's block `remote`.
bool read_in(const Agent& reader, std::int64_t local, std::int64_t remote) {
  return first_mismatch(reader.pool.block(static_cast<std::uint64_t>(local)), kBlockLen, kTargetGen,
                        static_cast<std::uint64_t>(remote)) < 0;
}

// Whether our block `local` still holds what it held before any read.
bool untouched(const Agent& reader, std::int64_t local) {
  return first_mismatch(reader.pool.block(static_cast<std::uint64_t>(local)), kBlockLen, kOwnGen,
                        static_cast<std::uint64_t>(local)) < 0;
}

std::vector<std::uint8_t> snapshot(const Agent& agent) {
  std::vector<std::uint8_t> copy(agent.pool.len());
  for (std::uint64_t i = 0; i < copy.size(); ++i) copy[i] = agent.pool.base()[i];
  return copy;
}

// Posts a read and waits for its end; releases it unless `keep` is given.
std::pair<Status, Status> read_wait(Agent& reader, PeerHandle peer,
                                    const std::vector<std::int64_t>& local,
                                    const std::vector<std::int64_t>& remote,
                                    XferHandle* keep = nullptr) {
  XferHandle xfer = 0;
  const Status posted = reader.engine->post_read(peer, 1, local, remote, &xfer);
  if (posted != Status::kSuccess) return {posted, posted};
  const auto result = wait_state(*reader.engine, xfer);
  if (keep != nullptr) {
    *keep = xfer;
  } else {
    EXPECT_EQ(reader.engine->release(xfer), Status::kSuccess);
  }
  return result;
}

// Reads local <- remote, checks every byte, and that nothing else changed.
void read_and_verify(Agent& reader, Agent& target, const std::vector<std::int64_t>& local,
                     const std::vector<std::int64_t>& remote) {
  const PeerHandle peer = reader.connect(target);
  EXPECT_EQ(read_wait(reader, peer, local, remote),
            std::make_pair(Status::kSuccess, Status::kSuccess));
  std::vector<bool> read(kBlocks, false);
  for (std::size_t i = 0; i < local.size(); ++i) {
    EXPECT_TRUE(read_in(reader, local[i], remote[i])) << i;
    read[static_cast<std::size_t>(local[i])] = true;
  }
  for (std::int64_t b = 0; b < static_cast<std::int64_t>(kBlocks); ++b) {
    if (!read[static_cast<std::size_t>(b)]) {
      EXPECT_TRUE(untouched(reader, b)) << b;
    }
  }
  EXPECT_EQ(reader.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(reader.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

bool eventually(const std::function<bool()>& done, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Shuts both engines down and expects nothing left: every reply the target
// sent from its pool, every request and wait of the reader, given back.
void expect_all_given_back(Agent& reader, Agent& target) {
  reader.engine->shutdown();
  target.engine->shutdown();
  EXPECT_EQ(reader.engine->live(), HandleCounts{});
  EXPECT_EQ(target.engine->live(), HandleCounts{});
}

// ---------------------------------------------------------------------------
// Reads that land
// ---------------------------------------------------------------------------

TEST(UcxGatherTest, RandomBlocksAreReadByteForByteInAFewMessages) {
  Agent a("gather-a", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "256K"}});
  Agent b("gather-b", kTargetGen);
  // 48 random 16 KiB blocks (768 KiB) into 48 random blocks: three requests.
  read_and_verify(a, b, shuffled(1, 48), shuffled(2, 48));
  EXPECT_EQ(a.counter("gather_reads"), 1u);
  EXPECT_EQ(a.counter("gather_messages"), 3u);
  EXPECT_EQ(a.counter("scatter_writes"), 0u);
  EXPECT_EQ(a.counter("gather_replies_ignored"), 0u);
  EXPECT_EQ(b.counter("gather_received"), 3u);
  EXPECT_EQ(b.counter("gather_rejected"), 0u);
  EXPECT_TRUE(eventually([&] { return b.engine->live().requests == 0; }));
  expect_all_given_back(a, b);
}

TEST(UcxGatherTest, RunsOfConsecutiveBlocksAreReadByteForByte) {
  Agent a("gather-a", kOwnGen);
  Agent b("gather-b", kTargetGen);
  std::vector<std::int64_t> local = range(0, 20);
  std::vector<std::int64_t> remote = range(40, 20);
  local.insert(local.end(), {33, 34, 35, 50, 63});
  remote.insert(remote.end(), {0, 1, 2, 7, 20});
  read_and_verify(a, b, local, remote);
  // The whole pool in one read: 1 MiB in chunks of just under 1 MiB.
  read_and_verify(a, b, range(0, kBlocks), range(0, kBlocks));
  EXPECT_EQ(a.counter("gather_messages"), 1u + 2u);
  expect_all_given_back(a, b);
}

TEST(UcxGatherTest, BlocksLargerThanAMessageAreSplitAcrossRequests) {
  // 4 KiB messages: every 16 KiB block takes four requests and four replies.
  Agent a("gather-a", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "4K"}});
  Agent b("gather-b", kTargetGen);
  const std::vector<std::int64_t> local = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 30, 12, 63};
  const std::vector<std::int64_t> remote = {40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 3, 17, 0};
  read_and_verify(a, b, local, remote);
  EXPECT_EQ(a.counter("gather_messages"), local.size() * 4);
  EXPECT_EQ(b.counter("gather_received"), local.size() * 4);
  expect_all_given_back(a, b);
}

TEST(UcxGatherTest, ReadsAreHandedToTheProgressThreadUnlessInline) {
  Agent b("gather-b", kTargetGen);
  Agent handed("gather-handoff", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "64K"}});
  read_and_verify(handed, b, shuffled(3), shuffled(4));
  EXPECT_EQ(handed.counter("gather_reads"), 1u);
  EXPECT_EQ(handed.counter("gather_handed_off"), 1u);
  EXPECT_EQ(handed.counter("handed_off_as_pairs"), 1u);  // scattered blocks
  // Runs are kept as runs, and the thread builds the requests from them.
  Agent runs("gather-runs", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "64K"}});
  read_and_verify(runs, b, range(8, 40), range(20, 40));
  EXPECT_EQ(runs.counter("gather_handed_off"), 1u);
  EXPECT_EQ(runs.counter("handed_off_as_pairs"), 0u);
  Agent in("gather-inline", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "64K"}, {"KVXFER_POST", "inline"}});
  read_and_verify(in, b, shuffled(5), shuffled(6));
  EXPECT_EQ(in.counter("gather_reads"), 1u);
  EXPECT_EQ(in.counter("gather_handed_off"), 0u);
  EXPECT_EQ(b.counter("gather_received"), 2u * 16u + 10u);
}

// ---------------------------------------------------------------------------
// Reads the target refuses
// ---------------------------------------------------------------------------

// Two registrations of one target: once the newer one was served (its fence
// is in), a read on the older one is refused by the target's fence, fails as
// canceled, and writes nothing into our pool.
TEST(UcxGatherTest, AReadOnAnOlderRegistrationIsFencedAndWritesNothing) {
  Agent a("gather-a", kOwnGen);
  Agent b("gather-b", kTargetGen);
  const PeerHandle old_peer = a.connect(b);
  const PeerHandle new_peer = a.connect(b);
  EXPECT_EQ(read_wait(a, new_peer, {0, 1}, {10, 11}),
            std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_TRUE(read_in(a, 0, 10) && read_in(a, 1, 11));

  XferHandle stale = 0;
  EXPECT_EQ(read_wait(a, old_peer, {20, 21, 22}, {5, 6, 7}, &stale),
            std::make_pair(Status::kSuccess, Status::kCanceled));
  EXPECT_STREQ(a.engine->detail(stale), ucs_status_string(UCS_ERR_CANCELED));
  EXPECT_EQ(a.engine->release(stale), Status::kSuccess);
  EXPECT_TRUE(untouched(a, 20) && untouched(a, 21) && untouched(a, 22));
  EXPECT_EQ(b.counter("gather_fenced"), 1u);
  EXPECT_EQ(b.counter("gather_rejected"), 1u);
  EXPECT_EQ(a.engine->disconnect(old_peer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(new_peer), Status::kSuccess);
  expect_all_given_back(a, b);
}

// A read that carries another engine's token (metadata of an earlier engine
// in the same process, or forged) is refused and writes nothing.
TEST(UcxGatherTest, AReadForAnotherEngineIsRefusedAndWritesNothing) {
  Agent a("gather-a", kOwnGen);
  Agent b("gather-b", kTargetGen);
  const std::vector<std::uint8_t> good = b.engine->local_blob();
  internal::ucx::Blob blob;
  ASSERT_TRUE(internal::ucx::decode_blob(good, &blob));
  blob.cookie_epoch ^= 1;
  const std::vector<std::uint8_t> forged = internal::ucx::encode_blob(blob);
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(forged, b.region(), &peer), Status::kSuccess);
  XferHandle xfer = 0;
  const auto [check, state] = read_wait(a, peer, {3, 4}, {8, 9}, &xfer);
  EXPECT_EQ(check, Status::kRemoteDisconnect) << status_name(check) << ' ' << status_name(state);
  EXPECT_STREQ(a.engine->detail(xfer), ucs_status_string(UCS_ERR_REJECTED));
  EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  EXPECT_TRUE(untouched(a, 3) && untouched(a, 4));
  EXPECT_EQ(b.counter("gather_rejected"), 1u);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  expect_all_given_back(a, b);
}

// ---------------------------------------------------------------------------
// Reads ended early take no byte afterwards
// ---------------------------------------------------------------------------

TEST(UcxGatherTest, DisconnectEndsReadsInFlightAndNothingLandsAfterward) {
  for (const char* post : {"handoff", "inline"}) {
    SCOPED_TRACE(post);
    Agent a("gather-a", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "4K"}, {"KVXFER_POST", post}});
    Agent b("gather-b", kTargetGen);
    const PeerHandle peer = a.connect(b);
    // Eight reads of eight blocks each into disjoint blocks of ours: 32
    // requests each.
    std::vector<XferHandle> xfers;
    std::vector<std::vector<std::int64_t>> remotes;
    for (int r = 0; r < 8; ++r) {
      XferHandle xfer = 0;
      remotes.push_back(shuffled(10 + static_cast<std::uint64_t>(r), 8));
      ASSERT_EQ(a.engine->post_read(peer, static_cast<TransferId>(r + 1), range(8 * r, 8),
                                    remotes.back(), &xfer),
                Status::kSuccess);
      xfers.push_back(xfer);
    }
    EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
    const std::vector<std::uint8_t> at_disconnect = snapshot(a);
    for (std::size_t r = 0; r < xfers.size(); ++r) {
      Status state = Status::kInProgress;
      EXPECT_EQ(a.engine->check(xfers[r], &state), Status::kSuccess);
      // Read whole before the close, or canceled by it; never left in progress.
      EXPECT_TRUE(state == Status::kSuccess || state == Status::kCanceled) << status_name(state);
      if (state == Status::kSuccess) {
        for (std::size_t i = 0; i < 8; ++i) {
          EXPECT_TRUE(read_in(a, static_cast<std::int64_t>(8 * r + i), remotes[r][i])) << r;
        }
      }
      EXPECT_EQ(a.engine->release(xfers[r]), Status::kSuccess);
    }
    EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
    // The target may still be answering: nothing of it lands any more.
    EXPECT_TRUE(eventually([&] { return b.engine->live().requests == 0; }));
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(bytes_equal(snapshot(a).data(), at_disconnect.data(), at_disconnect.size()));
    expect_all_given_back(a, b);
  }
}

TEST(UcxGatherTest, ReleaseOfAReadInFlightDropsItsLateReplies) {
  for (const char* post : {"handoff", "inline"}) {
    SCOPED_TRACE(post);
    Agent a("gather-a", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "4K"}, {"KVXFER_POST", post}});
    Agent b("gather-b", kTargetGen);
    const PeerHandle peer = a.connect(b);
    // The whole pool in 256 requests, released at once.
    XferHandle xfer = 0;
    ASSERT_EQ(a.engine->post_read(peer, 1, range(0, kBlocks), shuffled(7), &xfer),
              Status::kSuccess);
    ASSERT_EQ(a.engine->release(xfer), Status::kSuccess);
    const std::vector<std::uint8_t> at_release = snapshot(a);
    if (std::string(post) == "inline") {
      // All 256 requests left before the release.
      EXPECT_TRUE(eventually([&] { return b.counter("gather_received") == 256u; }));
    }
    // Every request that left was answered and every wait and send of ours
    // ended.
    EXPECT_TRUE(eventually(
        [&] { return a.engine->live().requests == 0 && b.engine->live().requests == 0; }));
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(bytes_equal(snapshot(a).data(), at_release.data(), at_release.size()));
    if (std::string(post) == "inline") {
      // The replies that came after the release were dropped.
      EXPECT_GT(a.counter("gather_replies_ignored"), 0u);
    }
    // The peer still reads normally.
    EXPECT_EQ(read_wait(a, peer, {5}, {6}), std::make_pair(Status::kSuccess, Status::kSuccess));
    EXPECT_TRUE(read_in(a, 5, 6));
    EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
    EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
    expect_all_given_back(a, b);
  }
}

// A target that goes away (its engine shut down, its connections closed)
// with reads in flight: each read ends, done or failed as the peer gone, the
// target gives back every reply it was sending from its pool, and nothing
// lands in ours afterwards.
TEST(UcxGatherTest, ATargetGoingAwayEndsReadsInFlight) {
  Agent a("gather-a", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "4K"}});
  Agent b("gather-b", kTargetGen);
  const PeerHandle peer = a.connect(b);
  std::vector<XferHandle> xfers;
  for (int r = 0; r < 8; ++r) {
    XferHandle xfer = 0;
    ASSERT_EQ(a.engine->post_read(peer, static_cast<TransferId>(r + 1), range(8 * r, 8),
                                  shuffled(20 + static_cast<std::uint64_t>(r), 8), &xfer),
              Status::kSuccess);
    xfers.push_back(xfer);
  }
  b.engine->shutdown();
  EXPECT_EQ(b.engine->live(), HandleCounts{});
  for (const XferHandle xfer : xfers) {
    const auto [check, state] = wait_state(*a.engine, xfer);
    EXPECT_TRUE(check == Status::kRemoteDisconnect ||
                (check == Status::kSuccess && state != Status::kInProgress))
        << status_name(check) << ' ' << status_name(state);
  }
  const std::vector<std::uint8_t> ended = snapshot(a);
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(bytes_equal(snapshot(a).data(), ended.data(), ended.size()));
  for (const XferHandle xfer : xfers) EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// ---------------------------------------------------------------------------
// Hostile peers
// ---------------------------------------------------------------------------

namespace ucx = internal::ucx;

// A target that takes fences and gather requests and answers only what the
// test tells it to, through the endpoint each request came by.
class RawGatherTarget {
 public:
  struct Request {
    std::vector<std::uint8_t> header;
    ucp_ep_h reply_ep = nullptr;
  };

  explicit RawGatherTarget(std::uint64_t token) : token_(token) {
    raw_.set_handler(ucx::kGatherAmId, &RawGatherTarget::on_request, this);
    raw_.set_handler(ucx::kFenceAmId, &RawGatherTarget::on_fence, this);
  }
  RawWorker& raw() { return raw_; }
  [[nodiscard]] std::vector<std::uint8_t> blob(
      std::uint16_t flags = ucx::kBlobAcceptsScatter | ucx::kBlobAcceptsGather) const {
    ucx::Blob b;
    b.flags = flags;
    b.cookie_epoch = token_;
    b.worker_address = raw_.address();
    return ucx::encode_blob(b);
  }
  [[nodiscard]] const std::vector<Request>& requests() const { return requests_; }

  ucs_status_t reply(const Request& to, const ucx::GatherReply& r,
                     const std::vector<std::uint8_t>& payload) {
    std::vector<std::uint8_t> header(ucx::kGatherReplyLen);
    ucx::encode_gather_reply(header.data(), r);
    return raw_.send(to.reply_ep, ucx::kGatherReplyAmId, header, payload, UCP_AM_SEND_FLAG_REPLY);
  }

 private:
  static ucs_status_t on_request(void* arg, const void* header, std::size_t header_length, void*,
                                 std::size_t, const ucp_am_recv_param_t* param) {
    Request r;
    const auto* bytes = static_cast<const std::uint8_t*>(header);
    r.header.assign(bytes, bytes + header_length);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) r.reply_ep = param->reply_ep;
    static_cast<RawGatherTarget*>(arg)->requests_.push_back(std::move(r));
    return UCS_OK;
  }
  static ucs_status_t on_fence(void*, const void*, std::size_t, void*, std::size_t,
                               const ucp_am_recv_param_t*) {
    return UCS_OK;
  }

  RawWorker raw_;
  std::uint64_t token_;
  std::vector<Request> requests_;
};

// A peer whose blob does not say it answers gather requests (an older
// kvxfer) is never sent one: the read is refused at post.
TEST(UcxGatherTest, APeerThatServesNoReadsIsNotSupported) {
  Agent a("gather-a", kOwnGen);
  RawGatherTarget target(0x7777);
  const internal::RemoteRegion region{"raw-target", 0x100000, kBlocks, kBlockLen, 0, ""};
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(target.blob(ucx::kBlobAcceptsScatter), region, &peer),
            Status::kSuccess);
  XferHandle xfer = 0;
  EXPECT_EQ(a.engine->post_read(peer, 1, std::vector<std::int64_t>{5}, std::vector<std::int64_t>{7},
                                &xfer),
            Status::kNotSupported);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// Only an exact answer, from the peer the read went to, lands: replies from
// another endpoint, naming another sequence or chunk, of the wrong length,
// with a header that disagrees with its bytes, malformed, or repeated are
// dropped and counted, and write nothing.
TEST(UcxGatherTest, OnlyTheReadPeersExactReplyLands) {
  Agent a("gather-a", kOwnGen);
  RawGatherTarget target(0x7777);
  const internal::RemoteRegion region{"raw-target", 0x100000, kBlocks, kBlockLen, 0, ""};
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(target.blob(), region, &peer), Status::kSuccess);
  XferHandle xfer = 0;
  ASSERT_EQ(a.engine->post_read(peer, 1, std::vector<std::int64_t>{5}, std::vector<std::int64_t>{7},
                                &xfer),
            Status::kSuccess);
  ASSERT_TRUE(target.raw().progress_until([&] { return target.requests().size() == 1; }));
  const RawGatherTarget::Request req = target.requests()[0];
  ucx::GatherRequest request;
  ASSERT_TRUE(ucx::decode_gather_request(req.header, &request));
  EXPECT_EQ(request.token, 0x7777u);
  EXPECT_EQ(request.chunk, 0u);
  ASSERT_EQ(request.run_count(), 1u);
  EXPECT_EQ(request.run(0).offset, 7 * kBlockLen);
  EXPECT_EQ(request.run(0).length, kBlockLen);

  const std::vector<std::uint8_t> hostile(kBlockLen, 0xEE);
  const ucx::GatherReply exact{request.slot, 0, request.sequence, 0, kBlockLen};
  std::uint64_t ignored = 0;
  const auto dropped = [&](const char* what) {
    ++ignored;
    EXPECT_TRUE(eventually([&] { return a.counter("gather_replies_ignored") == ignored; })) << what;
    Status state = Status::kSuccess;
    EXPECT_EQ(a.engine->check(xfer, &state), Status::kSuccess) << what;
    EXPECT_EQ(state, Status::kInProgress) << what;
    EXPECT_TRUE(untouched(a, 5)) << what;
  };

  // Another process that learned slot and sequence, through its own endpoint.
  {
    ucx::Blob our;
    const std::vector<std::uint8_t> our_blob = a.engine->local_blob();
    ASSERT_TRUE(ucx::decode_blob(our_blob, &our));
    RawWorker intruder;
    const ucp_ep_h ep = intruder.connect(our.worker_address);
    std::vector<std::uint8_t> header(ucx::kGatherReplyLen);
    ucx::encode_gather_reply(header.data(), exact);
    EXPECT_EQ(intruder.send(ep, ucx::kGatherReplyAmId, header, hostile, UCP_AM_SEND_FLAG_REPLY),
              UCS_OK);
    dropped("another endpoint");
  }
  auto other_sequence = exact;
  other_sequence.sequence ^= 1;
  EXPECT_EQ(target.reply(req, other_sequence, hostile), UCS_OK);
  dropped("another sequence");
  auto other_chunk = exact;
  other_chunk.chunk = 1;
  EXPECT_EQ(target.reply(req, other_chunk, hostile), UCS_OK);
  dropped("a chunk the read does not have");
  auto short_reply = exact;
  short_reply.length = kBlockLen / 2;
  EXPECT_EQ(target.reply(req, short_reply, std::vector<std::uint8_t>(kBlockLen / 2, 0xEE)), UCS_OK);
  dropped("fewer bytes than the chunk asked for");
  EXPECT_EQ(target.reply(req, exact, std::vector<std::uint8_t>(kBlockLen + 1, 0xEE)), UCS_OK);
  dropped("more bytes than the header says");
  {
    std::vector<std::uint8_t> header(ucx::kGatherReplyLen);
    ucx::encode_gather_reply(header.data(), exact);
    header[6] = 1;  // a reserved field
    EXPECT_EQ(target.raw().send(req.reply_ep, ucx::kGatherReplyAmId, header, hostile,
                                UCP_AM_SEND_FLAG_REPLY),
              UCS_OK);
    dropped("malformed");
  }

  // The exact reply lands and ends the read.
  std::vector<std::uint8_t> good(kBlockLen);
  fill_block(good.data(), kBlockLen, kTargetGen, 7);
  EXPECT_EQ(target.reply(req, exact, good), UCS_OK);
  const auto [check, state] = wait_state(*a.engine, xfer);
  EXPECT_EQ(check, Status::kSuccess);
  EXPECT_EQ(state, Status::kSuccess);
  EXPECT_TRUE(read_in(a, 5, 7));
  // Repeated after the end: dropped, nothing written.
  EXPECT_EQ(target.reply(req, exact, hostile), UCS_OK);
  ++ignored;
  EXPECT_TRUE(eventually([&] { return a.counter("gather_replies_ignored") == ignored; }));
  EXPECT_TRUE(read_in(a, 5, 7));
  EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// A refusal from the peer fails the read at once; a reply with bytes that
// comes for it afterwards is dropped.
TEST(UcxGatherTest, ARefusedChunkFailsTheReadAndLaterRepliesAreDropped) {
  Agent a("gather-a", kOwnGen, {{"KVXFER_SCATTER_CHUNK", "4K"}});
  RawGatherTarget target(0x7777);
  const internal::RemoteRegion region{"raw-target", 0x100000, kBlocks, kBlockLen, 0, ""};
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(target.blob(), region, &peer), Status::kSuccess);
  XferHandle xfer = 0;
  ASSERT_EQ(a.engine->post_read(peer, 1, std::vector<std::int64_t>{9}, std::vector<std::int64_t>{3},
                                &xfer),
            Status::kSuccess);
  ASSERT_TRUE(target.raw().progress_until([&] { return target.requests().size() == 4; }));
  const std::vector<RawGatherTarget::Request> raw = target.requests();
  std::vector<ucx::GatherRequest> requests(4);
  for (std::size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(ucx::decode_gather_request(raw[i].header, &requests[i]));
    EXPECT_EQ(requests[i].chunk, i);
  }
  const std::vector<std::uint8_t> bytes(4096, 0xEE);
  EXPECT_EQ(target.reply(raw[2],
                         {requests[2].slot, 2, requests[2].sequence,
                          static_cast<std::int32_t>(UCS_ERR_INVALID_PARAM), 0},
                         {}),
            UCS_OK);
  const auto [check, state] = wait_state(*a.engine, xfer);
  EXPECT_EQ(check, Status::kSuccess);
  EXPECT_EQ(state, Status::kBackend);
  EXPECT_STREQ(a.engine->detail(xfer), ucs_status_string(UCS_ERR_INVALID_PARAM));
  EXPECT_EQ(target.reply(raw[0], {requests[0].slot, 0, requests[0].sequence, 0, 4096}, bytes),
            UCS_OK);
  EXPECT_TRUE(eventually([&] { return a.counter("gather_replies_ignored") == 1; }));
  EXPECT_TRUE(untouched(a, 9));
  EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// A hand-rolled initiator against the target's handler: a request is served
// only when it is for this engine, fenced, and inside the region; every
// refusal is answered with a status and no bytes, and a request too broken to
// name its read is dropped.
TEST(UcxGatherTest, TargetServesOnlyFencedRequestsInsideItsRegion) {
  Agent b("gather-b", kTargetGen);
  ucx::Blob blob;
  const std::vector<std::uint8_t> blob_bytes = b.engine->local_blob();
  ASSERT_TRUE(ucx::decode_blob(blob_bytes, &blob));
  struct Reply {
    ucx::GatherReply header;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<Reply> replies;
  RawWorker client;
  client.set_handler(
      ucx::kGatherReplyAmId,
      [](void* arg, const void* header, std::size_t header_length, void* data, std::size_t length,
         const ucp_am_recv_param_t*) -> ucs_status_t {
        Reply r;
        if (ucx::decode_gather_reply({static_cast<const std::uint8_t*>(header), header_length},
                                     &r.header)) {
          const auto* d = static_cast<const std::uint8_t*>(data);
          r.bytes.assign(d, d + length);
          static_cast<std::vector<Reply>*>(arg)->push_back(std::move(r));
        }
        return UCS_OK;
      },
      &replies);
  const ucp_ep_h ep = client.connect(blob.worker_address);
  constexpr std::uint64_t kLineage = 0x1111222233334444ull;
  constexpr std::uint64_t kEpoch = 0x5555666677778888ull;
  std::vector<std::uint8_t> fence(ucx::kFenceLen);
  ucx::encode_fence(fence.data(), ucx::Fence{blob.cookie_epoch, kLineage, 1, kEpoch});
  ASSERT_EQ(client.send(ep, ucx::kFenceAmId, fence, {}, 0), UCS_OK);

  const std::uint64_t region = kBlocks * kBlockLen;
  std::uint64_t sequence = 100;
  // Sends one request; the reply to it, if one comes within `wait`.
  const auto ask = [&](const std::vector<ucx::GatherRun>& runs, std::uint64_t token,
                       std::uint64_t epoch, const std::vector<std::uint8_t>& payload = {},
                       std::uint16_t version = ucx::kGatherVersion,
                       std::chrono::milliseconds wait = 10s) -> std::optional<Reply> {
    ++sequence;
    std::vector<std::uint8_t> h(ucx::gather_request_len(runs.size()));
    ucx::put_gather_fixed(h.data(), static_cast<std::uint16_t>(runs.size()), token, sequence, 7, 2,
                          kLineage, epoch);
    for (std::size_t i = 0; i < runs.size(); ++i) {
      ucx::put_gather_run(h.data(), i, runs[i].offset, runs[i].length);
    }
    wire::store_le(h.data() + 4, version);
    EXPECT_EQ(client.send(ep, ucx::kGatherAmId, h, payload, UCP_AM_SEND_FLAG_REPLY), UCS_OK);
    std::optional<Reply> out;
    client.progress_until(
        [&] {
          for (const Reply& r : replies) {
            if (r.header.sequence == sequence) out = r;
          }
          return out.has_value();
        },
        wait);
    return out;
  };
  const auto refused = [&](const std::optional<Reply>& r, ucs_status_t want, const char* what) {
    ASSERT_TRUE(r.has_value()) << what;
    EXPECT_EQ(r->header.status, static_cast<std::int32_t>(want)) << what;
    EXPECT_EQ(r->header.length, 0u) << what;
    EXPECT_TRUE(r->bytes.empty()) << what;
    EXPECT_EQ(r->header.slot, 7u) << what;
    EXPECT_EQ(r->header.chunk, 2u) << what;
  };
  const std::uint64_t token = blob.cookie_epoch;
  refused(ask({{region - 2048, 4096}}, token, kEpoch), UCS_ERR_INVALID_PARAM, "past the end");
  refused(ask({{~std::uint64_t{0} - 100, 4096}}, token, kEpoch), UCS_ERR_INVALID_PARAM, "wraps");
  refused(ask({{0, 0}}, token, kEpoch), UCS_ERR_INVALID_PARAM, "empty run");
  refused(ask({{0, 4096}}, token ^ 1, kEpoch), UCS_ERR_REJECTED, "another engine's token");
  refused(ask({{0, 4096}}, token, kEpoch ^ 1), UCS_ERR_CANCELED, "not the fenced epoch");
  refused(ask({{0, 4096}}, token, kEpoch, std::vector<std::uint8_t>(64, 1)), UCS_ERR_UNSUPPORTED,
          "a request with a payload");
  refused(ask({{0, 4096}}, token, kEpoch, {}, 2), UCS_ERR_INVALID_PARAM, "another version");
  // Too short to name a read: dropped without an answer.
  ++sequence;
  EXPECT_EQ(client.send(ep, ucx::kGatherAmId, std::vector<std::uint8_t>(20, 0), {},
                        UCP_AM_SEND_FLAG_REPLY),
            UCS_OK);
  EXPECT_TRUE(eventually([&] { return b.counter("gather_rejected") == 8u; }));
  EXPECT_EQ(b.counter("gather_fenced"), 1u);

  // The same client, fenced and in bounds, is served the runs' bytes in order.
  const auto served = ask({{3 * kBlockLen + 100, 5000}, {kBlockLen, 4096}}, token, kEpoch);
  ASSERT_TRUE(served.has_value());
  EXPECT_EQ(served->header.status, 0);
  ASSERT_EQ(served->header.length, 9096u);
  ASSERT_EQ(served->bytes.size(), 9096u);
  EXPECT_EQ(std::memcmp(served->bytes.data(), b.pool.block(3) + 100, 5000), 0);
  EXPECT_EQ(std::memcmp(served->bytes.data() + 5000, b.pool.block(1), 4096), 0);
  EXPECT_EQ(b.counter("gather_received"), 9u);
  EXPECT_TRUE(eventually([&] { return b.engine->live().requests == 0; }));
}

}  // namespace
}  // namespace kvxfer::it
