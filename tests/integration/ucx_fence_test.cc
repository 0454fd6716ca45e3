// SPDX-License-Identifier: Apache-2.0
// The UCX lane against stale and hostile peers, over UCX's tcp transport
// with puts forced on (KVXFER_RMA=on), in this process:
// - fencing: once a newer registration of a target is fenced, nothing an
//   older registration sends is delivered (wire/fence.h); a fence counts
//   only on its own endpoint, names its sender, and a full table refuses
//   new lineages rather than forget one;
// - raw puts: why UCX's tcp transport serves tests only;
// - acks: a peer cannot complete another peer's notification;
// - the reason of a failure (the UCX status) reaches the fault cause;
// - the driver: no two threads are ever inside the worker.
#include <gtest/gtest.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine.h"
#include "engine_agent.h"
#include "engines/ucx/ucx_driver.h"
#include "it_support.h"
#include "kvxfer/transport.h"
#include "raw_ucp.h"
#include "wire/fence.h"
#include "wire/metadata.h"
#include "wire/notify.h"
#include "wire/peer_blob.h"

namespace kvxfer::it {
namespace {

using namespace std::chrono_literals;
using internal::PeerHandle;
using internal::XferHandle;

constexpr std::uint64_t kBlocks = 64;
constexpr std::uint64_t kBlockLen = 16 * 1024;

// The UCX lane itself, over UCX's tcp transport (the only one with puts
// here), not the tcp lane remote peers get by default.
std::map<std::string, std::string> ucx_lane(std::map<std::string, std::string> config = {}) {
  config["TLS"] = "tcp";
  config["KVXFER_LANES"] = "ucx";
  config["KVXFER_RMA"] = "on";
  return config;
}

struct Agent : EngineAgent {
  Agent(std::string agent_name, std::uint64_t gen, bool progress_thread = true)
      : EngineAgent(std::move(agent_name), ucx_lane(), kBlocks, kBlockLen, gen, progress_thread) {}
};

// Posts local -> remote on `peer` and waits for the transfer's end.
std::pair<Status, Status> write_wait(Agent& src, PeerHandle peer, std::vector<std::int64_t> local,
                                     std::vector<std::int64_t> remote) {
  XferHandle xfer = 0;
  const Status posted = src.engine->post_write(peer, 1, local, remote, &xfer);
  if (posted != Status::kSuccess) return {posted, posted};
  const auto result = wait_state(*src.engine, xfer);
  EXPECT_EQ(src.engine->release(xfer), Status::kSuccess);
  return result;
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

constexpr std::pair<Status, Status> kDone{Status::kSuccess, Status::kSuccess};
constexpr std::pair<Status, Status> kRefused{Status::kSuccess, Status::kCanceled};

// ---------------------------------------------------------------------------
// Fencing
// ---------------------------------------------------------------------------

// Two registrations of one target by one initiator lane. Once the newer
// one's fence is in, a notification on the older endpoint (alone, or after
// a write of its own) is refused and never queued; the newer one's arrive.
// (The older registration's put itself lands: puts are one-sided, and
// docs/reliability.md says what fences do and do not cover.)
TEST(UcxFenceTest, AnOlderRegistrationsNotificationIsRefusedOnceTheNewerOneIsFenced) {
  Agent a("fence-a", 1);
  Agent b("fence-b", 2);
  PeerHandle old_peer = 0;
  PeerHandle new_peer = 0;
  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &old_peer), Status::kSuccess);
  EXPECT_EQ(notify_wait(a, old_peer, "old"), kDone);
  EXPECT_EQ(taken(b), std::vector<std::string>{"fence-a:old"});

  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &new_peer), Status::kSuccess);
  EXPECT_EQ(notify_wait(a, new_peer, "new"), kDone);  // its fence came first on its endpoint
  EXPECT_EQ(write_wait(a, new_peer, {2}, {2}), kDone);

  EXPECT_EQ(notify_wait(a, old_peer, "stale"), kRefused);
  XferHandle stale = 0;
  const std::vector<std::uint8_t> note{'s', 'w'};
  const std::vector<std::int64_t> one{10};
  ASSERT_EQ(a.engine->post_write(old_peer, 2, one, one, &stale, note), Status::kSuccess);
  EXPECT_EQ(wait_state(*a.engine, stale), kRefused);
  EXPECT_EQ(a.engine->release(stale), Status::kSuccess);

  EXPECT_EQ(taken(b), std::vector<std::string>{"fence-a:new"});
  EXPECT_EQ(b.counter("ucx_notifications_received"), 2u);
  EXPECT_EQ(b.counter("ucx_notifications_refused"), 2u);
  EXPECT_EQ(b.counter("ucx_fences_received"), 2u);
  EXPECT_EQ(a.engine->disconnect(old_peer), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(new_peer), Status::kSuccess);
  EXPECT_EQ(a.engine->live(), (HandleCounts{1, 0, 0, 0, 0}));
}

// Each target gets its own lineage from an initiator, every registration a
// fresh epoch, and every fence names its sender.
TEST(UcxFenceTest, FencesCarryAFreshEpochPerRegistrationALineagePerTargetAndTheName) {
  Agent a("fence-a", 1);
  RawTarget t1(0x1111);
  RawTarget t2(0x2222);
  PeerHandle p1 = 0;
  PeerHandle p2 = 0;
  PeerHandle p3 = 0;
  ASSERT_EQ(a.engine->connect(t1.blob(), t1.region("raw-1"), &p1), Status::kSuccess);
  ASSERT_EQ(a.engine->connect(t1.blob(), t1.region("raw-1"), &p2), Status::kSuccess);
  ASSERT_EQ(a.engine->connect(t2.blob(), t2.region("raw-2"), &p3), Status::kSuccess);
  ASSERT_TRUE(t1.raw().progress_until([&] { return t1.fences().size() == 2; }));
  ASSERT_TRUE(t2.raw().progress_until([&] { return t2.fences().size() == 1; }));
  const wire::Fence& f1 = t1.fences()[0].fence;
  const wire::Fence& f2 = t1.fences()[1].fence;
  const wire::Fence& g1 = t2.fences()[0].fence;
  EXPECT_EQ(f1.token, 0x1111u);
  EXPECT_EQ(g1.token, 0x2222u);
  EXPECT_EQ(f1.lineage, f2.lineage);
  EXPECT_EQ(f1.gen + 1, f2.gen);
  EXPECT_NE(f1.epoch, f2.epoch);
  EXPECT_NE(g1.lineage, f1.lineage);
  EXPECT_EQ(g1.gen, 1u);
  EXPECT_EQ(t1.fences()[0].name, "fence-a");
  for (const PeerHandle p : {p1, p2, p3}) EXPECT_EQ(a.engine->disconnect(p), Status::kSuccess);
}

// A hand-rolled initiator: what the target's handlers do with fences and
// notifications, message by message, on endpoints of its choosing.
class RawClient {
 public:
  explicit RawClient(std::vector<std::uint8_t> target_blob) : bytes_(std::move(target_blob)) {
    if (!wire::decode_blob(bytes_, &blob_)) throw std::runtime_error("bad blob");
    raw_.set_handler(wire::kNotifyAckAmId, &RawClient::on_ack, this);
  }
  ucp_ep_h endpoint() { return raw_.connect(blob_.worker_address); }

  void fence(ucp_ep_h ep, std::uint64_t lineage, std::uint64_t gen, std::uint64_t epoch,
             const std::string& name = "raw") {
    std::vector<std::uint8_t> bytes(wire::fence_len(name.size()));
    wire::encode_fence(bytes.data(), wire::Fence{blob_.cookie_epoch, lineage, gen, epoch, name});
    ASSERT_EQ(raw_.send(ep, wire::kFenceAmId, bytes, {}, UCP_AM_SEND_FLAG_REPLY), UCS_OK);
  }

  // One notification; the ack's status, or nullopt when none came.
  std::optional<std::int32_t> note(ucp_ep_h ep, std::uint64_t lineage, std::uint64_t epoch,
                                   const std::string& text, const std::string& name = "raw") {
    const std::uint64_t sequence = ++sequence_;
    std::vector<std::uint8_t> h(wire::notify_header_len(name.size()));
    wire::encode_notify_header(h.data(),
                         wire::NotifyHeader{blob_.cookie_epoch, sequence, 3, lineage, epoch, name});
    const std::vector<std::uint8_t> payload(text.begin(), text.end());
    if (raw_.send(ep, wire::kNotifyAmId, h, payload, UCP_AM_SEND_FLAG_REPLY) != UCS_OK) {
      return std::nullopt;
    }
    std::optional<std::int32_t> status;
    raw_.progress_until(
        [&] {
          for (const wire::NotifyAck& ack : acks_) {
            if (ack.sequence == sequence) status = ack.status;
          }
          return status.has_value();
        },
        2s);
    return status;
  }

 private:
  static ucs_status_t on_ack(void* arg, const void* header, std::size_t header_length, void*,
                             std::size_t, const ucp_am_recv_param_t*) {
    wire::NotifyAck ack;
    if (wire::decode_ack({static_cast<const std::uint8_t*>(header), header_length}, &ack)) {
      static_cast<RawClient*>(arg)->acks_.push_back(ack);
    }
    return UCS_OK;
  }

  std::vector<std::uint8_t> bytes_;  // what blob_ views
  wire::PeerBlob blob_;
  RawWorker raw_;
  std::uint64_t sequence_ = 1000;
  std::vector<wire::NotifyAck> acks_;
};

constexpr std::int32_t kOk = UCS_OK;
constexpr std::int32_t kCanceled = UCS_ERR_CANCELED;

TEST(UcxFenceTest, NotificationsOfAStaleEpochAnUnknownLineageOrAnotherEndpointAreRefused) {
  Agent b("fence-b", 2);
  RawClient c(b.engine->local_blob());
  ucp_ep_h ep1 = c.endpoint();
  ucp_ep_h ep2 = c.endpoint();
  c.fence(ep1, 77, 1, 0xe1);
  // Taken, under the fence's name: the header's own name is only a label.
  EXPECT_EQ(c.note(ep1, 77, 0xe1, "one", "mallory"), kOk);
  EXPECT_EQ(taken(b), std::vector<std::string>{"raw:one"});
  EXPECT_EQ(c.note(ep1, 77, 0xe2, "bad epoch"), kCanceled);
  EXPECT_EQ(c.note(ep1, 78, 0xe1, "unknown lineage"), kCanceled);
  // The right lineage and epoch on another endpoint: not that fence's.
  EXPECT_EQ(c.note(ep2, 77, 0xe1, "other endpoint"), kCanceled);
  // A fence that is not newer does not move the lineage to ep2 ...
  c.fence(ep2, 77, 1, 0xe2);
  EXPECT_EQ(c.note(ep2, 77, 0xe2, "stale fence"), kCanceled);
  EXPECT_EQ(c.note(ep1, 77, 0xe1, "two"), kOk);
  // ... a newer one does, and the older endpoint is fenced off.
  c.fence(ep2, 77, 2, 0xe3, "raw-2");
  EXPECT_EQ(c.note(ep2, 77, 0xe3, "three"), kOk);
  EXPECT_EQ(c.note(ep1, 77, 0xe1, "fenced off"), kCanceled);
  EXPECT_EQ(taken(b), (std::vector<std::string>{"raw:two", "raw-2:three"}));
  EXPECT_EQ(b.counter("ucx_fences_received"), 3u);
  EXPECT_EQ(b.counter("ucx_fences_refused"), 1u);
  EXPECT_EQ(b.counter("ucx_notifications_refused"), 5u);
}

// wire::kMaxFences lineages fill the table; the next new lineage is refused, and
// none of those in it is forgotten to make room.
TEST(UcxFenceTest, AFullFenceTableRefusesNewLineagesAndForgetsNoneThatTalk) {
  Agent b("fence-b", 2);
  RawClient c(b.engine->local_blob());
  ucp_ep_h ep = c.endpoint();
  for (std::uint64_t lineage = 1; lineage <= wire::kMaxFences + 1; ++lineage) {
    c.fence(ep, lineage, 1, 0x100 + lineage);
  }
  EXPECT_EQ(c.note(ep, wire::kMaxFences + 1, 0x101 + wire::kMaxFences, "late"), kCanceled);
  EXPECT_EQ(c.note(ep, 1, 0x101, "first"), kOk);
  EXPECT_EQ(c.note(ep, wire::kMaxFences, 0x100 + wire::kMaxFences, "last"), kOk);
  EXPECT_EQ(b.counter("ucx_fences_refused"), 1u);
  EXPECT_EQ(taken(b), (std::vector<std::string>{"raw:first", "raw:last"}));
}

// A notification alone posted right after a write with one goes out only
// after that write's flush too: the target takes them in posting order.
TEST(UcxFenceTest, ANotificationAloneDoesNotOvertakeAnEarlierWritesNotification) {
  Agent a("order-a", 1);
  Agent b("order-b", 2);
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &peer), Status::kSuccess);
  std::vector<std::string> expected;
  for (int i = 0; i < 50; ++i) {
    const std::string w = "w" + std::to_string(i);
    const std::string n = "n" + std::to_string(i);
    const std::vector<std::uint8_t> wb(w.begin(), w.end());
    const std::vector<std::uint8_t> nb(n.begin(), n.end());
    const std::vector<std::int64_t> blocks{0, 1, 2, 3, 4, 5, 6, 7};  // 128 KiB to flush
    XferHandle write = 0;
    XferHandle note = 0;
    ASSERT_EQ(a.engine->post_write(peer, 1, blocks, blocks, &write, wb), Status::kSuccess);
    ASSERT_EQ(a.engine->post_notify(peer, 2, nb, &note), Status::kSuccess);
    EXPECT_EQ(wait_state(*a.engine, write), kDone);
    EXPECT_EQ(wait_state(*a.engine, note), kDone);
    EXPECT_EQ(a.engine->release(write), Status::kSuccess);
    EXPECT_EQ(a.engine->release(note), Status::kSuccess);
    expected.push_back("order-a:" + w);
    expected.push_back("order-a:" + n);
  }
  EXPECT_EQ(taken(b), expected);
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
}

// ---------------------------------------------------------------------------
// Raw puts
// ---------------------------------------------------------------------------

// Without an RDMA device (and without KVXFER_RMA=on) no UCX context exists:
// the blob offers no worker to reach and no rkey.
TEST(UcxRawPutTest, WithoutAnRdmaDeviceNoUcxWorkerListens) {
  EngineAgent target("put-target", {{"TLS", "tcp"}}, kBlocks, kBlockLen, 2);
  wire::PeerBlob blob;
  const auto bytes = target.engine->local_blob();  // blob views it
  ASSERT_TRUE(wire::decode_blob(bytes, &blob));
  EXPECT_TRUE(blob.worker_address.empty());
  EXPECT_TRUE(blob.rkey.empty());
  EXPECT_THROW(
      EngineAgent("no-lane", {{"TLS", "tcp"}, {"KVXFER_LANES", "ucx"}}, kBlocks, kBlockLen),
      std::runtime_error);
}

// With RMA forced on over UCX's tcp transport, a bare UCP client that knows
// the target's worker address and rkey puts wherever it names, even outside
// the pool: why that transport serves tests only (docs/reliability.md).
TEST(UcxRawPutTest, WithRmaForcedOnOverTcpAUcpPutWritesAnywhere) {
  Agent target("put-target", 2);
  wire::PeerBlob blob;
  const auto bytes = target.engine->local_blob();  // blob views it
  ASSERT_TRUE(wire::decode_blob(bytes, &blob));
  std::vector<std::uint8_t> guard(64 * 1024, 0x5A);
  RawWorker client(UCP_FEATURE_RMA | UCP_FEATURE_AM);
  ucp_ep_h ep = client.connect(blob.worker_address);
  std::vector<std::uint8_t> src(4096, 0xEE);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = src.data();
  mp.length = src.size();
  ucp_mem_h memh = nullptr;
  RawWorker::check(ucp_mem_map(client.context(), &mp, &memh), "mem_map");
  ucp_rkey_h rkey = nullptr;
  ASSERT_EQ(ucp_ep_rkey_unpack(ep, blob.rkey.data(), &rkey), UCS_OK);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
  p.memh = memh;
  const auto address = reinterpret_cast<std::uintptr_t>(guard.data()) + 4096;
  EXPECT_EQ(client.wait(ucp_put_nbx(ep, src.data(), src.size(), address, rkey, &p)), UCS_OK);
  ucp_request_param_t fp{};
  EXPECT_EQ(client.wait(ucp_ep_flush_nbx(ep, &fp)), UCS_OK);
  ucp_rkey_destroy(rkey);
  ucp_mem_unmap(client.context(), memh);
  EXPECT_EQ(guard[4096], 0xEE) << "the put did not land outside the pool";
}

// ---------------------------------------------------------------------------
// Acks
// ---------------------------------------------------------------------------

// A notifies targets B and C (hand-rolled). C, a peer of A in its own
// right, is handed B's slot and sequence here anyway and acks with them:
// through A's endpoint to C, and through an endpoint of its own to A.
// Neither ends the transfer; B's ack does.
TEST(UcxAckTest, AnotherPeersAckCannotCompleteANotification) {
  Agent a("ack-a", 1);
  RawTarget b(0xb0b);
  RawTarget c(0xc0c);
  PeerHandle pb = 0;
  PeerHandle pc = 0;
  ASSERT_EQ(a.engine->connect(b.blob(), b.region("raw-b"), &pb), Status::kSuccess);
  ASSERT_EQ(a.engine->connect(c.blob(), c.region("raw-c"), &pc), Status::kSuccess);
  XferHandle to_b = 0;
  XferHandle to_c = 0;
  const std::vector<std::uint8_t> message{'h', 'i'};
  ASSERT_EQ(a.engine->post_notify(pb, 1, message, &to_b), Status::kSuccess);
  ASSERT_EQ(a.engine->post_notify(pc, 2, message, &to_c), Status::kSuccess);
  ASSERT_TRUE(b.raw().progress_until([&] { return b.notes().size() == 1; }));
  ASSERT_TRUE(c.raw().progress_until([&] { return c.notes().size() == 1; }));
  const RawTarget::Note n = b.notes()[0];

  RawTarget::Note forged = c.notes()[0];
  forged.header.slot = n.header.slot;
  forged.header.sequence = n.header.sequence;
  EXPECT_EQ(c.ack(forged, 0), UCS_OK);
  wire::PeerBlob a_blob;
  const auto a_bytes = a.engine->local_blob();  // a_blob views it
  ASSERT_TRUE(wire::decode_blob(a_bytes, &a_blob));
  ucp_ep_h own = c.raw().connect(a_blob.worker_address);
  std::vector<std::uint8_t> ack(wire::kAckLen);
  wire::encode_ack(ack.data(), wire::NotifyAck{n.header.slot, n.header.sequence, 0});
  EXPECT_EQ(c.raw().send(own, wire::kNotifyAckAmId, ack, {}, UCP_AM_SEND_FLAG_REPLY), UCS_OK);
  EXPECT_EQ(c.raw().send(own, wire::kNotifyAckAmId, ack, {}, 0), UCS_OK);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (a.counter("ucx_acks_ignored") < 3 && std::chrono::steady_clock::now() < deadline) {
    c.raw().progress_until([] { return false; }, 5ms);
  }
  EXPECT_EQ(a.counter("ucx_acks_ignored"), 3u);
  Status state = Status::kSuccess;
  ASSERT_EQ(a.engine->check(to_b, &state), Status::kSuccess);
  EXPECT_EQ(state, Status::kInProgress) << "another peer's ack ended the notification";

  EXPECT_EQ(b.ack(n, 0), UCS_OK);
  EXPECT_EQ(wait_state(*a.engine, to_b), kDone);
  EXPECT_EQ(c.ack(c.notes()[0], 0), UCS_OK);
  EXPECT_EQ(wait_state(*a.engine, to_c), kDone);
  EXPECT_NE(b.notes()[0].header.sequence + 1, c.notes()[0].header.sequence);
  EXPECT_EQ(a.engine->release(to_b), Status::kSuccess);
  EXPECT_EQ(a.engine->release(to_c), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(pb), Status::kSuccess);
  EXPECT_EQ(a.engine->disconnect(pc), Status::kSuccess);
}

// ---------------------------------------------------------------------------
// The reason of a failure
// ---------------------------------------------------------------------------

TEST(UcxDetailTest, ARefusedNotificationKeepsItsUcxStatus) {
  Agent a("detail-a", 1);
  RawTarget b(0xb0b);
  PeerHandle pb = 0;
  ASSERT_EQ(a.engine->connect(b.blob(), b.region("raw-b"), &pb), Status::kSuccess);
  XferHandle xfer = 0;
  const std::vector<std::uint8_t> message{'x'};
  ASSERT_EQ(a.engine->post_notify(pb, 1, message, &xfer), Status::kSuccess);
  EXPECT_EQ(a.engine->detail(xfer), nullptr);  // nothing to say while in flight
  ASSERT_TRUE(b.raw().progress_until([&] { return b.notes().size() == 1; }));
  EXPECT_EQ(b.ack(b.notes()[0], static_cast<std::int32_t>(UCS_ERR_INVALID_PARAM)), UCS_OK);
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
  options.engine_config = ucx_lane();
  options.strike_limit = 1;
  Transport init("detail-init", Region{pool.base(), kBlocks, kBlockLen}, options);
  RawTarget b(0xb0b);
  // Metadata as a kvxfer agent would publish it, with the raw target's blob.
  const internal::RemoteRegion region = b.region("raw-b");
  wire::AgentMetadata md = wire::decode(init.agent_metadata());
  md.agent_name = "raw-b";
  md.pid = 0;
  md.base_addr = region.base_addr;
  md.num_blocks = region.num_blocks;
  md.block_len = region.block_len;
  md.engine_blob = b.blob();
  init.add_remote_peer("raw-b", wire::encode(md), region.base_addr, region.num_blocks,
                       region.block_len);
  const std::vector<std::uint8_t> message{'x'};
  ASSERT_TRUE(init.send_notification("raw-b", message).has_value());
  ASSERT_TRUE(b.raw().progress_until([&] { return b.notes().size() == 1; }));
  EXPECT_EQ(b.ack(b.notes()[0], static_cast<std::int32_t>(UCS_ERR_INVALID_PARAM)), UCS_OK);
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

// ---------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------

// The check itself: a call into the worker from a thread without the turn
// is counted.
TEST(UcxDriverTest, ACallOutsideTheDriversTurnIsCounted) {
  ucx::UcxDriver driver("driver-check", {{"TLS", "tcp"}});
  EXPECT_EQ(driver.overlaps(), 0u);
  EXPECT_FALSE(driver.check_turn());
  EXPECT_EQ(driver.overlaps(), 1u);
}

// Writes, reads and notifications from two threads, a third polling, a
// fourth registering and removing another target over and over (another:
// a new registration of b would fence the first one off), with the progress
// thread and without: every call into a worker came from the thread with
// the driver's turn.
void stress_driver(bool progress_thread) {
  Agent a("driver-a", 1, progress_thread);
  Agent b("driver-b", 2, progress_thread);
  Agent c("driver-c", 3, progress_thread);
  PeerHandle peer = 0;
  ASSERT_EQ(a.engine->connect(b.engine->local_blob(), b.region(), &peer), Status::kSuccess);
  std::atomic<bool> stop{false};
  const auto worker = [&](int seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    const std::vector<std::uint8_t> note{'n'};
    for (int i = 0; i < 150 && !stop; ++i) {
      std::vector<std::int64_t> local(8);
      std::vector<std::int64_t> remote(8);
      for (std::size_t k = 0; k < 8; ++k) {
        local[k] = static_cast<std::int64_t>(k + 8 * static_cast<std::size_t>(seed));
        remote[k] = static_cast<std::int64_t>((rng() % 4) * 16 + k);
      }
      XferHandle x = 0;
      const Status posted = i % 3 == 0   ? a.engine->post_read(peer, 1, local, remote, &x)
                            : i % 3 == 1 ? a.engine->post_write(peer, 1, local, remote, &x, note)
                                         : a.engine->post_notify(peer, 1, note, &x);
      ASSERT_EQ(posted, Status::kSuccess);
      if (i % 5 == 0) {
        ASSERT_EQ(a.engine->release(x), Status::kSuccess);  // released in flight
        continue;
      }
      EXPECT_EQ(wait_state(*a.engine, x), kDone);
      ASSERT_EQ(a.engine->release(x), Status::kSuccess);
    }
  };
  std::thread poller([&] {
    while (!stop) {
      a.engine->progress();
      b.engine->progress();
      c.engine->progress();
      std::vector<internal::Notification> notes;
      b.engine->take_notifications(&notes);
    }
  });
  std::thread registrar([&] {
    while (!stop) {
      PeerHandle other = 0;
      if (a.engine->connect(c.engine->local_blob(), c.region(), &other) == Status::kSuccess) {
        EXPECT_EQ(a.engine->disconnect(other), Status::kSuccess);
      }
    }
  });
  std::thread w1(worker, 0);
  std::thread w2(worker, 1);
  w1.join();
  w2.join();
  stop = true;
  poller.join();
  registrar.join();
  // Without threads, nobody drives the workers from here: let the last
  // registration's handshake end first. (UCX 1.13 aborts destroying a
  // worker whose reply to a peer that just connected is still pending.)
  for (const auto until = std::chrono::steady_clock::now() + 500ms;
       std::chrono::steady_clock::now() < until;) {
    for (Agent* agent : {&a, &b, &c}) agent->engine->progress();
  }
  EXPECT_EQ(a.engine->disconnect(peer), Status::kSuccess);
  EXPECT_EQ(a.counter("ucx_driver_overlaps"), 0u);
  EXPECT_EQ(b.counter("ucx_driver_overlaps"), 0u);
  EXPECT_EQ(c.counter("ucx_driver_overlaps"), 0u);
  EXPECT_GT(b.counter("ucx_notifications_received"), 0u);
}

TEST(UcxDriverTest, NoTwoThreadsAreEverInsideTheWorkerWithTheProgressThread) {
  stress_driver(true);
}

TEST(UcxDriverTest, NoTwoThreadsAreEverInsideTheWorkerWithoutIt) { stress_driver(false); }

}  // namespace
}  // namespace kvxfer::it
