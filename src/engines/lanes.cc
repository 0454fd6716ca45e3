// SPDX-License-Identifier: Apache-2.0
// The engine behind backend "UCX": it owns the same-host lane (cma/), the
// tcp lane (tcp/) and the UCX lane (ucx/), publishes the one blob peers see,
// and decides, in lane_for() below, which lane each peer gets. Everything
// else it hands to the lane that owns the peer or the transfer.
#include "engines/lanes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/host.h"
#include "common/log.h"
#include "common/region.h"
#include "engine.h"
#include "engines/cma/cma_lane.h"
#include "engines/tcp/tcp_lane.h"
#include "engines/ucx/ucx_config.h"
#include "engines/ucx/ucx_lane.h"
#include "wire/ucx_blob.h"

namespace kvxfer::internal {
namespace {

const std::string& engine_name() {
  static const std::string name = "UCX";
  return name;
}

// The lanes a peer may get, in the order they are tried: engine_config
// KVXFER_LANES, or the environment's KVXFER_LANES (which wins), a comma list
// of cma, ucx and tcp. A lane qualifies for a peer as lane_for() says; the
// first that qualifies serves it.
constexpr const char* kLanesKey = "KVXFER_LANES";
constexpr const char* kDefaultLanes = "cma,ucx,tcp";

std::vector<Lane> parse_lanes(const std::string& text, const char* where) {
  std::vector<Lane> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string name = text.substr(at, comma - at);
    Lane lane = Lane::kNone;
    if (name == "cma") lane = Lane::kCma;
    if (name == "ucx") lane = Lane::kUcx;
    if (name == "tcp") lane = Lane::kTcp;
    if (lane == Lane::kNone || std::find(out.begin(), out.end(), lane) != out.end()) {
      throw std::runtime_error(fmt::format(
          "kvxfer UCX: {} KVXFER_LANES={} is not a list of distinct lanes among cma, ucx, tcp",
          where, text));
    }
    out.push_back(lane);
    at = comma + 1;
  }
  return out;
}

std::vector<Lane> allowed_lanes(const std::map<std::string, std::string>& engine_config) {
  if (const char* env = std::getenv(kLanesKey); env != nullptr) {
    return parse_lanes(env, "environment");
  }
  const auto it = engine_config.find(kLanesKey);
  return it != engine_config.end() ? parse_lanes(it->second, "engine_config")
                                   : parse_lanes(kDefaultLanes, "default");
}

bool allows(const std::vector<Lane>& lanes, Lane lane) {
  return std::find(lanes.begin(), lanes.end(), lane) != lanes.end();
}

// Throws unless the config can start an engine; returns it.
const EngineConfig& checked(const EngineConfig& config) {
  if (config.options == nullptr) throw std::runtime_error("kvxfer UCX: no options");
  const Region& r = config.region;
  if (r.base == nullptr ||
      !region_is_valid(reinterpret_cast<std::uintptr_t>(r.base), r.num_blocks, r.block_len)) {
    throw std::runtime_error("kvxfer UCX: bad local region");
  }
  return config;
}

class Lanes final : public Engine {
 public:
  explicit Lanes(const EngineConfig& config)
      : agent_name_(checked(config).agent_name),
        allowed_(allowed_lanes(config.options->engine_config)),
        cma_(agent_name_, config.region, config.options->num_threads,
             cma::compute_copy_policy(config.options->engine_config)),
        tcp_(allows(allowed_, Lane::kTcp)
                 ? std::make_unique<tcp::TcpLane>(
                       agent_name_, config.region,
                       tcp::compute_tcp_settings(config.options->engine_config,
                                                 tcp::tcp_environment()))
                 : nullptr),
        has_rdma_(ucx::host_has_rdma_device()),
        // Checked (and the user's UCX settings validated) whether or not the
        // UCX lane starts.
        ucx_settings_(
            ucx::compute_ucx_settings(config.options->engine_config, &ucx::process_env, has_rdma_)),
        // UCX only where it writes with puts: an RDMA device here, or
        // KVXFER_RMA=on (tests: UCX's tcp transport then carries the puts).
        // Otherwise no UCX context exists, so no UCX listener either: its
        // tcp transport would carry out any client's put anywhere in the
        // process (docs/reliability.md).
        ucx_(allows(allowed_, Lane::kUcx) && ucx_settings_.rma
                 ? std::make_unique<ucx::UcxLane>(agent_name_, config.region, *config.options,
                                                  cma_.cookie_epoch(), ucx_settings_)
                 : nullptr),
        // Same-host writes need the lane allowed on both sides: ours is
        // KVXFER_LANES, the peer's is its blob's flag. UCX_TLS speaks for
        // the ucx lane only.
        accepts_cma_(allows(allowed_, Lane::kCma)),
        blob_(make_blob()) {
    if (ucx_ != nullptr && ucx_settings_.tcp_beside_rdma) {
      log().warn(
          "kvxfer UCX {}: UCX_TLS={} lets UCX's tcp transport run beside an RDMA device; its "
          "listener carries out any client's PUT to any address in this process (for tests "
          "only: remote peers without RDMA have the tcp lane)",
          agent_name_, ucx_settings_.tls);
    }
    if (tcp_ == nullptr && ucx_ == nullptr && !accepts_cma_) {
      throw std::runtime_error(fmt::format(
          "kvxfer UCX: KVXFER_LANES={} leaves no lane this engine can run (the ucx lane needs "
          "an RDMA device, or KVXFER_RMA=on)",
          lanes_text()));
    }
  }
  ~Lanes() override { shutdown(); }
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  [[nodiscard]] const std::string& name() const noexcept override { return engine_name(); }
  [[nodiscard]] std::vector<std::uint8_t> local_blob() const override { return blob_; }

  [[nodiscard]] Status connect(std::span<const std::uint8_t> blob, const RemoteRegion& remote,
                               PeerHandle* out, std::string* reason) override {
    const auto refuse = [&](Status st, std::string why) {
      log().warn("kvxfer UCX {}: {}", agent_name_, why);
      if (reason != nullptr) *reason = std::move(why);
      return st;
    };
    ucx::Blob b;
    if (!ucx::decode_blob(blob, &b)) {
      return refuse(Status::kInvalidParam,
                    fmt::format("peer {} sent a malformed engine blob ({} bytes)",
                                remote.agent_name, blob.size()));
    }
    if (!region_is_valid(remote.base_addr, remote.num_blocks, remote.block_len)) {
      return refuse(
          Status::kInvalidParam,
          fmt::format("peer {} has an impossible region (base {:#x}, {} blocks of {})",
                      remote.agent_name, remote.base_addr, remote.num_blocks, remote.block_len));
    }
    PeerHandle handle = 0;
    Lane lane = lane_for(remote, b, /*after=*/Lane::kNone);
    if (lane == Lane::kNone) {
      return refuse(Status::kNotSupported,
                    fmt::format("no lane of {} reaches peer {} (KVXFER_LANES here is {})",
                                agent_name_, remote.agent_name, lanes_text()));
    }
    if (lane == Lane::kCma) {
      std::string why;
      const int notify_fd = b.notify_fd == ucx::kNoNotifyFd || b.notify_fd > 0x7fffffff
                                ? -1
                                : static_cast<int>(b.notify_fd);
      const Status st =
          cma_.connect(remote, b.cookie_addr, b.cookie_epoch, notify_fd, &handle, &why);
      if (st == Status::kRemoteDisconnect) {
        // The lane logged the details (errno or a stale cookie).
        if (reason != nullptr) {
          *reason = fmt::format("peer {} is on this host but its process (pid {}) is gone",
                                remote.agent_name, remote.pid);
        }
        return st;
      }
      // Metadata that does not describe the pool the target registered: no
      // lane may write there.
      if (st == Status::kMismatch) return refuse(st, std::move(why));
      // Anything else (no ptrace permission, seccomp): the next lane may
      // still reach it.
      if (st != Status::kSuccess) {
        lane = lane_for(remote, b, /*after=*/Lane::kCma);
        if (lane == Lane::kNone) {
          return refuse(st, fmt::format("peer {} is on this host but the same-host lane cannot "
                                        "reach it ({}), and KVXFER_LANES here is {}",
                                        remote.agent_name, why, lanes_text()));
        }
      }
    }
    if (lane == Lane::kTcp) {
      if (const Status st = tcp_->connect(b, remote, &handle, reason); st != Status::kSuccess) {
        log().warn("kvxfer UCX {}: {}", agent_name_, reason != nullptr ? *reason : "");
        return st;
      }
    }
    if (lane == Lane::kUcx) {
      if (const Status st = ucx_->connect(b, remote, &handle, reason); st != Status::kSuccess) {
        return st;
      }
    }
    {
      std::lock_guard lock(lanes_mu_);
      peer_lanes_.emplace(handle, lane);
    }
    // Whatever lane it writes through, a registered peer with a tcp lane of
    // its own is known to ours by name and key: its connections to us are
    // told from anyone else's (tcp_lane.h, "Identities").
    if (tcp_ && b.tcp_port != 0) tcp_->vouch(handle, remote.agent_name, b.tcp_key);
    *out = handle;
    return Status::kSuccess;
  }

  [[nodiscard]] Status disconnect(PeerHandle peer) override {
    Lane lane = Lane::kUcx;
    {
      std::lock_guard lock(lanes_mu_);
      auto it = peer_lanes_.find(peer);
      if (it == peer_lanes_.end()) return Status::kNotFound;
      lane = it->second;
      peer_lanes_.erase(it);
    }
    if (tcp_) tcp_->unvouch(peer);
    switch (lane) {
      case Lane::kCma:
        return cma_.disconnect(peer);
      case Lane::kTcp:
        return tcp_->disconnect(peer);
      default:
        return ucx_->disconnect(peer);
    }
  }

  [[nodiscard]] Status post_write(PeerHandle peer, TransferId id,
                                  std::span<const std::int64_t> local,
                                  std::span<const std::int64_t> remote, XferHandle* out,
                                  std::span<const std::uint8_t> notify) override {
    if (local.size() != remote.size() || local.empty()) return Status::kInvalidParam;
    return on_lane_of(
        peer, [&](auto& lane) { return lane.post_write(peer, id, local, remote, out, notify); });
  }

  [[nodiscard]] Status post_read(PeerHandle peer, TransferId id,
                                 std::span<const std::int64_t> local,
                                 std::span<const std::int64_t> remote, XferHandle* out,
                                 std::span<const std::uint8_t> notify) override {
    if (local.size() != remote.size() || local.empty()) return Status::kInvalidParam;
    return on_lane_of(
        peer, [&](auto& lane) { return lane.post_read(peer, id, local, remote, out, notify); });
  }

  [[nodiscard]] Status post_notify(PeerHandle peer, TransferId id,
                                   std::span<const std::uint8_t> message,
                                   XferHandle* out) override {
    return on_lane_of(peer, [&](auto& lane) { return lane.post_notify(peer, id, message, out); });
  }

  void take_notifications(std::vector<Notification>* out) override {
    cma_.take_notifications(out);
    if (tcp_) tcp_->take_notifications(out);
    if (ucx_) ucx_->take_notifications(out);
  }

  void progress() override {
    // A polling caller first helps one queued same-host chunk, then drives
    // the UCX worker.
    cma_.progress();
    if (ucx_) ucx_->progress();
  }

  [[nodiscard]] Status check(XferHandle xfer, Status* state) override {
    if (xfer == 0) return Status::kInvalidParam;
    switch (lane_of(xfer)) {
      case Lane::kCma:
        return cma_.check(xfer, state);
      case Lane::kTcp:
        return tcp_->check(xfer, state);
      default:
        return ucx_->check(xfer, state);
    }
  }

  [[nodiscard]] const char* detail(XferHandle xfer) const override {
    // The same-host lane has nothing to add to its statuses.
    if (xfer == 0 || lane_of(xfer) == Lane::kCma) return nullptr;
    return lane_of(xfer) == Lane::kTcp ? tcp_->detail(xfer) : ucx_->detail(xfer);
  }

  [[nodiscard]] Status release(XferHandle xfer) override {
    if (xfer == 0) return Status::kInvalidParam;
    switch (lane_of(xfer)) {
      case Lane::kCma:
        return cma_.release(xfer);
      case Lane::kTcp:
        return tcp_->release(xfer);
      default:
        return ucx_->release(xfer);
    }
  }

  [[nodiscard]] HandleCounts live() const override {
    HandleCounts counts;
    if (ucx_) ucx_->add_live(counts);
    cma_.add_live(counts);
    if (tcp_) tcp_->add_live(counts);
    return counts;
  }

  [[nodiscard]] std::map<std::string, std::uint64_t> counters() const override {
    std::map<std::string, std::uint64_t> counters;
    cma_.add_counters(counters);
    if (tcp_) tcp_->add_counters(counters);
    if (ucx_) ucx_->add_counters(counters);
    return counters;
  }

  void shutdown() override {
    if (shut_down_) return;
    shut_down_ = true;
    if (ucx_) ucx_->stop();
    std::vector<PeerHandle> leftover;
    {
      std::lock_guard lock(lanes_mu_);
      for (const auto& [handle, lane] : peer_lanes_) leftover.push_back(handle);
    }
    if (!leftover.empty()) {
      log().warn("kvxfer UCX {}: shutdown with {} peer(s) still connected", agent_name_,
                 leftover.size());
    }
    for (const PeerHandle handle : leftover) {
      [[maybe_unused]] const Status st = disconnect(handle);
    }
    cma_.stop_copiers();
    if (tcp_) tcp_->stop();
    if (ucx_) ucx_->release_pool();
    cma_.retire_cookie();
    if (ucx_) ucx_->destroy_worker();
  }

 private:
  // THE rule for which lane a peer gets: the first lane of KVXFER_LANES
  // (after `after`, when connect() falls back) that qualifies:
  // - cma: the peer shares our kernel (boot id) and pid namespace, has a
  //   pid, and both sides allow shared memory;
  // - ucx: both sides run it (an RDMA device, or KVXFER_RMA=on), and both
  //   have an RDMA device or the tcp lane cannot serve the peer (not
  //   allowed here, or the peer has none): forcing UCX's tcp transport stays
  //   possible for tests;
  // - tcp: the peer publishes a tcp lane.
  // kNone when no lane qualifies.
  [[nodiscard]] Lane lane_for(const RemoteRegion& remote, const ucx::Blob& blob, Lane after) const {
    const cma::PidNamespace pidns = cma_.pid_namespace();
    const bool same_host = !boot_id().empty() && remote.boot_id == boot_id() && remote.pid != 0 &&
                           pidns.ino != 0 && blob.pidns_dev == pidns.dev &&
                           blob.pidns_ino == pidns.ino;
    const bool peer_accepts_cma = (blob.flags & ucx::kBlobAcceptsCma) != 0;
    const bool tcp_serves = tcp_ != nullptr && blob.tcp_port != 0;
    const bool both_rdma = has_rdma_ && (blob.flags & ucx::kBlobHasRdma) != 0;
    auto it = allowed_.begin();
    if (after != Lane::kNone) {
      it = std::find(allowed_.begin(), allowed_.end(), after);
      if (it != allowed_.end()) ++it;
    }
    for (; it != allowed_.end(); ++it) {
      switch (*it) {
        case Lane::kCma:
          if (same_host && accepts_cma_ && peer_accepts_cma) return Lane::kCma;
          break;
        case Lane::kUcx:
          if (ucx_ != nullptr && !blob.worker_address.empty() && !blob.rkey.empty() &&
              (both_rdma || !tcp_serves)) {
            return Lane::kUcx;
          }
          break;
        case Lane::kTcp:
          if (tcp_serves) return Lane::kTcp;
          break;
        case Lane::kNone:
          break;
      }
    }
    return Lane::kNone;
  }

  [[nodiscard]] std::string lanes_text() const {
    std::vector<const char*> names;
    for (const Lane lane : allowed_) names.push_back(lane_name(lane));
    return fmt::format("{}", fmt::join(names, ","));
  }

  static const char* lane_name(Lane lane) {
    switch (lane) {
      case Lane::kCma:
        return "cma";
      case Lane::kUcx:
        return "ucx";
      case Lane::kTcp:
        return "tcp";
      default:
        return "";
    }
  }

  static Lane lane_of(XferHandle xfer) { return reinterpret_cast<const LaneXfer*>(xfer)->lane; }

  // Runs post(lane) on the lane that owns a connected peer; kNotFound for
  // a peer no lane owns.
  template <typename Post>
  [[nodiscard]] Status on_lane_of(PeerHandle peer, Post&& post) {
    switch (lane_of_peer(peer)) {
      case Lane::kCma:
        return post(cma_);
      case Lane::kUcx:
        return post(*ucx_);
      case Lane::kTcp:
        return post(*tcp_);
      case Lane::kNone:
        break;
    }
    return Status::kNotFound;
  }

  [[nodiscard]] const char* lane(PeerHandle peer) const override {
    return lane_name(lane_of_peer(peer));
  }

  // The lane that owns a connected peer, or kNone.
  [[nodiscard]] Lane lane_of_peer(PeerHandle peer) const {
    std::lock_guard lock(lanes_mu_);
    const auto it = peer_lanes_.find(peer);
    return it == peer_lanes_.end() ? Lane::kNone : it->second;
  }

  [[nodiscard]] std::vector<std::uint8_t> make_blob() const {
    ucx::Blob blob;
    blob.flags = static_cast<std::uint16_t>((accepts_cma_ ? ucx::kBlobAcceptsCma : 0) |
                                            (has_rdma_ ? ucx::kBlobHasRdma : 0));
    blob.pidns_dev = cma_.pid_namespace().dev;
    blob.pidns_ino = cma_.pid_namespace().ino;
    blob.cookie_addr = cma_.cookie_addr();
    blob.cookie_epoch = cma_.cookie_epoch();
    if (ucx_) {
      blob.worker_address = ucx_->worker_address();
      blob.rkey = ucx_->packed_rkey();
    }
    if (cma_.notify_fd() >= 0) blob.notify_fd = static_cast<std::uint32_t>(cma_.notify_fd());
    if (tcp_) {
      blob.tcp_token = tcp_->token();
      blob.tcp_key = tcp_->identity_key();
      blob.tcp_port = tcp_->port();
      blob.tcp_addresses = tcp_->addresses();
    }
    return ucx::encode_blob(blob);
  }

  std::string agent_name_;
  std::vector<Lane> allowed_;
  cma::CmaLane cma_;
  std::unique_ptr<tcp::TcpLane> tcp_;  // when KVXFER_LANES allows it
  bool has_rdma_ = false;
  ucx::UcxSettings ucx_settings_;
  std::unique_ptr<ucx::UcxLane> ucx_;  // when a peer can need it (see the constructor)
  bool accepts_cma_ = false;
  std::vector<std::uint8_t> blob_;

  // Which lane owns each peer. Connect runs on the core's registration
  // worker while transfers run on callers' threads, so it has its own lock.
  mutable std::mutex lanes_mu_;
  std::unordered_map<PeerHandle, Lane> peer_lanes_;
  bool shut_down_ = false;
};

}  // namespace

std::unique_ptr<Engine> make_ucx_engine(const EngineConfig& config) {
  return std::make_unique<Lanes>(config);
}

}  // namespace kvxfer::internal
