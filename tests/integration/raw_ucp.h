// SPDX-License-Identifier: Apache-2.0
// A bare UCP worker over TCP for the hostile-peer tests: it speaks the UCX
// lane's wire formats (wire/fence.h, wire/notify.h) by hand, or UCP's own
// RMA, as a broken or hostile peer could. Single-threaded: the test thread
// drives it. Every wait is bounded.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine.h"
#include "engines/ucx/ucx_compat.h"
#include "wire/fence.h"
#include "wire/notify.h"
#include "wire/peer_blob.h"

namespace kvxfer::it {

namespace ucx = internal::ucx;

class RawWorker {
 public:
  // features: UCP_FEATURE_AM, optionally | UCP_FEATURE_RMA.
  explicit RawWorker(std::uint64_t features = UCP_FEATURE_AM) {
    ucp_config_t* config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &config), "config_read");
    check(ucp_config_modify(config, "TLS", "tcp"), "config_modify");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = features;
    const ucs_status_t st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    check(st, "init");
    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context_, &wparams, &worker_), "worker_create");
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    check(ucp_worker_query(worker_, &attr), "worker_query");
    const auto* a = reinterpret_cast<const std::uint8_t*>(attr.address);
    address_.assign(a, a + attr.address_length);
    ucp_worker_release_address(worker_, attr.address);
  }
  ~RawWorker() {
    for (ucp_ep_h ep : eps_) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      wait(ucp_ep_close_nbx(ep, &p));
    }
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }
  RawWorker(const RawWorker&) = delete;
  RawWorker& operator=(const RawWorker&) = delete;

  [[nodiscard]] ucp_context_h context() const { return context_; }
  [[nodiscard]] ucp_worker_h worker() const { return worker_; }
  [[nodiscard]] const std::vector<std::uint8_t>& address() const { return address_; }

  void set_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg) {
    ucp_am_handler_param_t h{};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG;
    h.id = id;
    h.cb = cb;
    h.arg = arg;
    check(ucp_worker_set_am_recv_handler(worker_, &h), "set_am_recv_handler");
  }

  // An endpoint to the worker at `address` (closed by the destructor).
  ucp_ep_h connect(std::span<const std::uint8_t> address) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h out = nullptr;
    check(ucp_ep_create(worker_, &ep, &out), "ep_create");
    eps_.push_back(out);
    return out;
  }

  // Sends one eager active message and drives it to its end; its status.
  ucs_status_t send(ucp_ep_h ep, unsigned id, std::span<const std::uint8_t> header,
                    std::span<const std::uint8_t> payload, std::uint32_t flags) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = flags | UCP_AM_SEND_FLAG_EAGER;
    return wait(ucp_am_send_nbx(ep, id, header.data(), header.size(),
                                payload.empty() ? nullptr : payload.data(), payload.size(), &p));
  }

  // Drives the worker until `done()` or `timeout`; whether done() held.
  bool progress_until(const std::function<bool()>& done,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      ucp_worker_progress(worker_);
    }
    return true;
  }

  // Drives a request to its end (bounded); its status, UCS_INPROGRESS if it
  // did not end in time.
  ucs_status_t wait(ucs_status_ptr_t req,
                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (req == nullptr) return UCS_OK;
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ucs_status_t st = UCS_INPROGRESS;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(req);
    return st;
  }

  static void check(ucs_status_t st, const char* what) {
    if (st != UCS_OK) {
      throw std::runtime_error(std::string("ucp ") + what + " failed: " + ucs_status_string(st));
    }
  }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::uint8_t> address_;
  std::vector<ucp_ep_h> eps_;
};

// A target that takes fences and notifications but queues nothing: it
// records what came (and through which reply endpoint) and acks only when
// told, with whatever the test says. It publishes an rkey of a small buffer
// of its own, as a kvxfer agent with RMA does (the lane refuses a peer
// without one); nobody puts to it.
class RawTarget {
 public:
  struct Note {
    wire::NotifyHeader header;  // name cleared: it points into UCX's buffer
    ucp_ep_h reply_ep = nullptr;
  };
  struct SeenFence {
    wire::Fence fence;  // name cleared, kept in `name`
    std::string name;
  };

  explicit RawTarget(std::uint64_t token)
      : raw_(UCP_FEATURE_AM | UCP_FEATURE_RMA), token_(token), buffer_(kBufferLen) {
    raw_.set_handler(wire::kNotifyAmId, &RawTarget::on_note, this);
    raw_.set_handler(wire::kFenceAmId, &RawTarget::on_fence, this);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = buffer_.data();
    mp.length = buffer_.size();
    RawWorker::check(ucp_mem_map(raw_.context(), &mp, &memh_), "mem_map");
    void* packed = nullptr;
    std::size_t len = 0;
    RawWorker::check(internal::ucx_compat::pack_rkey(raw_.context(), memh_, &packed, &len),
                     "rkey_pack");
    rkey_.assign(static_cast<std::uint8_t*>(packed), static_cast<std::uint8_t*>(packed) + len);
    internal::ucx_compat::release_packed_rkey(packed);
  }
  ~RawTarget() { ucp_mem_unmap(raw_.context(), memh_); }
  RawTarget(const RawTarget&) = delete;
  RawTarget& operator=(const RawTarget&) = delete;

  static constexpr std::uint64_t kBlocks = 4;
  static constexpr std::uint64_t kBlockLen = 16 * 1024;  // as the tests' own pools
  static constexpr std::size_t kBufferLen = kBlocks * kBlockLen;

  RawWorker& raw() { return raw_; }
  // The engine blob a kvxfer initiator connects to.
  [[nodiscard]] std::vector<std::uint8_t> blob() const {
    wire::PeerBlob b;
    b.cookie_epoch = token_;
    b.worker_address = raw_.address();
    b.rkey = rkey_;
    return wire::encode_blob(b);
  }
  // The region that blob describes, under `name`.
  [[nodiscard]] internal::RemoteRegion region(const std::string& name) const {
    const auto base = reinterpret_cast<std::uintptr_t>(buffer_.data());
    return {name, base, kBlocks, kBlockLen, 0, "", {internal::MemRegion{0, base, kBlocks * kBlockLen}}};
  }
  [[nodiscard]] const std::vector<Note>& notes() const { return notes_; }
  [[nodiscard]] const std::vector<SeenFence>& fences() const { return fences_; }

  // Acks `n` through the endpoint it came by, as the lane's handler does.
  ucs_status_t ack(const Note& n, std::int32_t status) {
    std::vector<std::uint8_t> bytes(wire::kAckLen);
    wire::encode_ack(bytes.data(), wire::NotifyAck{n.header.slot, n.header.sequence, status});
    return raw_.send(n.reply_ep, wire::kNotifyAckAmId, bytes, {}, UCP_AM_SEND_FLAG_REPLY);
  }

 private:
  static ucs_status_t on_note(void* arg, const void* header, std::size_t header_length, void*,
                              std::size_t, const ucp_am_recv_param_t* param) {
    Note n;
    if (!wire::decode_notify_header({static_cast<const std::uint8_t*>(header), header_length},
                                   &n.header)) {
      return UCS_OK;
    }
    n.header.name = {};
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) n.reply_ep = param->reply_ep;
    static_cast<RawTarget*>(arg)->notes_.push_back(n);
    return UCS_OK;
  }
  static ucs_status_t on_fence(void* arg, const void* header, std::size_t header_length, void*,
                               std::size_t, const ucp_am_recv_param_t*) {
    SeenFence f;
    if (wire::decode_fence({static_cast<const std::uint8_t*>(header), header_length}, &f.fence)) {
      f.name.assign(f.fence.name);
      f.fence.name = {};
      static_cast<RawTarget*>(arg)->fences_.push_back(f);
    }
    return UCS_OK;
  }

  RawWorker raw_;
  std::uint64_t token_;
  std::vector<std::uint8_t> buffer_;
  ucp_mem_h memh_ = nullptr;
  std::vector<std::uint8_t> rkey_;
  std::vector<Note> notes_;
  std::vector<SeenFence> fences_;
};

}  // namespace kvxfer::it
