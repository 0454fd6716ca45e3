// SPDX-License-Identifier: Apache-2.0
#include "engines/ucx/ucx_config.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include "common/size_setting.h"
#include "common/ucx_tls.h"

namespace kvxfer::internal::ucx {
UcxSettings compute_ucx_settings(const std::map<std::string, std::string>& engine_config,
                                 const EnvLookup& env, bool has_rdma_device) {
  UcxSettings out;
  out.rma = has_rdma_device;
  // engine_config keys go to ucp_config_modify without the UCX_ prefix.
  for (const auto& [raw_key, value] : engine_config) {
    // kvxfer's own knobs; everything else is UCX's.
    if (raw_key == "KVXFER_SCATTER_MAX_RUN") {
      out.scatter_max_run = parse_size_setting("UCX", raw_key, value);
      continue;
    }
    if (raw_key == "KVXFER_SCATTER_CHUNK") {
      out.scatter_chunk_bytes = parse_size_setting("UCX", raw_key, value);
      if (out.scatter_chunk_bytes < 4096 || out.scatter_chunk_bytes > (std::uint64_t{64} << 20)) {
        throw std::runtime_error(fmt::format(
            "kvxfer UCX: engine_config KVXFER_SCATTER_CHUNK={} is outside 4K..64M", value));
      }
      continue;
    }
    if (raw_key == "KVXFER_RMA") {
      if (value == "on") {
        out.rma = true;
      } else if (value == "off") {
        out.rma = false;
      } else if (value != "auto") {
        throw std::runtime_error(fmt::format(
            "kvxfer UCX: engine_config KVXFER_RMA={} is not one of auto, on, off", value));
      }
      continue;
    }
    if (raw_key == "KVXFER_POST") {
      if (value == "handoff" || value == "inline") {
        out.post_handoff = value == "handoff";
      } else {
        throw std::runtime_error(fmt::format(
            "kvxfer UCX: engine_config KVXFER_POST={} is not one of handoff, inline", value));
      }
      continue;
    }
    // The other lanes' settings (engines/cma/cma_config.h,
    // engines/tcp/tcp_config.h) and the lane list (lanes.cc): not UCX's.
    if (std::string_view(raw_key).starts_with("KVXFER_CMA_") ||
        std::string_view(raw_key).starts_with("KVXFER_TCP_") || raw_key == "KVXFER_LANES") {
      continue;
    }
    if (raw_key == "KVXFER_PROGRESS_NICE") {
      int nice = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), nice);
      if (ec != std::errc{} || end != value.data() + value.size() || nice < -20 || nice > 19) {
        throw std::runtime_error(fmt::format(
            "kvxfer UCX: engine_config KVXFER_PROGRESS_NICE={} is not an integer in -20..19",
            value));
      }
      out.progress_nice = nice;
      continue;
    }
    if (raw_key == "KVXFER_NAP_US" || raw_key == "KVXFER_LINGER_US" ||
        raw_key == "KVXFER_LINGER_STEP_US") {
      // A step of 0 would be a thread that never sleeps.
      const std::int64_t least = raw_key == "KVXFER_LINGER_STEP_US" ? 1 : 0;
      std::int64_t micros = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), micros);
      if (ec != std::errc{} || end != value.data() + value.size() || micros < least ||
          micros > 100'000) {
        throw std::runtime_error(
            fmt::format("kvxfer UCX: engine_config {}={} is not an integer in {}..100000", raw_key,
                        value, least));
      }
      (raw_key == "KVXFER_NAP_US"      ? out.nap
       : raw_key == "KVXFER_LINGER_US" ? out.linger
                                       : out.linger_step) = std::chrono::microseconds(micros);
      continue;
    }
    std::string_view key = raw_key;
    if (key.starts_with("UCX_")) key.remove_prefix(4);
    out.overrides[std::string(key)] = value;
  }
  if (auto tls = env("UCX_TLS")) out.tls = *tls;
  if (auto it = out.overrides.find("TLS"); it != out.overrides.end()) out.tls = it->second;
  // Where the UCX lane serves RDMA, remote peers without RDMA have the tcp
  // lane: UCX's tcp transport, whose listener executes any client's PUT
  // (docs/reliability.md), is left out unless the user names it.
  if (has_rdma_device) {
    if (!env("UCX_TLS") && !out.overrides.contains("TLS")) {
      out.tls = "^tcp";
      out.overrides["TLS"] = out.tls;
    } else {
      out.tcp_beside_rdma = tls_allows(out.tls, {"tcp"});
    }
  }
  out.context_tls = tls_without_shared_memory(out.tls);
  if (out.context_tls != out.tls) out.overrides["TLS"] = out.context_tls;

  // The one rule for every default below: the environment (UCX_<prefix><key>)
  // or the user's engine_config (<key> or <prefix><key>) wins over ours.
  // (1.13 applies transport keys without their TCP_ prefix, and warns when
  // no transport in use takes them, hence the TCP ones only when tcp may be
  // used.)
  const auto set_default = [&](const std::string& prefix, const std::string& key,
                               const std::string& value) {
    if (env("UCX_" + prefix + key) || out.overrides.contains(key) ||
        out.overrides.contains(prefix + key)) {
      return;
    }
    out.overrides[key] = value;
  };
  if (!tls_allows(out.tls, {"tcp"})) return out;

  // Without RMA, no put may reach the wire: UCX 1.13's TCP transport would
  // otherwise advertise put_zcopy, and a target carries out a TCP put by
  // writing the address the message names, unchecked. With PUT_ENABLE=n our
  // iface does not advertise it, so no peer's UCP selects it towards us. (The
  // uct tcp receive path still handles a PUT_REQ sent by a client speaking
  // uct's wire protocol directly: docs/reliability.md, Limits.)
  if (!out.rma) set_default("TCP_", "PUT_ENABLE", "n");

  // Every write over TCP is active messages (scatter writes; with RMA, UCX's
  // emulated puts too), sent in segments of TX_SEG_SIZE (8K by default). A
  // scatter message that fits one segment is received into UCX's buffer and
  // copied once into the pool; one that spans several is first reassembled
  // (one more copy). 1M segments with scatter chunks just under 1M (one
  // segment each) moved 64 x 2 MiB contiguous writes at 1.3-2.0 GB/s here,
  // against 1.0-1.7 for 64K segments and 256K chunks, and 0.75-1.4 for the
  // puts this replaced (docs/ucx-engine.md). The receive segment must hold
  // a peer's send segment, so both go up together; a peer left at UCX's
  // defaults (RX 64K) cannot take these messages, a kvxfer peer can.
  set_default("TCP_", "TX_SEG_SIZE", "1M");
  set_default("TCP_", "RX_SEG_SIZE", "1M");
  // Zero-copy sends over TCP: UCX 1.13 can leave a freed TCP endpoint in its
  // event set when an endpoint is force-closed while a multi-fragment
  // zero-copy active message is still going out (our scatter writes); the
  // next event on that socket then calls through freed memory (6 crashes in
  // 20 runs of UcxScatterTest.DisconnectEndsEveryScatterWriteStillAwaitingAcks,
  // 0 in 20 with copies). Over TCP the copy costs nothing measurable (bench,
  // both ways within noise), so where TCP is the only network (no RDMA
  // device), sends copy. A user's own ZCOPY_THRESH wins.
  if (!has_rdma_device) set_default("", "ZCOPY_THRESH", "inf");
  // TCP keepalive turns a silent idle peer (host gone, link cut) into an
  // endpoint error, hence REMOTE_DISCONNECT: UCX's defaults (idle 10 s, then
  // the system's 9 probes 2 s apart) take about 28 s; these take 10 s (5 s
  // idle + 5 probes 1 s apart). A peer with data in flight is never probed
  // (Linux holds keepalive while data is unacknowledged): stall_timeout bounds
  // that case. See docs/reliability.md.
  set_default("TCP_", "KEEPIDLE", "5s");
  set_default("TCP_", "KEEPINTVL", "1s");
  set_default("TCP_", "KEEPCNT", "5");
  return out;
}

std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

bool host_has_rdma_device() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

}  // namespace kvxfer::internal::ucx
