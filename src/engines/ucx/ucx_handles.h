// SPDX-License-Identifier: Apache-2.0
// Owners for the UCX objects the lane holds, so that every path, the error
// paths included, releases each exactly once. reset() releases early
// (shutdown's order is explicit).
#pragma once

#include <ucp/api/ucp.h>

#include <utility>

namespace kvxfer::internal::ucx {

template <typename H, void (*Release)(H)>
class Owned {
 public:
  Owned() = default;
  ~Owned() { reset(); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  // Movable, so that a vector can hold them (a peer's rkeys, one per region).
  Owned(Owned&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  [[nodiscard]] H get() const { return handle_; }
  [[nodiscard]] explicit operator bool() const { return handle_ != nullptr; }
  // The out-parameter of the call that creates the handle (on an empty
  // owner); set it back to nullptr when that call fails.
  [[nodiscard]] H* out() { return &handle_; }
  void reset() {
    if (handle_ != nullptr) Release(std::exchange(handle_, nullptr));
  }

 private:
  H handle_ = nullptr;
};

using ConfigHandle = Owned<ucp_config_t*, &ucp_config_release>;
using ContextHandle = Owned<ucp_context_h, &ucp_cleanup>;
// Destroying the worker completes what UCX still holds with UCS_ERR_CANCELED.
using WorkerHandle = Owned<ucp_worker_h, &ucp_worker_destroy>;
using RkeyHandle = Owned<ucp_rkey_h, &ucp_rkey_destroy>;

}  // namespace kvxfer::internal::ucx
