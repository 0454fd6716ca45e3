// SPDX-License-Identifier: Apache-2.0
// The target end of a demo or bench run, and the initiator's handle to it.
//
// A target is `kvxfer target` spawned on this machine and driven over pipes,
// or `kvxfer bench --role target --listen HOST:PORT` on another host, driven
// over one TCP connection. Both speak the same line protocol:
//
//   target    -> initiator: HELLO kvxfer-target protocol=1 version=X.Y.Z
//   initiator -> target:    OPEN block_len=N region=BYTES fingerprint=HEX
//   target    -> initiator: READY metadata=HEX base=ADDR num_blocks=N block_len=N fingerprint=HEX
//                       or  REFUSED <why, in words>
//   initiator -> target:    VERIFY seed=S count=N, then N lines "<remote> <local>"
//   target    -> initiator: VERIFIED good=G bad=B
//   initiator -> target:    CLOSE (the target drops its Transport; OPEN may follow)
//   initiator -> target:    QUIT  (the session ends)
//
// OPEN registers a fresh pool of `region` bytes (every page touched) as
// region / block_len blocks. A target refuses a block length other than its
// own --block-len (when it has one), a region over its --region, and a config
// fingerprint other than its own, and says which and why. Every read has a
// deadline and every line and list a size cap.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "channel.h"
#include "handshake.h"

namespace kvxfer::tools {

class Subprocess;

// Largest VERIFY list a target accepts.
inline constexpr std::uint64_t kMaxVerifyPairs = 1u << 22;

class TargetProcess {
 public:
  // Spawns this executable as `kvxfer <args>` (e.g. {"target", "--tls", "sm"})
  // and waits for its HELLO.
  static std::unique_ptr<TargetProcess> spawn(const std::vector<std::string>& args);
  // Connects to a listening target (`kvxfer bench --role target --listen`).
  static std::unique_ptr<TargetProcess> connect(const HostPort& where);
  ~TargetProcess();
  TargetProcess(const TargetProcess&) = delete;
  TargetProcess& operator=(const TargetProcess&) = delete;

  // Asks for a pool of `region_bytes` as blocks of `block_len`. Throws
  // TargetRefused when the target will not serve it, and when the target's
  // answer disagrees with what we asked for.
  const TargetGeometry& open(std::uint64_t block_len, std::uint64_t region_bytes,
                             const std::string& fingerprint);
  [[nodiscard]] const TargetGeometry& geometry() const { return geometry_; }
  // The target's kvxfer version, from its HELLO.
  [[nodiscard]] const std::string& version() const { return version_; }
  [[nodiscard]] const std::string& name() const { return channel_->peer_name(); }
  // The spawned target's pid; 0 for a target on another host.
  [[nodiscard]] pid_t pid() const;

  // Asks the target to check remote block r against local block l of a pool
  // filled with `seed`, for each (r, l). Returns (good, bad).
  std::pair<std::uint64_t, std::uint64_t> verify(
      std::uint64_t seed, const std::vector<std::pair<std::int64_t, std::int64_t>>& pairs);
  // Asks the target to fill every block i of its opened region with the
  // pattern of block i for `seed` (what --op read reads back). Throws
  // ChannelError when it cannot.
  void fill(std::uint64_t seed);
  // bench --op notify: asks the target to take `count` notifications
  // (notify_probe.h) and returns once it is listening; notes_taken() then
  // waits for its account of them. Throws ChannelError when it cannot.
  void notes_begin(std::uint64_t count, std::uint64_t seed);
  struct NotesTaken {
    std::uint64_t got = 0;
    std::uint64_t bad = 0;  // undecodable, or its block lacked its bytes
    std::uint64_t out_of_order = 0;
    double p50_us = 0, p99_us = 0, max_us = 0, mean_us = 0;  // post to delivery
  };
  NotesTaken notes_taken();
  // The raw TCP baseline: asks the target to take one TCP connection and
  // `bytes` into its pool, connects to it at `host` and streams them from
  // src (wrapping at src_len). Returns the seconds from connect to the
  // target's confirmation. Needs an opened region.
  double raw_stream(const std::string& host, const std::uint8_t* src, std::uint64_t src_len,
                    std::uint64_t bytes);
  // Drops the target's Transport and pool registration (the pool is kept
  // for a next OPEN of the same size).
  void close_region();
  // Ends the session; for a spawned target, reaps it and returns its exit
  // status (0 for a remote one).
  int quit();

 private:
  TargetProcess(std::unique_ptr<Subprocess> child, std::unique_ptr<LineChannel> channel);
  void read_hello();

  std::unique_ptr<Subprocess> child_;
  std::unique_ptr<LineChannel> channel_;
  std::string version_;
  TargetGeometry geometry_;
};

// The target side's settings, from its command line.
struct TargetConfig {
  std::string tls;                        // --tls as given ("sm", "tcp", a UCX_TLS string)
  std::uint64_t max_region = 1ull << 30;  // largest pool an initiator may ask for
  std::uint64_t block_len = 0;            // 0: any block length; else only this one
  // Extra Options::engine_config of the target's Transport (bench
  // --target-engine, target --engine), e.g. KVXFER_CMA_SLICE=64K.
  std::map<std::string, std::string> engine;
};

// The command line of a spawned `kvxfer target` serving pools of up to
// `region` bytes, with `engine` as extra engine_config (--engine KEY=VALUE).
std::vector<std::string> target_command(const std::string& tls, std::uint64_t region,
                                        const std::map<std::string, std::string>& engine);

// `kvxfer target`: one session on stdin/stdout, until QUIT or EOF.
int run_target(const TargetConfig& config);
// `kvxfer bench --role target --listen HOST:PORT`: serves initiators one
// after another (`sessions` of them; 0: until killed). Prints
// "listening on HOST:PORT" (the bound port when 0 was asked) on stdout.
int run_target_listener(const HostPort& where, const TargetConfig& config, int sessions);

}  // namespace kvxfer::tools
