// A target process driven over pipes: the initiator side spawns
// `kvxfer target ...` and speaks a small line protocol with it.
//
//   target -> initiator:  READY <metadata hex> <base> <num_blocks> <block_len>
//   initiator -> target:  VERIFY <seed> <n>, then n lines "<remote> <local>"
//   target -> initiator:  VERIFIED <good> <bad>
//   initiator -> target:  QUIT   (target closes its transport and exits 0)
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kvxfer::tools {

struct TargetGeometry {
  std::vector<std::uint8_t> metadata;
  std::uintptr_t base = 0;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
};

class TargetProcess {
 public:
  // Spawns this executable with `args` (e.g. {"target", "--block-len", ...})
  // and waits for its READY line.
  explicit TargetProcess(const std::vector<std::string>& args);
  ~TargetProcess();
  TargetProcess(const TargetProcess&) = delete;
  TargetProcess& operator=(const TargetProcess&) = delete;

  [[nodiscard]] const TargetGeometry& geometry() const { return geometry_; }
  [[nodiscard]] pid_t pid() const { return pid_; }

  // Asks the target to check remote block r against local block l of a
  // pool filled with `seed`, for each (r, l). Returns (good, bad).
  std::pair<std::uint64_t, std::uint64_t> verify(
      std::uint64_t seed, const std::vector<std::pair<std::int64_t, std::int64_t>>& pairs);
  // Sends QUIT and reaps the process; returns its exit status.
  int quit();

 private:
  std::string read_line();

  pid_t pid_ = -1;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
  TargetGeometry geometry_;
};

// The target side: serves the protocol on stdin/stdout until QUIT or EOF.
int run_target(std::uint64_t pool_bytes, std::uint64_t block_len,
               const std::map<std::string, std::string>& engine_config);

std::string to_hex(const std::vector<std::uint8_t>& bytes);
std::vector<std::uint8_t> from_hex(const std::string& hex);

}  // namespace kvxfer::tools
