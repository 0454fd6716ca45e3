// SPDX-License-Identifier: Apache-2.0
// What the two ends of a bench or demo run must agree on, in one place: the
// UCX transports, the engine configuration, and the config fields whose
// fingerprint both Transports carry (a mismatch is refused in the handshake,
// and again by add_remote_peer).
#pragma once

#include <map>
#include <string>

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

// Config fields of the tool's Transports. The transports are part of them:
// an sm initiator and a tcp target would not measure what either asked for.
inline std::map<std::string, std::string> bench_config_fields(const std::string& tls) {
  return {{"kvxfer.tool", "bench"},
          {"kvxfer.tool.protocol", kBenchProtocol},
          {"kvxfer.tool.pattern", kPatternName},
          {"kvxfer.tool.tls", ucx_tls_for(tls).empty() ? "default" : ucx_tls_for(tls)}};
}

}  // namespace kvxfer::tools
