// SPDX-License-Identifier: Apache-2.0
// What the UCX lane asks of UCX, computed from the user's engine_config and
// the environment: the keys for ucp_config_modify (the user's, and our
// defaults where neither the user nor the environment set them), the
// effective UCX_TLS, and kvxfer's own KVXFER_SCATTER_* knobs (KVXFER_CMA_*
// are the same-host lane's: engines/cma/cma_config.h). A pure function,
// so that every rule can be tested without a UCX context.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace kvxfer::internal::ucx {

// Scatter writes: a write whose runs average at most this many bytes goes as
// scatter messages of about kScatterChunkBytes each. Both can be set per
// transport through engine_config (KVXFER_SCATTER_MAX_RUN,
// KVXFER_SCATTER_CHUNK; a max run of 0 turns scatter writes off).
inline constexpr std::uint64_t kScatterMaxRunBytes = 64 * 1024;
// Just under the 1M TCP segment we set, so that a message (chunk, header of
// up to 1024 runs, UCX's own headers) goes in one segment.
inline constexpr std::uint64_t kScatterChunkBytes = 992 * 1024;

// The progress thread's longest nap while requests are in flight: what a
// post may wait to be sent when none of their events comes first.
inline constexpr std::int64_t kNapMicros = 200;
// After the lane's last work, how long the progress thread keeps napping,
// and in steps of how long: what a post then may wait instead of waking it.
inline constexpr std::int64_t kLingerMicros = 500;
inline constexpr std::int64_t kLingerStepMicros = 50;

struct UcxSettings {
  // Whether the context asks for UCP_FEATURE_RMA (puts). Only where an RDMA
  // device is in use, unless engine_config KVXFER_RMA=on|off says otherwise:
  // without RMA, UCX installs no handler that writes a raw address a peer
  // sent, and every write goes as checked scatter messages.
  bool rma = false;
  // Keys (without the UCX_ prefix) and values for ucp_config_modify.
  std::map<std::string, std::string> overrides;
  // UCX_TLS as the context will see it ("all" when nobody set it; "^tcp"
  // when nobody set it and this host has an RDMA device).
  std::string tls = "all";
  // The user's UCX_TLS lets UCX's tcp transport run beside an RDMA device:
  // allowed (tests force it), and the lane warns once at start.
  bool tcp_beside_rdma = false;
  // What the UCX context gets: `tls` without shared-memory transports.
  // Same-host peers go through the CMA lane (lanes.cc), never UCX, and
  // UCX's shared-memory transports cost most of the worker's start-up
  // (15-20 ms of ucp_worker_create here against ~1 ms without them;
  // `kvxfer startup`).
  std::string context_tls = "^sm";
  std::uint64_t scatter_max_run = kScatterMaxRunBytes;
  std::uint64_t scatter_chunk_bytes = kScatterChunkBytes;
  // Where scatter messages are sent (KVXFER_POST): handed to the progress
  // thread, so that write_blocks only queues them (`handoff`, the default), or
  // sent by write_blocks itself on the caller's thread (`inline`, as before
  // issue 11; also what happens without a progress thread).
  bool post_handoff = true;
  // The progress thread's nice value (KVXFER_PROGRESS_NICE, -20..19), set
  // by the thread itself when it starts; nullopt leaves it as inherited. A
  // target that many initiators write to over TCP does all its receiving on
  // this one thread, which then competes for the cores with every other
  // process's threads: a negative value (it needs CAP_SYS_NICE or
  // RLIMIT_NICE) keeps it ahead of them (docs/performance.md, incast).
  std::optional<int> progress_nice;
  // How long the progress thread sleeps at most while UCX requests of the
  // lane are in flight (KVXFER_NAP_US, 0..100000 us). Their events wake it
  // anyway, so posts meanwhile are queued without waking it: no syscall on
  // the caller's thread. 0: every post to a sleeping thread wakes it.
  std::chrono::nanoseconds nap = std::chrono::microseconds(kNapMicros);
  // With nothing in flight, how long after the lane's last send or request
  // in flight the thread still naps (KVXFER_LINGER_US, 0..100000 us; 0:
  // sleeps at once), in naps of linger_step (KVXFER_LINGER_STEP_US,
  // 1..100000 us): a post meanwhile is sent at the end of the step, with no
  // wake. The cost is up to a step of delay for such a post, and a timer
  // wake-up per step for at most `linger` after each burst of work.
  std::chrono::nanoseconds linger = std::chrono::microseconds(kLingerMicros);
  std::chrono::nanoseconds linger_step = std::chrono::microseconds(kLingerStepMicros);
};

// The value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Throws std::runtime_error, naming the key, for a KVXFER_SCATTER_* value
// that is not a size or is out of range, a KVXFER_RMA value other than
// auto, on or off, a KVXFER_POST value other than handoff or inline, a
// KVXFER_PROGRESS_NICE value that is not an integer in -20..19, or a
// KVXFER_NAP_US value that is not an integer in 0..100000.
[[nodiscard]] UcxSettings compute_ucx_settings(
    const std::map<std::string, std::string>& engine_config, const EnvLookup& env,
    bool has_rdma_device);

// The process environment, for compute_ucx_settings.
[[nodiscard]] std::optional<std::string> process_env(const std::string& name);

// Whether this host has any RDMA device (where zero-copy matters).
[[nodiscard]] bool host_has_rdma_device();

}  // namespace kvxfer::internal::ucx
