// SPDX-License-Identifier: Apache-2.0
// The UCX lane against stale and hostile peers, over TCP in this process:
// - fencing: once a newer registration of a target wrote, nothing an older
//   registration sent is applied or delivered (wire/fence.h), writes and
//   notifications alike;
// - no raw-address writes: without an RDMA device, a UCP client with RMA
//   cannot put outside (or into) the target's pool;
// - acks: a peer cannot complete another peer's write;
// - the reason of a failed write (the UCX status) reaches the fault cause.
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "engine_agent.h"
#include "engines/ucx/ucx_compat.h"
#include "it_support.h"
#include "kvxfer/transport.h"
#include "raw_ucp.h"
#include "wire/fence.h"
#include "wire/metadata.h"
#include "wire/scatter.h"
#include "wire/ucx_blob.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using internal::PeerHandle;
using internal::XferHandle;
namespace ucx = internal::ucx;

constexpr std::uint64_t kBlocks = 64;
constexpr std::uint64_t kBlockLen = 16 * 1024;

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
};

// Whether block `remote` of `agent` holds the pattern of block `local` of
// generation `gen`.
bool holds(const Agent& agent, std::uint64_t remote, std::uint64_t gen, std::uint64_t local) {
  return first_mismatch(agent.pool.block(remote), kBlockLen, gen, local) < 0;
}

// Posts local -> remote on `peer` and waits for the transfer's end.
std::pair<Status, Status> write_wait(Agent& src, PeerHandle peer, std::vector<std::int64_t> local,
                                     std::vector<std::int64_t> remote, XferHandle* out = nullptr) {
  XferHandle xfer = 0;
  const Status posted = src.engine->post_write(peer, 1, local, remote, &xfer);
  if (posted != Status::kSuccess) return {posted, posted};
  const auto result = wait_state(*src.engine, xfer);
  if (out != nullptr) {
    *out = xfer;
  } else {
    EXPECT_EQ(src.engine->release(xfer), Status::kSuccess);
  }
  return result;
}

// ---------------------------------------------------------------------------
// Fencing
// ---------------------------------------------------------------------------

// Two registrations of one target by one initiator lane. Once a write of the
// newer one was acked (so its fence is in), a write on the older endpoint,
// which is what bytes still queued in an old connection look like to the
// target, is refused: nothing written, counted, the transfer canceled.
TEST(UcxFenceTest, OlderRegistrationIsFencedOnceTheNewerOneWrote) {
  Agent a("fence-a", 1);
  Agent b("fence-b", 2);
  PeerHandle old_peer = 0;
  PeerHandle new_peer = 0;
  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &old_peer), Status::kSuccess);
  EXPECT_EQ(write_wait(a, old_peer, {0, 1}, {0, 1}),
            std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_TRUE(holds(b, 0, 1, 0) && holds(b, 1, 1, 1));

  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &new_peer), Status::kSuccess);
  EXPECT_EQ(write_wait(a, new_peer, {2, 3}, {2, 3}),
            std::make_pair(Status::kSuccess, Status::kSuccess));

  XferHandle stale = 0;
  EXPECT_EQ(write_wait(a, old_peer, {10, 11}, {5, 6}, &stale),
            std::make_pair(Status::kSuccess, Status::kCanceled));
  EXPECT_STREQ(a.engine->detail(stale), ucs_status_string(UCS_ERR_CANCELED));
  EXPECT_EQ(a.engine->release(stale), Status::kSuccess);
  EXPECT_TRUE(holds(b, 5, 2, 5) && holds(b, 6, 2, 6)) << "a stale registration's write landed";
  EXPECT_EQ(b.counter("scatter_fenced"), 1u);
  EXPECT_EQ(b.counter("fences_received"), 2u);

  // The newer registration still writes.
  EXPECT_EQ(write_wait(a, new_peer, {12, 13}, {7, 8}),
            std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_TRUE(holds(b, 7, 1, 12) && holds(b, 8, 1, 13));
  EXPECT_EQ(a.engine->disconnect(old_peer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(new_peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// Sends `message` alone on `peer` and waits for the transfer's end.
std::pair<Status, Status> notify_wait(Agent& src, PeerHandle peer, const std::string& message) {
  XferHandle xfer = 0;
  const std::vector<std::uint8_t> bytes(message.begin(), message.end());
  const Status posted = src.engine->post_notify(peer, 1, bytes, &xfer);
  if (posted != Status::kSuccess) return {posted, posted};
  const auto result = wait_state(*src.engine, xfer);
  EXPECT_EQ(src.engine->release(xfer), Status::kSuccess);
  return result;
}

// The messages the target took, as "agent:text".
std::vector<std::string> taken(Agent& target) {
  std::vector<internal::Notification> notes;
  target.engine->take_notifications(&notes);
  std::vector<std::string> out;
  for (const auto& n : notes)
    out.push_back(n.agent + ':' + std::string(n.bytes.begin(), n.bytes.end()));
  return out;
}

// Notifications are fenced like writes: once a newer registration wrote,
// a notification sent on the older endpoint (alone, or after a write of
// its own) is refused and never queued, while the newer one's arrive.
TEST(UcxFenceTest, AnOlderRegistrationsNotificationIsRefusedOnceTheNewerOneWrote) {
  Agent a("fence-a", 1);
  Agent b("fence-b", 2);
  PeerHandle old_peer = 0;
  PeerHandle new_peer = 0;
  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &old_peer), Status::kSuccess);
  EXPECT_EQ(notify_wait(a, old_peer, "old"), std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_EQ(taken(b), std::vector<std::string>{"fence-a:old"});

  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &new_peer), Status::kSuccess);
  EXPECT_EQ(write_wait(a, new_peer, {2}, {2}), std::make_pair(Status::kSuccess, Status::kSuccess));

  EXPECT_EQ(notify_wait(a, old_peer, "stale"), std::make_pair(Status::kSuccess, Status::kCanceled));
  XferHandle stale_write = 0;
  const std::string note = "stale write";
  const std::vector<std::uint8_t> note_bytes(note.begin(), note.end());
  const std::vector<std::int64_t> local{10};
  const std::vector<std::int64_t> remote{5};
  ASSERT_EQ(a.engine->post_write(old_peer, 2, local, remote, &stale_write, note_bytes),
            Status::kSuccess);
  EXPECT_EQ(wait_state(*a.engine, stale_write),
            std::make_pair(Status::kSuccess, Status::kCanceled));
  EXPECT_EQ(a.engine->release(stale_write), Status::kSuccess);
  EXPECT_TRUE(holds(b, 5, 2, 5)) << "a stale registration's write landed";

  EXPECT_EQ(notify_wait(a, new_peer, "new"), std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_EQ(taken(b), std::vector<std::string>{"fence-a:new"});
  EXPECT_EQ(b.counter("notifications_received"), 2u);
  EXPECT_EQ(b.counter("notifications_refused"), 1u);  // the write's was never sent
  EXPECT_EQ(a.engine->disconnect(old_peer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(new_peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// Each target gets its own lineage from an initiator, and every
// registration a fresh epoch: what one target sees tells it nothing usable
// against another.
TEST(UcxFenceTest, FencesCarryAFreshEpochPerRegistrationAndALineagePerTarget) {
  Agent a("fence-a", 1);
  RawTarget t1(0x1111);
  RawTarget t2(0x2222);
  internal::RemoteRegion region{"raw-1", 0x100000, kBlocks, kBlockLen, 0, ""};
  PeerHandle p1 = 0;
  PeerHandle p2 = 0;
  PeerHandle p3 = 0;
  ASSERT_EQ(a.engine->connect(t1.blob(), region, &p1), Status::kSuccess);
  ASSERT_EQ(a.engine->connect(t1.blob(), region, &p2), Status::kSuccess);
  region.agent_name = "raw-2";
  ASSERT_EQ(a.engine->connect(t2.blob(), region, &p3), Status::kSuccess);
  ASSERT_TRUE(t1.raw().progress_until([&] { return t1.fences().size() == 2; }));
  ASSERT_TRUE(t2.raw().progress_until([&] { return t2.fences().size() == 1; }));
  const ucx::Fence& f1 = t1.fences()[0];
  const ucx::Fence& f2 = t1.fences()[1];
  const ucx::Fence& g1 = t2.fences()[0];
  EXPECT_EQ(f1.token, 0x1111u);
  EXPECT_EQ(g1.token, 0x2222u);
  EXPECT_EQ(f1.lineage, f2.lineage);
  EXPECT_EQ(f1.gen + 1, f2.gen);
  EXPECT_NE(f1.epoch, f2.epoch);
  EXPECT_NE(g1.lineage, f1.lineage);
  EXPECT_EQ(g1.gen, 1u);
  for (const PeerHandle p : {p1, p2, p3}) EXPECT_EQ(a.engine->disconnect(p), Status::kSuccess);
}

// A hand-rolled initiator with acks: what the target's handler does with
// fences and epochs, message by message.
class AckingClient {
 public:
  explicit AckingClient(const std::vector<std::uint8_t>& target_blob) {
    if (!ucx::decode_blob(target_blob, &blob_)) throw std::runtime_error("bad blob");
    raw_.set_handler(ucx::kScatterAckAmId, &AckingClient::on_ack, this);
    ep_ = raw_.connect(blob_.worker_address);
  }
  [[nodiscard]] std::uint64_t token() const { return blob_.cookie_epoch; }

  void fence(std::uint64_t lineage, std::uint64_t gen, std::uint64_t epoch,
             std::optional<std::uint64_t> token = std::nullopt) {
    std::vector<std::uint8_t> bytes(ucx::kFenceLen);
    encode_fence(bytes.data(), ucx::Fence{token.value_or(this->token()), lineage, gen, epoch});
    ASSERT_EQ(raw_.send(ep_, ucx::kFenceAmId, bytes, {}, 0), UCS_OK);
  }

  // One write of `payload` at `offset`; the ack's status, or nullopt.
  std::optional<std::int32_t> write(std::uint64_t lineage, std::uint64_t epoch,
                                    std::uint64_t offset,
                                    const std::vector<std::uint8_t>& payload) {
    const std::uint64_t sequence = ++sequence_;
    std::vector<std::uint8_t> h(ucx::scatter_header_len(1));
    ucx::put_scatter_fixed(h.data(), 1, token(), sequence, 3, lineage, epoch);
    ucx::put_scatter_run(h.data(), 0, offset, payload.size());
    if (raw_.send(ep_, ucx::kScatterAmId, h, payload, UCP_AM_SEND_FLAG_REPLY) != UCS_OK) {
      return std::nullopt;
    }
    std::optional<std::int32_t> status;
    raw_.progress_until([&] {
      for (const ucx::ScatterAck& ack : acks_) {
        if (ack.sequence == sequence) status = ack.status;
      }
      return status.has_value();
    });
    return status;
  }

 private:
  static ucs_status_t on_ack(void* arg, const void* header, std::size_t header_length, void*,
                             std::size_t, const ucp_am_recv_param_t*) {
    ucx::ScatterAck ack;
    if (ucx::decode_ack({static_cast<const std::uint8_t*>(header), header_length}, &ack)) {
      static_cast<AckingClient*>(arg)->acks_.push_back(ack);
    }
    return UCS_OK;
  }

  ucx::Blob blob_;
  RawWorker raw_;
  ucp_ep_h ep_ = nullptr;
  std::uint64_t sequence_ = 1000;
  std::vector<ucx::ScatterAck> acks_;
};

TEST(UcxFenceTest, WritesOfAStaleEpochOrUnknownLineageAreRefusedAndCounted) {
  Agent target("fence-target", 2);
  const auto blob = target.engine->local_blob();
  AckingClient client(blob);
  const std::vector<std::uint8_t> page(4096, 0xAB);
  const std::vector<std::uint8_t> other(4096, 0xCD);
  constexpr std::uint64_t kLineage = 0x77;
  constexpr std::uint64_t kOld = 0x1001;
  constexpr std::uint64_t kNew = 0x2002;
  const auto canceled = static_cast<std::int32_t>(UCS_ERR_CANCELED);

  // No fence yet: an unknown lineage is never written.
  EXPECT_EQ(client.write(kLineage, kOld, 0, page), canceled);
  client.fence(kLineage, 1, kOld);
  EXPECT_EQ(client.write(kLineage, kOld, 0, page), 0);
  EXPECT_TRUE(bytes_equal(target.pool.block(0), page.data(), page.size()));

  // A newer registration: the old epoch is refused from now on, even after
  // the old fence comes again (as one still in an old connection would).
  client.fence(kLineage, 2, kNew);
  EXPECT_EQ(client.write(kLineage, kOld, kBlockLen, other), canceled);
  client.fence(kLineage, 1, kOld);
  client.fence(kLineage, 2, kOld);  // same gen, other epoch: not newer either
  EXPECT_EQ(client.write(kLineage, kOld, kBlockLen, other), canceled);
  EXPECT_TRUE(holds(target, 1, 2, 1)) << "a fenced write landed";
  EXPECT_EQ(client.write(kLineage, kNew, kBlockLen, page), 0);
  EXPECT_TRUE(bytes_equal(target.pool.block(1), page.data(), page.size()));
  // A fence for another engine (token) changes nothing.
  client.fence(kLineage, 9, 0x3003, client.token() ^ 1);
  EXPECT_EQ(client.write(kLineage, 0x3003, 2 * kBlockLen, other), canceled);
  EXPECT_EQ(client.write(kLineage, kNew, 2 * kBlockLen, page), 0);

  EXPECT_EQ(target.counter("scatter_fenced"), 4u);
  EXPECT_EQ(target.counter("fences_received"), 5u);
  EXPECT_EQ(target.counter("fences_ignored"), 3u);
}

TEST(UcxFenceTest, TheFenceTableIsBoundedAndAnEvictedLineageIsRefused) {
  Agent target("fence-target", 2);
  AckingClient client(target.engine->local_blob());
  const std::vector<std::uint8_t> page(4096, 0xAB);
  client.fence(1, 1, 0x11);
  EXPECT_EQ(client.write(1, 0x11, 0, page), 0);
  for (std::uint64_t lineage = 2; lineage <= ucx::kMaxFences + 1; ++lineage) {
    client.fence(lineage, 1, lineage);
  }
  // Lineage 1 was the least recently fenced: gone, so refused.
  EXPECT_EQ(client.write(1, 0x11, 0, page), static_cast<std::int32_t>(UCS_ERR_CANCELED));
  EXPECT_EQ(client.write(ucx::kMaxFences + 1, ucx::kMaxFences + 1, 0, page), 0);
}

// ---------------------------------------------------------------------------
// No raw-address writes
// ---------------------------------------------------------------------------

struct PutAttempt {
  ucs_status_t unpack = UCS_OK;
  ucs_status_t put = UCS_INPROGRESS;
  ucs_status_t flush = UCS_INPROGRESS;
};

// A UCP client with RMA puts 4 KiB of 0xEE at `address` in this process
// (where `target` lives) through its own endpoint to the target's worker,
// with the target's published rkey or, when there is none, one it makes
// from its own memory.
PutAttempt raw_put(const Agent& target, std::uint64_t address) {
  PutAttempt out;
  ucx::Blob blob;
  const auto bytes = target.engine->local_blob();
  if (!ucx::decode_blob(bytes, &blob)) throw std::runtime_error("bad blob");
  RawWorker client(UCP_FEATURE_RMA | UCP_FEATURE_AM);
  ucp_ep_h ep = client.connect(blob.worker_address);
  std::vector<std::uint8_t> src(4096, 0xEE);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = src.data();
  mp.length = src.size();
  ucp_mem_h memh = nullptr;
  RawWorker::check(ucp_mem_map(client.context(), &mp, &memh), "mem_map");
  std::vector<std::uint8_t> packed(blob.rkey.begin(), blob.rkey.end());
  if (packed.empty()) {
    void* buffer = nullptr;
    std::size_t len = 0;
    RawWorker::check(internal::ucx_compat::pack_rkey(client.context(), memh, &buffer, &len),
                     "rkey_pack");
    packed.assign(static_cast<std::uint8_t*>(buffer), static_cast<std::uint8_t*>(buffer) + len);
    internal::ucx_compat::release_packed_rkey(buffer);
  }
  ucp_rkey_h rkey = nullptr;
  out.unpack = ucp_ep_rkey_unpack(ep, packed.data(), &rkey);
  if (out.unpack == UCS_OK) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
    out.put = client.wait(ucp_put_nbx(ep, src.data(), src.size(), address, rkey, &p), 1500ms);
    ucp_request_param_t fp{};
    out.flush = client.wait(ucp_ep_flush_nbx(ep, &fp), 1500ms);
    ucp_rkey_destroy(rkey);
  }
  // Whatever was sent has had time to land: the target's progress thread
  // takes messages as they come.
  client.progress_until([] { return false; }, 500ms);
  ucp_mem_unmap(client.context(), memh);
  return out;
}

TEST(UcxRawPutTest, WithoutAnRdmaDeviceAUcpPutWritesNothingOutsideOrInsideThePool) {
  Agent target("put-target", 2);
  ucx::Blob blob;
  const auto bytes = target.engine->local_blob();
  ASSERT_TRUE(ucx::decode_blob(bytes, &blob));
  EXPECT_TRUE(blob.rkey.empty()) << "no rkey may be published without RMA";
  std::vector<std::uint8_t> guard(64 * 1024, 0x5A);
  const PutAttempt outside = raw_put(target, reinterpret_cast<std::uintptr_t>(guard.data()) + 4096);
  const PutAttempt inside = raw_put(target, reinterpret_cast<std::uintptr_t>(target.pool.block(3)));
  EXPECT_TRUE(std::all_of(guard.begin(), guard.end(), [](std::uint8_t b) { return b == 0x5A; }))
      << "a raw put wrote outside the pool";
  EXPECT_TRUE(holds(target, 3, 2, 3)) << "a raw put wrote into the pool";
  // What the client saw (UCX 1.13): recorded for docs/reliability.md.
  for (const auto& [what, a] : {std::pair{"outside", outside}, std::pair{"inside", inside}}) {
    std::printf("raw put %s: unpack=%s put=%s flush=%s\n", what, ucs_status_string(a.unpack),
                ucs_status_string(a.put), ucs_status_string(a.flush));
    // The put is never reported done: it either fails or never completes.
    EXPECT_FALSE(a.unpack == UCS_OK && a.put == UCS_OK && a.flush == UCS_OK) << what;
  }
  // The target still works for honest writers.
  Agent a("put-a", 1);
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(bytes, target.region(), &peer), Status::kSuccess);
  EXPECT_EQ(write_wait(a, peer, {9}, {3}), std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_TRUE(holds(target, 3, 1, 9));
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
}

// The same attempt against a target that asked for RMA over TCP
// (KVXFER_RMA=on, the behaviour before this change everywhere): the put
// lands wherever it names. This is what the test above would see on the
// old code, and why RMA over TCP is off by default (docs/reliability.md).
TEST(UcxRawPutTest, WithRmaForcedOnOverTcpAUcpPutWritesAnywhere) {
  Agent target("put-target", 2, {{"KVXFER_RMA", "on"}});
  std::vector<std::uint8_t> guard(64 * 1024, 0x5A);
  const PutAttempt outside = raw_put(target, reinterpret_cast<std::uintptr_t>(guard.data()) + 4096);
  EXPECT_EQ(outside.flush, UCS_OK);
  EXPECT_EQ(guard[4096], 0xEE) << "the put did not land: the test above could not fail";
}

// Without RMA, writes go only as scatter messages: a peer whose blob does not
// take them (an older kvxfer, or a blob offering only an rkey) is refused at
// connect, not written with puts.
TEST(UcxRawPutTest, APeerThatTakesNoScatterWritesIsRefusedAtConnect) {
  Agent a("put-a", 1);
  Agent rma("put-rma", 2, {{"KVXFER_RMA", "on"}});
  ucx::Blob blob;
  const auto bytes = rma.engine->local_blob();
  ASSERT_TRUE(ucx::decode_blob(bytes, &blob));
  ASSERT_FALSE(blob.rkey.empty());
  blob.flags = 0;  // an rkey, but no scatter writes
  PeerHandle peer = 0;
  EXPECT_EQ(a.engine->connect(ucx::encode_blob(blob), rma.region(), &peer), Status::kNotSupported);
  RawTarget raw(0x1234);
  EXPECT_EQ(a.engine->connect(raw.blob(0), {"raw", 0x100000, kBlocks, kBlockLen, 0, ""}, &peer),
            Status::kNotSupported);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
  // With RMA on our side too, the rkey is enough: puts.
  Agent b("put-b", 1, {{"KVXFER_RMA", "on"}});
  ASSERT_EQ(b.engine->connect(ucx::encode_blob(blob), rma.region(), &peer), Status::kSuccess);
  EXPECT_EQ(write_wait(b, peer, {4}, {4}), std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_EQ(b.counter("put_writes"), 1u);
  EXPECT_TRUE(holds(rma, 4, 1, 4));
  EXPECT_EQ(b.engine->disconnect(peer), Status::kSuccess);
}

// ---------------------------------------------------------------------------
// Acks
// ---------------------------------------------------------------------------

// A writes to targets B and C (hand-rolled). C, a peer of A in its own
// right, learns nothing of B's write but is handed its slot and sequence
// here anyway, and acks it: through its own endpoint to A, and through the
// endpoint A writes to C by. Neither completes the write; B's ack does.
TEST(UcxAckTest, AnotherPeersAckCannotCompleteAWrite) {
  Agent a("ack-a", 1);
  RawTarget b(0xb0b);
  RawTarget c(0xc0c);
  internal::RemoteRegion region{"raw-b", 0x100000, kBlocks, kBlockLen, 0, ""};
  PeerHandle pb = 0;
  PeerHandle pc = 0;
  ASSERT_EQ(a.engine->connect(b.blob(), region, &pb), Status::kSuccess);
  region.agent_name = "raw-c";
  ASSERT_EQ(a.engine->connect(c.blob(), region, &pc), Status::kSuccess);

  XferHandle to_b = 0;
  XferHandle to_c = 0;
  const std::vector<std::int64_t> blocks = {0, 1, 2};
  ASSERT_EQ(a.engine->post_write(pb, 1, blocks, blocks, &to_b), Status::kSuccess);
  ASSERT_EQ(a.engine->post_write(pc, 2, blocks, blocks, &to_c), Status::kSuccess);
  ASSERT_TRUE(b.raw().progress_until([&] { return b.writes().size() == 1; }));
  ASSERT_TRUE(c.raw().progress_until([&] { return c.writes().size() == 1; }));
  const RawTarget::Write w = b.writes()[0];

  // C acks B's write (status OK) through A's endpoint to C ...
  RawTarget::Write forged = c.writes()[0];
  forged.header.slot = w.header.slot;
  forged.header.sequence = w.header.sequence;
  EXPECT_EQ(c.ack(forged, 0), UCS_OK);
  // ... and through an endpoint of its own to A, with and without REPLY.
  ucx::Blob a_blob;
  const auto a_bytes = a.engine->local_blob();
  ASSERT_TRUE(ucx::decode_blob(a_bytes, &a_blob));
  ucp_ep_h own = c.raw().connect(a_blob.worker_address);
  std::vector<std::uint8_t> ack(ucx::kAckLen);
  ucx::encode_ack(ack.data(), ucx::ScatterAck{w.header.slot, w.header.sequence, 0});
  EXPECT_EQ(c.raw().send(own, ucx::kScatterAckAmId, ack, {}, UCP_AM_SEND_FLAG_REPLY), UCS_OK);
  EXPECT_EQ(c.raw().send(own, ucx::kScatterAckAmId, ack, {}, 0), UCS_OK);
  // A failing ack from C must not fail it either.
  ucx::encode_ack(ack.data(), ucx::ScatterAck{w.header.slot, w.header.sequence,
                                              static_cast<std::int32_t>(UCS_ERR_INVALID_PARAM)});
  EXPECT_EQ(c.raw().send(own, ucx::kScatterAckAmId, ack, {}, UCP_AM_SEND_FLAG_REPLY), UCS_OK);

  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (a.counter("scatter_acks_ignored") < 4 && std::chrono::steady_clock::now() < deadline) {
    c.raw().progress_until([] { return false; }, 5ms);
  }
  EXPECT_EQ(a.counter("scatter_acks_ignored"), 4u);
  Status state = Status::kSuccess;
  ASSERT_EQ(a.engine->check(to_b, &state), Status::kSuccess);
  EXPECT_EQ(state, Status::kInProgress) << "another peer's ack ended the write";

  // B's own ack, through the endpoint the write came by, completes it.
  EXPECT_EQ(b.ack(w, 0), UCS_OK);
  EXPECT_EQ(wait_state(*a.engine, to_b), std::make_pair(Status::kSuccess, Status::kSuccess));
  EXPECT_EQ(c.ack(c.writes()[0], 0), UCS_OK);
  EXPECT_EQ(wait_state(*a.engine, to_c), std::make_pair(Status::kSuccess, Status::kSuccess));
  // Sequences are random per write, not a counter.
  EXPECT_NE(b.writes()[0].header.sequence + 1, c.writes()[0].header.sequence);
  EXPECT_EQ(a.engine->release(to_b), Status::kSuccess);
  EXPECT_EQ(a.engine->release(to_c), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(pb), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(pc), Status::kSuccess);
}

// ---------------------------------------------------------------------------
// The reason of a failure
// ---------------------------------------------------------------------------

TEST(UcxDetailTest, AFailedWriteKeepsItsUcxStatus) {
  Agent a("detail-a", 1);
  RawTarget b(0xb0b);
  PeerHandle pb = 0;
  ASSERT_EQ(a.engine->connect(b.blob(), {"raw-b", 0x100000, kBlocks, kBlockLen, 0, ""}, &pb),
            Status::kSuccess);
  XferHandle xfer = 0;
  const std::vector<std::int64_t> blocks = {0, 1, 2};
  ASSERT_EQ(a.engine->post_write(pb, 1, blocks, blocks, &xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->detail(xfer), nullptr);  // nothing to say while in flight
  ASSERT_TRUE(b.raw().progress_until([&] { return b.writes().size() == 1; }));
  EXPECT_EQ(b.ack(b.writes()[0], static_cast<std::int32_t>(UCS_ERR_INVALID_PARAM)), UCS_OK);
  EXPECT_EQ(wait_state(*a.engine, xfer), std::make_pair(Status::kSuccess, Status::kBackend));
  EXPECT_STREQ(a.engine->detail(xfer), ucs_status_string(UCS_ERR_INVALID_PARAM));
  EXPECT_EQ(a.engine->release(xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(pb), Status::kSuccess);
}

// Through the public API: the fault cause names the UCX status, not only
// BACKEND.
TEST(UcxDetailTest, TheFaultCauseNamesTheUcxStatus) {
  MappedPool pool(kBlocks, kBlockLen);
  Options options;
  options.backends = {"UCX"};
  options.engine_config = {{"TLS", "tcp"}, {"KVXFER_LANES", "ucx"}};
  options.strike_limit = 1;
  Transport init("detail-init", Region{pool.base(), kBlocks, kBlockLen}, options);
  RawTarget b(0xb0b);
  // Metadata as a kvxfer agent would publish it, with the raw target's blob.
  wire::AgentMetadata md = wire::decode(init.agent_metadata());
  md.agent_name = "raw-b";
  md.pid = 0;
  md.base_addr = 0x100000;
  md.engine_blob = b.blob();
  init.add_remote_peer("raw-b", wire::encode(md), 0x100000, kBlocks, kBlockLen);
  const std::vector<std::int64_t> blocks = {0, 1, 2};
  const auto id = init.write_blocks("raw-b", blocks, blocks);
  ASSERT_TRUE(id.has_value());
  ASSERT_TRUE(b.raw().progress_until([&] { return b.writes().size() == 1; }));
  EXPECT_EQ(b.ack(b.writes()[0], static_cast<std::int32_t>(UCS_ERR_INVALID_PARAM)), UCS_OK);
  std::optional<std::string> fault;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!fault && std::chrono::steady_clock::now() < deadline) {
    fault = init.poll("raw-b").peer_fault;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(fault.has_value());
  EXPECT_NE(fault->find("BACKEND"), std::string::npos) << *fault;
  EXPECT_NE(fault->find(ucs_status_string(UCS_ERR_INVALID_PARAM)), std::string::npos) << *fault;
}

}  // namespace
}  // namespace kvxfer::it
