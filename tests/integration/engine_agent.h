// SPDX-License-Identifier: Apache-2.0
// One UCX engine in this process and the pool it registered, for the
// engine-level integration tests (two such agents talk to each other).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "it_lanes.h"
#include "engine.h"
#include "it_support.h"

namespace kvxfer::it {

inline std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

struct EngineAgent {
  // `engine_config` must name the transports ("TLS"). The pool holds the
  // pattern of generation `gen`.
  // Without `progress_thread`, only progress() moves the engine's worker.
  EngineAgent(std::string name_in, std::map<std::string, std::string> engine_config,
              std::uint64_t num_blocks, std::uint64_t block_len, std::uint64_t gen = 1,
              bool progress_thread = true)
      : name(std::move(name_in)), pool(num_blocks, block_len) {
    pool.fill_generation(gen);
    options.backends = {"UCX"};
    options.progress_thread = progress_thread;
    options.engine_config = std::move(engine_config);
    engine = internal::make_ucx_engine(
        internal::EngineConfig{name, Region{pool.base(), num_blocks, block_len}, &options});
  }
  EngineAgent(std::string name_in, const std::string& tls, std::uint64_t num_blocks,
              std::uint64_t block_len)
      : EngineAgent(std::move(name_in), it::with_tls({}, tls), num_blocks, block_len) {}
  ~EngineAgent() {
    if (engine) engine->shutdown();
  }
  EngineAgent(const EngineAgent&) = delete;
  EngineAgent& operator=(const EngineAgent&) = delete;

  [[nodiscard]] internal::RemoteRegion region() const {
    return internal::RemoteRegion{name,
                                  reinterpret_cast<std::uintptr_t>(pool.base()),
                                  pool.num_blocks(),
                                  pool.block_len(),
                                  static_cast<std::uint32_t>(::getpid()),
                                  boot_id(),
                                  {internal::MemRegion{
                                      0, reinterpret_cast<std::uintptr_t>(pool.base()),
                                      pool.num_blocks() * pool.block_len()}}};
  }

  // One of the engine's counters (Engine::counters()).
  [[nodiscard]] std::uint64_t counter(const std::string& key) const {
    return engine->counters().at(key);
  }

  std::string name;
  MappedPool pool;
  Options options;
  std::unique_ptr<internal::Engine> engine;
};

// Polls `xfer` until it leaves kInProgress; returns {check error, state}.
inline std::pair<Status, Status> wait_state(
    internal::Engine& engine, internal::XferHandle xfer,
    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    engine.progress();
    Status state = Status::kInProgress;
    const Status check = engine.check(xfer, &state);
    if (check != Status::kSuccess || state != Status::kInProgress ||
        std::chrono::steady_clock::now() > deadline) {
      return {check, state};
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace kvxfer::it
