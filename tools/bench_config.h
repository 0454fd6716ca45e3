// SPDX-License-Identifier: Apache-2.0
// What the two ends of a bench or demo run must agree on, in one place: the
// UCX transports, the engine configuration, and the config fields whose
// fingerprint both Transports carry (a mismatch is refused in the handshake,
// and again by add_remote_peer).
#pragma once

#include <map>
#include <string>

#include "kvxfer/transport.h"
#include "kvxfer/ucx_tls.h"

namespace kvxfer::tools {

// Bumped when the block contents (pattern.h) or the target protocol change
// meaning, so old and new tools refuse each other instead of failing verify.
// 2: STREAM (raw TCP baseline); 3: FILL (the target's pool for --op read)
// 4: NOTES (--op notify)
inline constexpr const char* kBenchProtocol = "4";
inline constexpr const char* kPatternName = "mix64-v1";

// UCX_TLS for a --tls value: "sm" is sm,self; "tcp" is tcp; anything else is
// taken as a UCX_TLS string; "" keeps UCX's own choice.
inline std::string ucx_tls_for(const std::string& tls) {
  if (tls == "sm") return "sm,self";
  return tls;
}

// Engine overrides for a Transport. Other UCX knobs travel in the
// environment (see BenchArgs::ucx). UCX_TLS speaks for the ucx lane only, so
// a TCP-only --tls also names the tcp lane (KVXFER_LANES=tcp): between two
// processes of this host the same-host lane would serve them otherwise.
// --lane and --engine KVXFER_LANES=... override it.
inline std::map<std::string, std::string> engine_config_for(const std::string& tls) {
  const std::string t = ucx_tls_for(tls);
  if (t.empty()) return {};
  if (kvxfer::ucx_tls_is_tcp_only(t)) return {{"TLS", t}, {"KVXFER_LANES", "tcp"}};
  return {{"TLS", t}};
}

// The engine_config key (and environment variable, which wins over it) of
// the lanes a peer may get (src/engines/lanes.cc). `kvxfer bench --lane`
// sets it on both sides.
inline constexpr const char* kLanesKey = "KVXFER_LANES";

// The engine_config key of whether the UCX lane runs at all
// (src/engines/ucx/ucx_config.h): "auto" (the default) runs it only where
// an RDMA device is, since it writes with RDMA puts; "on" forces it, over
// UCX's tcp transport on a host without one.
inline constexpr const char* kRmaKey = "KVXFER_RMA";

// The engine_config key of the tcp lane's encryption (kvxfer bench
// --encrypt sets it on both sides).
inline constexpr const char* kEncryptKey = "KVXFER_TCP_ENCRYPT";

// Adds to `engine_config` what forces `lane` ("tcp" or "ucx"; "" adds
// nothing): KVXFER_LANES=lane, and for ucx KVXFER_RMA=on unless the
// configuration already sets KVXFER_RMA. `kvxfer bench --lane` applies it on
// both sides.
inline void add_lane_config(std::map<std::string, std::string>& engine_config,
                            const std::string& lane) {
  if (lane.empty()) return;
  engine_config[kLanesKey] = lane;
  if (lane != "ucx") return;
  engine_config.try_emplace(kRmaKey, "on");
  // UCX's tcp transport carries the puts here (hosts without RDMA): in
  // segments of 1M instead of UCX's 8K, which moved 1.6-1.8x more here. The
  // bench's choice for a test transport, not the lane's: on RDMA no segment
  // applies. Both sides need it (a receive segment must hold the sender's).
  engine_config.try_emplace("TX_SEG_SIZE", "1M");
  engine_config.try_emplace("RX_SEG_SIZE", "1M");
}

// Config fields of the tool's Transports. The transports are part of them:
// an sm initiator and a tcp target would not measure what either asked for.
inline std::map<std::string, std::string> bench_config_fields(const std::string& tls) {
  return {{"kvxfer.tool", "bench"},
          {"kvxfer.tool.protocol", kBenchProtocol},
          {"kvxfer.tool.pattern", kPatternName},
          {"kvxfer.tool.tls", ucx_tls_for(tls).empty() ? "default" : ucx_tls_for(tls)}};
}

// The Options of a bench or demo Transport for --tls `tls`: the config
// fields above and engine_config_for(tls). Callers add their lane and their
// users' engine_config.
inline Options bench_options(const std::string& tls) {
  Options options;
  options.config_fields = bench_config_fields(tls);
  options.engine_config = engine_config_for(tls);
  return options;
}

}  // namespace kvxfer::tools
