// SPDX-License-Identifier: Apache-2.0
// A peer of the UCX lane: its UCP endpoint and rkey, what the lane knows of
// the peer, and the endpoint's state, which moves one way only:
//   connecting -> connected -> failed;  any of these -> closing -> closed.
// Only the driver calls into UCX through it or moves its state; any thread
// reads the state and the error.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engines/lane.h"
#include "engines/ucx/ucx_handles.h"

namespace kvxfer::internal::ucx {

class UcxLane;

enum class EpState : std::uint8_t { kConnecting, kConnected, kFailed, kClosing, kClosed };

// A region of the peer's as its metadata lists it (ByteRun::remote_region
// indexes them: the pool first, when it has one), matched at connect with
// the key its UCX lane published for it.
struct PeerRegion {
  std::uint64_t id = 0;  // the peer's (0: its pool)
  std::uint64_t base = 0;
  std::uint64_t len = 0;
};

// The peer handle the core holds points at its LanePeer part.
class Endpoint : public LanePeer, public std::enable_shared_from_this<Endpoint> {
 public:
  // `regions`: the peer's, with their packed rkeys (views that open() reads).
  Endpoint(UcxLane* in, std::string name, std::vector<PeerRegion> regions,
           std::uint64_t peer_token);

  // Creates the endpoint in peer-failure mode (a failed peer completes our
  // requests with an error and calls on_error(arg)) and unpacks the rkey of
  // each region (packed[i] for regions[i]). On failure *what names the
  // step; an endpoint created is left to close().
  ucs_status_t open(ucp_worker_h worker, std::span<const std::uint8_t> address,
                    std::span<const std::span<const std::uint8_t>> packed,
                    ucp_err_handler_cb_t on_error, void* arg, const char** what);
  // Moves to closing and force-closes the endpoint (its requests end with
  // UCS_ERR_CANCELED). True when on_closed(request, status, arg) will end
  // the close (and free the request); false when it ended at once.
  bool close(ucp_send_nbx_callback_t on_closed, void* arg);
  void closed();     // the close ended: the rkeys go
  bool connected();  // connecting -> connected; false when it failed meanwhile
  // connecting or connected -> failed, keeping the first error; true for
  // the call that made it so.
  bool fail(ucs_status_t status);

  // Whether the peer has a pool (regions[0], write_blocks' target).
  [[nodiscard]] bool has_pool() const { return !regions.empty() && regions[0].id == 0; }
  [[nodiscard]] EpState state() const { return state_.load(std::memory_order_acquire); }
  [[nodiscard]] bool usable() const { return state() == EpState::kConnected; }
  [[nodiscard]] ucs_status_t error() const {  // UCS_OK while it has not failed
    return static_cast<ucs_status_t>(error_.load(std::memory_order_acquire));
  }

  UcxLane* const owner;
  const std::string agent_name;
  // Its regions, fixed at creation; any thread reads them (the bounds every
  // run is checked against before it is posted).
  const std::vector<PeerRegion> regions;
  const std::uint64_t token;  // the peer's: its handlers take only messages with it
  // This registration (wire/fence.h): our lineage for the peer, its number
  // in it, its random epoch, and the fence (UCX reads it until sent).
  std::uint64_t lineage = 0;
  std::uint64_t gen = 0;
  std::uint64_t epoch = 0;
  std::vector<std::uint8_t> fence;
  // Driver only: the endpoint, the rkey of each region (as `regions`), and
  // the slots of the transfers whose notification awaits its ack.
  ucp_ep_h ep = nullptr;
  std::vector<RkeyHandle> rkeys;
  std::vector<std::uint32_t> awaiting;
  // Held from disconnect() until the close ends (UCX calls back with this
  // endpoint until then); close_done is under the driver's lock.
  std::shared_ptr<Endpoint> keep;
  bool close_done = false;

 private:
  bool move(EpState from, EpState to) {
    return state_.compare_exchange_strong(from, to, std::memory_order_acq_rel);
  }
  std::atomic<EpState> state_{EpState::kConnecting};
  std::atomic<int> error_{UCS_OK};
};

}  // namespace kvxfer::internal::ucx
