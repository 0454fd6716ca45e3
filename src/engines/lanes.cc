// SPDX-License-Identifier: Apache-2.0
// The engine behind backend "UCX": a list of lanes (lane.h) in KVXFER_LANES
// order. It publishes the one blob peers see (each lane writes its part),
// gives each peer the first lane that qualifies, and hands every other call
// to the lane its handle names. It owns the token peers' messages to us
// must carry (the same-host cookie's epoch, the ucx lane's messages).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/mutex.h"
#include "common/random.h"
#include "common/region.h"
#include "engine.h"
#include "engines/cma/cma_lane.h"
#include "engines/lane.h"
#include "engines/settings.h"
#include "engines/tcp/tcp_lane.h"
#include "engines/ucx/ucx_config.h"
#include "engines/ucx/ucx_lane.h"
#include "wire/peer_blob.h"

namespace kvxfer::internal {
namespace {

const std::string& engine_name() {
  static const std::string name = "UCX";
  return name;
}

// The lanes a peer may get, in the order they are tried: KVXFER_LANES
// (engines/settings.h: engine_config, else the environment), a comma list of
// distinct names among cma, ucx and tcp.
constexpr const char* kDefaultLanes = "cma,ucx,tcp";
constexpr const char* kLaneNames[] = {"cma", "ucx", "tcp"};

std::vector<std::string> allowed_lanes(const std::optional<Setting>& lanes) {
  const std::string text = lanes ? lanes->value : kDefaultLanes;
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::string name = text.substr(at, comma - at);
    const bool known = std::find(std::begin(kLaneNames), std::end(kLaneNames), name) !=
                       std::end(kLaneNames);
    if (!known || std::find(out.begin(), out.end(), name) != out.end()) {
      throw std::runtime_error(fmt::format(
          "kvxfer: {} is not a list of distinct lanes among cma, ucx, tcp", lanes.value().said()));
    }
    out.push_back(std::move(name));
    at = comma + 1;
  }
  return out;
}

// Throws unless the config can start an engine.
void check(const EngineConfig& config) {
  if (config.options == nullptr) throw std::runtime_error("kvxfer: no options");
  const Region& r = config.region;
  const bool no_pool = r.base == nullptr && r.num_blocks == 0 && r.block_len == 0;
  if (!no_pool && !region_is_valid(reinterpret_cast<std::uintptr_t>(r.base), r.num_blocks, r.block_len)) {
    throw std::runtime_error("kvxfer: bad local region");
  }
}

// KVXFER_PRETOUCH (auto when unset). Parsed before any lane starts, so a
// bad value throws with nothing started.
PretouchMode pretouch_mode_of(const EngineSettings& settings) {
  if (!settings.pretouch) return PretouchMode::kAuto;
  const std::optional<PretouchMode> mode = pretouch_mode_named(settings.pretouch->value);
  if (!mode) refuse("transport", *settings.pretouch, "is not auto, on or off");
  return *mode;
}

class Lanes final : public Engine {
 public:
  // Every lane's keys are parsed, and so checked, whether or not the lane
  // starts.
  Lanes(const EngineConfig& config, const EngineSettings& settings)
      : Engine(config.region.block_len),
        agent_name_(config.agent_name),
        allowed_(allowed_lanes(settings.lanes)),
        pretouch_(pretouch_mode_of(settings)),
        token_(fresh_random()) {
    const Options& options = *config.options;
    const bool has_rdma = ucx::host_has_rdma_device();
    const ucx::UcxSettings ucx_settings = ucx::compute_ucx_settings(settings.ucx, has_rdma);
    const cma::CopyPolicy copy_policy = cma::compute_copy_policy(settings.cma);
    const tcp::TcpSettings tcp_settings = tcp::compute_tcp_settings(settings.tcp);
    const bool tcp_allowed = std::find(allowed_.begin(), allowed_.end(), "tcp") != allowed_.end();
    for (const std::string& name : allowed_) {
      if (name == "cma") {
        lanes_.push_back(std::make_unique<cma::CmaLane>(agent_name_, config.region,
                                                        options.num_threads, copy_policy, token_));
      } else if (name == "tcp") {
        lanes_.push_back(std::make_unique<tcp::TcpLane>(agent_name_, config.region, tcp_settings));
      } else if (ucx_settings.rma) {
        // UCX only where it writes with puts: an RDMA device here, or
        // KVXFER_RMA=on (tests: UCX's tcp transport then carries the puts).
        // Otherwise no UCX context exists, so no UCX listener either: its
        // tcp transport would carry out any client's put anywhere in the
        // process (docs/reliability.md).
        lanes_.push_back(std::make_unique<ucx::UcxLane>(agent_name_, config.region, options,
                                                        token_, ucx_settings, has_rdma,
                                                        tcp_allowed));
        if (ucx_settings.tcp_beside_rdma) {
          log().warn(
              "kvxfer ucx {}: UCX_TLS={} lets UCX's tcp transport run beside an RDMA device; its "
              "listener carries out any client's PUT to any address in this process (for tests "
              "only: remote peers without RDMA have the tcp lane)",
              agent_name_, ucx_settings.tls);
        }
      }
    }
    if (lanes_.empty()) {
      throw std::runtime_error(fmt::format(
          "kvxfer: KVXFER_LANES={} leaves no lane this engine can run (the ucx lane needs an "
          "RDMA device, or KVXFER_RMA=on)",
          lanes_text()));
    }
    has_rdma_ = has_rdma;
  }
  ~Lanes() override { shutdown(); }
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;

  [[nodiscard]] const std::string& name() const noexcept override { return engine_name(); }
  // Published afresh each time: the ucx lane's part lists the keys of the
  // regions registered now.
  [[nodiscard]] std::vector<std::uint8_t> local_blob() const override {
    wire::PeerBlob blob;
    blob.cookie_epoch = token_;
    if (has_rdma_) blob.flags |= wire::kBlobHasRdma;
    for (const auto& lane : lanes_) lane->publish(blob);
    return wire::encode_blob(blob);
  }

  [[nodiscard]] Status connect(std::span<const std::uint8_t> bytes, const RemoteRegion& remote,
                               PeerHandle* out, std::string* reason) override {
    const auto refuse = [&](Status st, std::string why) {
      log().warn("kvxfer {}: {}", agent_name_, why);
      if (reason != nullptr) *reason = std::move(why);
      return st;
    };
    wire::PeerBlob blob;
    if (!wire::decode_blob(bytes, &blob)) {
      return refuse(Status::kInvalidParam,
                    fmt::format("peer {} sent a malformed engine blob ({} bytes)",
                                remote.agent_name, bytes.size()));
    }
    if (remote.num_blocks != 0 &&
        !region_is_valid(remote.base_addr, remote.num_blocks, remote.block_len)) {
      return refuse(
          Status::kInvalidParam,
          fmt::format("peer {} has an impossible region (base {:#x}, {} blocks of {})",
                      remote.agent_name, remote.base_addr, remote.num_blocks, remote.block_len));
    }
    // THE rule for which lane a peer gets: the first of KVXFER_LANES that
    // qualifies (lane.h) and connects; a lane that cannot reach the peer
    // after all lets the next one try.
    Status passed_over = Status::kSuccess;
    std::string passed_reason;
    const bool other_regions =
        std::any_of(remote.regions.begin(), remote.regions.end(),
                    [](const MemRegion& r) { return r.id != 0; });
    for (const auto& lane : lanes_) {
      if (other_regions && !lane->takes_regions()) continue;
      if (!lane->qualifies(remote, blob)) continue;
      Lane::Connected connected;
      const Status st = lane->connect(blob, remote, &connected);
      if (st == Status::kSuccess) {
        const PeerHandle handle = handle_of(connected.peer);
        {
          MutexLock lock(connected_mu_);
          connected_.insert(handle);
        }
        // Whatever lane it writes through, a registered peer is known to
        // every lane by name and key (tcp_lane.h, "Identities").
        for (const auto& each : lanes_) each->vouch(handle, remote, blob);
        *out = handle;
        return Status::kSuccess;
      }
      if (!connected.next_may_try) return refuse(st, std::move(connected.reason));
      log().info("kvxfer {} {}: {}; trying the next lane", lane->name(), agent_name_,
                 connected.reason);
      if (passed_over == Status::kSuccess) {
        passed_over = st;
        passed_reason = std::move(connected.reason);
      }
    }
    if (passed_over != Status::kSuccess) {
      return refuse(passed_over, fmt::format("{}, and no other lane reaches it (KVXFER_LANES here "
                                             "is {})",
                                             passed_reason, lanes_text()));
    }
    return refuse(Status::kNotSupported,
                  fmt::format("no lane of {} reaches peer {} (KVXFER_LANES here is {})",
                              agent_name_, remote.agent_name, lanes_text()));
  }

  [[nodiscard]] Status disconnect(PeerHandle peer) override {
    {
      // A handle is used once more here, never after: one that is not
      // connected (never was, or already disconnected) is refused before it
      // is followed.
      MutexLock lock(connected_mu_);
      if (connected_.erase(peer) == 0) return Status::kNotFound;
    }
    for (const auto& lane : lanes_) lane->unvouch(peer);
    LanePeer* p = lane_peer(peer);
    return p->lane->disconnect(p);
  }

  [[nodiscard]] Status add_region(const MemRegion& region, std::string* reason) override {
    std::vector<Lane*> took;
    for (const auto& lane : lanes_) {
      if (!lane->takes_regions()) continue;
      std::string why;
      const Status st = lane->add_region(region, &why);
      if (st != Status::kSuccess) {
        for (Lane* undo : took) static_cast<void>(undo->remove_region(region.id));
        if (reason != nullptr) *reason = fmt::format("the {} lane: {}", lane->name(), why);
        return st;
      }
      took.push_back(lane.get());
    }
    return Status::kSuccess;
  }

  [[nodiscard]] Status remove_region(std::uint64_t id) override {
    Status first = Status::kSuccess;
    for (const auto& lane : lanes_) {
      if (!lane->takes_regions()) continue;
      const Status st = lane->remove_region(id);
      if (st != Status::kSuccess && first == Status::kSuccess) first = st;
    }
    return first;
  }

  [[nodiscard]] Status post(PeerHandle peer, const Post& post, XferHandle* out) override {
    LanePeer* p = lane_peer(peer);
    if (!post.pool_only && !p->lane->takes_regions()) {
      for (const ByteRun& run : post.runs) {
        if (run.local_region != 0 || run.remote_region != 0) return Status::kNotSupported;
      }
    }
    return p->lane->post(p, post, out);
  }

  void take_notifications(std::vector<Notification>* out) override {
    for (const auto& lane : lanes_) lane->take_notifications(out);
  }

  void progress() override {
    // A polling caller helps a queued same-host copy, and drives the UCX
    // worker when no thread does.
    for (const auto& lane : lanes_) lane->progress();
  }

  [[nodiscard]] Status check(XferHandle xfer, Status* state) override {
    if (xfer == 0) return Status::kInvalidParam;
    return lane_xfer(xfer)->lane->check(xfer, state);
  }

  [[nodiscard]] const char* detail(XferHandle xfer) const override {
    return xfer == 0 ? nullptr : lane_xfer(xfer)->lane->detail(xfer);
  }

  [[nodiscard]] Status release(XferHandle xfer) override {
    if (xfer == 0) return Status::kInvalidParam;
    return lane_xfer(xfer)->lane->release(xfer);
  }

  [[nodiscard]] HandleCounts live() const override {
    HandleCounts counts;
    for (const auto& lane : lanes_) lane->add_live(counts);
    return counts;
  }

  [[nodiscard]] std::map<std::string, std::uint64_t> counters() const override {
    std::map<std::string, std::uint64_t> counters;
    for (const auto& lane : lanes_) lane->add_counters(counters);
    return counters;
  }

  [[nodiscard]] const char* lane(PeerHandle peer) const override {
    return peer == 0 ? "" : lane_peer(peer)->lane->name();
  }

  [[nodiscard]] PretouchMode pretouch_mode() const noexcept override { return pretouch_; }

  void shutdown() override {
    if (shut_down_) return;
    shut_down_ = true;
    for (const StopStage stage : {StopStage::kRefuse, StopStage::kDisconnect, StopStage::kQuiesce,
                                  StopStage::kRelease}) {
      for (const auto& lane : lanes_) lane->stop(stage);
    }
  }

 private:
  [[nodiscard]] std::string lanes_text() const { return fmt::format("{}", fmt::join(allowed_, ",")); }

  std::string agent_name_;
  std::vector<std::string> allowed_;
  PretouchMode pretouch_;
  std::uint64_t token_ = 0;
  std::vector<std::unique_ptr<Lane>> lanes_;  // in KVXFER_LANES order
  bool has_rdma_ = false;
  // The handles connect() handed out and disconnect() has not taken back
  // (connect and disconnect only: a post follows its handle, no lookup).
  Mutex connected_mu_;
  std::unordered_set<PeerHandle> connected_ GUARDED_BY(connected_mu_);
  bool shut_down_ = false;
};

}  // namespace

std::unique_ptr<Engine> make_ucx_engine(const EngineConfig& config) {
  // The engine's settings are read once, here (engines/settings.h).
  check(config);
  return std::make_unique<Lanes>(
      config, read_settings(config.options->engine_config, process_environment()));
}

}  // namespace kvxfer::internal
