// SPDX-License-Identifier: Apache-2.0
// The engine's settings, read once when a transport of backend "UCX" starts:
// Options::engine_config and the process environment, with one rule for
// every key: engine_config wins, the environment applies where
// engine_config is silent, the lane's default where neither sets it.
//
// This module knows every KVXFER_* name (known_keys(): who owns it, what it
// takes, its default, where it is documented). It refuses a KVXFER_* name it
// does not know, in engine_config or in the environment, naming it and the
// nearest known one, and the names of removed settings with why they went.
// It does not judge values: each lane parses its own keys, and gets only
// those (CmaKeys, TcpKeys, UcxKeys), never the whole map. Every other
// engine_config key is UCX's and goes to the UCX lane only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace kvxfer::internal {

// One setting as the user gave it.
struct Setting {
  std::string key;
  std::string value;
  bool from_environment = false;  // else engine_config

  // "engine_config KVXFER_CMA_MAP=yes" or "environment KVXFER_CMA_MAP=yes":
  // how every message about a value names it.
  [[nodiscard]] std::string said() const;
};

// Throws std::runtime_error "kvxfer <lane>: <setting.said()> <why>", the one
// shape of a refused value.
[[noreturn]] void refuse(std::string_view lane, const Setting& setting, std::string_view why);

// "65536", "64K", "1M", "1G" (K, M, G: powers of 1024, either case): the
// bytes it says, or nothing when it is not a size or overflows 64 bits.
[[nodiscard]] std::optional<std::uint64_t> parse_size(std::string_view text);

// The same-host lane's keys (cma/cma_config.h parses them).
struct CmaKeys {
  std::optional<Setting> map;    // KVXFER_CMA_MAP
  std::optional<Setting> slice;  // KVXFER_CMA_SLICE
};

// The tcp lane's keys (tcp/tcp_config.h parses them).
struct TcpKeys {
  std::optional<Setting> address;  // KVXFER_TCP_ADDRESS
  std::optional<Setting> ports;    // KVXFER_TCP_PORTS
  std::optional<Setting> stall;    // KVXFER_TCP_STALL_MS
  std::optional<Setting> encrypt;  // KVXFER_TCP_ENCRYPT
};

// The UCX lane's keys (ucx/ucx_config.h reads them).
struct UcxKeys {
  std::optional<Setting> rma;  // KVXFER_RMA
  // Every engine_config key that is not KVXFER_*, as given (with or
  // without UCX_): UCX's configuration, for ucp_config_modify.
  std::map<std::string, std::string> ucx_config;
  // The environment's UCX_TLS. UCX reads its environment itself; the lane
  // needs this one for its own TLS rules.
  std::optional<std::string> environment_tls;
};

struct EngineSettings {
  std::optional<Setting> lanes;  // KVXFER_LANES (lanes.cc parses it)
  // KVXFER_PRETOUCH: the transport's, not a lane's (core/transport.cc
  // parses it; the lanes leave it alone).
  std::optional<Setting> pretouch;
  CmaKeys cma;
  TcpKeys tcp;
  UcxKeys ucx;
};

// A KVXFER_* name kvxfer knows.
struct KnownKey {
  const char* name;
  // "engine" (lanes.cc, or the core for KVXFER_PRETOUCH), "cma", "tcp" or
  // "ucx": a setting of the engine, taken from engine_config or the
  // environment. Otherwise what reads it from the environment alone ("the
  // library's logger", "kvxfer bench", a test): not the engine's, refused
  // in engine_config, left alone in the environment.
  const char* owner;
  const char* values;         // what it takes
  const char* default_value;  // nullptr: unset
  const char* documented_in;  // the page that documents it
  // Where read_settings() puts it; nullptr for a name the engine leaves to
  // its reader.
  std::optional<Setting>* (*slot)(EngineSettings&);
};

[[nodiscard]] std::span<const KnownKey> known_keys();

// Whether `name` is in kvxfer's namespace: it starts with KVXFER_, in any
// case (an engine_config key "kvxfer_lanes" is ours, misspelt, not UCX's).
[[nodiscard]] bool is_kvxfer_name(std::string_view name);

// The known name nearest to `name` (fewest letters added, removed, changed
// or swapped; case ignored), first in known_keys() order on a tie.
[[nodiscard]] std::string_view nearest_known_key(std::string_view name);

// The engine's settings from engine_config and `environment` (the
// process's KVXFER_* variables and UCX_TLS: process_environment()). Throws
// std::runtime_error naming the key for a KVXFER_* name it does not know
// (with the nearest known one), for a removed setting (with why it went),
// and for a name that is not the engine's set in engine_config. Values are
// not looked at: each lane's parser judges its own.
[[nodiscard]] EngineSettings read_settings(const std::map<std::string, std::string>& engine_config,
                                           const std::map<std::string, std::string>& environment);

// The process environment's variables read_settings() looks at: every
// KVXFER_* one (any case) and UCX_TLS.
[[nodiscard]] std::map<std::string, std::string> process_environment();

}  // namespace kvxfer::internal
