// SPDX-License-Identifier: Apache-2.0
// Owners for the UCX objects the lane holds, so that every path, the error
// paths included, releases each exactly once and in one place. Each is
// move-only; reset() releases early (shutdown's order is explicit).
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <utility>

namespace kvxfer::internal::ucx {

// How long an endpoint's close drives the worker for UCX to finish a forced
// close before giving up on it.
inline constexpr auto kDrainTimeout = std::chrono::seconds(10);

// A handle released by `Release(handle)`; the base of the owners below.
template <typename H, void (*Release)(H)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(H handle) : handle_(handle) {}
  ~Owned() { reset(); }
  Owned(Owned&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;

  [[nodiscard]] H get() const { return handle_; }
  [[nodiscard]] explicit operator bool() const { return handle_ != nullptr; }
  // For the out-parameter of the call that creates the handle; only on an
  // empty owner.
  [[nodiscard]] H* out() { return &handle_; }
  void reset() {
    if (handle_ != nullptr) Release(std::exchange(handle_, nullptr));
  }

 private:
  H handle_ = nullptr;
};

inline void release_config(ucp_config_t* config) { ucp_config_release(config); }
inline void release_context(ucp_context_h context) { ucp_cleanup(context); }
// Destroying the worker completes whatever UCX still holds with
// UCS_ERR_CANCELED (see UcxWorker::destroy for what must come first).
inline void release_worker(ucp_worker_h worker) { ucp_worker_destroy(worker); }
inline void release_rkey(ucp_rkey_h rkey) { ucp_rkey_destroy(rkey); }  // cannot fail

using ConfigHandle = Owned<ucp_config_t*, &release_config>;
using ContextHandle = Owned<ucp_context_h, &release_context>;
using WorkerHandle = Owned<ucp_worker_h, &release_worker>;
using RkeyHandle = Owned<ucp_rkey_h, &release_rkey>;

// A registration of local memory; unmapping needs its context.
class MemHandle {
 public:
  MemHandle() = default;
  ~MemHandle() { [[maybe_unused]] const ucs_status_t st = reset(); }
  MemHandle(const MemHandle&) = delete;
  MemHandle& operator=(const MemHandle&) = delete;

  // Maps [address, address + length) in `context`.
  [[nodiscard]] ucs_status_t map(ucp_context_h context, void* address, std::size_t length) {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = address;
    params.length = length;
    const ucs_status_t st = ucp_mem_map(context, &params, &memh_);
    if (st != UCS_OK) {
      memh_ = nullptr;
      return st;
    }
    context_ = context;
    return UCS_OK;
  }
  [[nodiscard]] ucp_mem_h get() const { return memh_; }
  [[nodiscard]] ucp_context_h context() const { return context_; }
  [[nodiscard]] explicit operator bool() const { return memh_ != nullptr; }
  // Unmaps; the handle is gone either way. Returns ucp_mem_unmap's status.
  [[nodiscard]] ucs_status_t reset() {
    if (memh_ == nullptr) return UCS_OK;
    const ucs_status_t st = ucp_mem_unmap(context_, std::exchange(memh_, nullptr));
    context_ = nullptr;
    return st;
  }

 private:
  ucp_context_h context_ = nullptr;
  ucp_mem_h memh_ = nullptr;
};

// An endpoint; closing needs its worker (to drive the close).
class EndpointHandle {
 public:
  EndpointHandle() = default;
  ~EndpointHandle() { [[maybe_unused]] const ucs_status_t st = close(nullptr); }
  EndpointHandle(const EndpointHandle&) = delete;
  EndpointHandle& operator=(const EndpointHandle&) = delete;

  [[nodiscard]] ucs_status_t create(ucp_worker_h worker, const ucp_ep_params_t& params) {
    const ucs_status_t st = ucp_ep_create(worker, &params, &ep_);
    if (st != UCS_OK) {
      ep_ = nullptr;
      return st;
    }
    worker_ = worker;
    return UCS_OK;
  }
  [[nodiscard]] ucp_ep_h get() const { return ep_; }
  [[nodiscard]] explicit operator bool() const { return ep_ != nullptr; }

  // Force-closes the endpoint, which completes its requests with
  // UCS_ERR_CANCELED, and drives the worker (bounded) until the close is
  // done. The close request counts in *live_requests while it is awaited.
  // The handle is gone either way; returns the close's status.
  [[nodiscard]] ucs_status_t close(std::atomic<std::uint64_t>* live_requests) {
    if (ep_ == nullptr) return UCS_OK;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t request = ucp_ep_close_nbx(std::exchange(ep_, nullptr), &params);
    if (UCS_PTR_IS_ERR(request)) return UCS_PTR_STATUS(request);
    if (request == nullptr) return UCS_OK;
    if (live_requests != nullptr) live_requests->fetch_add(1, std::memory_order_relaxed);
    ucs_status_t st = UCS_OK;
    const auto deadline = std::chrono::steady_clock::now() + kDrainTimeout;
    while ((st = ucp_request_check_status(request)) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    // Freed even if still in progress: UCX then releases it on completion.
    ucp_request_free(request);
    if (live_requests != nullptr) live_requests->fetch_sub(1, std::memory_order_relaxed);
    return st;
  }

 private:
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
};

}  // namespace kvxfer::internal::ucx
