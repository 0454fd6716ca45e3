// SPDX-License-Identifier: Apache-2.0
// What the multi-process UCX tests stand on: a target process
// (kvxfer_it_target) driven over a pipe with one-line commands. The tests use
// the public API; engine-level ones also src/engine.h, src/wire/ and UCX itself.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "it_pool.h"

extern char** environ;

namespace kvxfer::it {

// The slow tier (CTest label `slow`, KVXFER_TEST_TIER=slow): tests that play
// rounds play their full budgets there, and a few rounds otherwise.
inline bool slow_tier() {
  const char* tier = std::getenv("KVXFER_TEST_TIER");
  return tier != nullptr && std::string_view(tier) == "slow";
}

struct TargetOptions {
  std::string name = "target";
  std::uint64_t num_blocks = 64;
  std::uint64_t block_len = 64 * 1024;
  std::string tls = "sm,self";
  bool progress_thread = true;
  // A thread of the target calls poll() in a loop (--poll-loop).
  bool poll_loop = false;
  // Extra engine_config entries (--config KEY=VALUE).
  std::map<std::string, std::string> engine_config;
  // Bytes of kGuardByte mapped right after the pool, not registered
  // (--guard-bytes; the "guard" command checks them).
  std::uint64_t guard_bytes = 0;
  // The pool is a kvxfer::SharedPool (--shared-pool): same-host initiators
  // map it and copy with memcpy.
  bool shared_pool = false;
  // The transport registers no pool (--no-pool); regions come with the
  // "regions" command.
  bool no_pool = false;
  // Network namespace to run in (`ip netns exec NETNS ...`, which execs, so
  // pid() is still the target's own pid); empty: this one.
  std::string netns;
};

// A kvxfer_it_target child. It registers a zeroed pool with a UCX transport,
// prints "ready <base> <num_blocks> <block_len> <metadata hex>", then answers
// commands (see it_target.cc) one line each.
class TargetProcess {
 public:
  explicit TargetProcess(const TargetOptions& options) : options_(options) { spawn(); }
  ~TargetProcess() { stop(); }
  TargetProcess(const TargetProcess&) = delete;
  TargetProcess& operator=(const TargetProcess&) = delete;

  [[nodiscard]] pid_t pid() const { return pid_; }
  [[nodiscard]] std::uintptr_t base_addr() const { return base_addr_; }
  [[nodiscard]] std::uint64_t num_blocks() const { return num_blocks_; }
  [[nodiscard]] std::uint64_t block_len() const { return block_len_; }
  [[nodiscard]] const std::vector<std::uint8_t>& metadata() const { return metadata_; }

  // Sends one command and returns the reply line.
  std::string request(const std::string& line,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    send(line);
    return read_line(timeout);
  }

  // "ok" when every remote[i] holds the pattern of local[i] in `gen`.
  std::string verify(std::uint64_t gen, const std::vector<std::int64_t>& local,
                     const std::vector<std::int64_t>& remote) {
    std::ostringstream cmd;
    cmd << "verify " << gen << ' ' << local.size();
    for (std::size_t i = 0; i < local.size(); ++i) cmd << ' ' << local[i] << ' ' << remote[i];
    return request(cmd.str());
  }

  // A command whose reply comes later (read it with reply()).
  void post(const std::string& line) { send(line); }
  std::string reply(std::chrono::milliseconds timeout = std::chrono::seconds(90)) {
    return read_line(timeout);
  }

  // SIGSTOP / SIGCONT and the like; the process is not reaped.
  void send_signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    reap(std::chrono::seconds(10));
  }

  // Asks the target to quit; kills it if it does not within a few seconds.
  void stop() {
    if (pid_ <= 0) return;
    if (to_child_ >= 0) {
      const std::string quit = "quit\n";
      [[maybe_unused]] const ssize_t w = ::write(to_child_, quit.data(), quit.size());
    }
    if (!reap(std::chrono::seconds(10))) {
      ::kill(pid_, SIGKILL);
      reap(std::chrono::seconds(10));
    }
  }

 private:
  void spawn() {
    // A target that died leaves a broken pipe; that is a test result, not a
    // reason for the test process to die.
    ::signal(SIGPIPE, SIG_IGN);
    int in_pipe[2];
    int out_pipe[2];
    if (::pipe2(in_pipe, O_CLOEXEC) != 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe2 failed");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
    // UCX's sockets and event fds of this process stay out of the child.
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    std::vector<std::string> args;
    if (!options_.netns.empty()) args = {"/usr/bin/env", "ip", "netns", "exec", options_.netns};
    args.insert(args.end(), {KVXFER_IT_TARGET_PATH, "--name", options_.name, "--blocks",
                             std::to_string(options_.num_blocks), "--block-len",
                             std::to_string(options_.block_len), "--tls", options_.tls});
    for (const auto& [key, value] : options_.engine_config) {
      args.emplace_back("--config");
      args.emplace_back(key + "=" + value);
    }
    if (!options_.progress_thread) args.emplace_back("--no-progress-thread");
    if (options_.guard_bytes > 0) {
      args.emplace_back("--guard-bytes");
      args.emplace_back(std::to_string(options_.guard_bytes));
    }
    if (options_.poll_loop) args.emplace_back("--poll-loop");
    if (options_.shared_pool) args.emplace_back("--shared-pool");
    if (options_.no_pool) args.emplace_back("--no-pool");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in_pipe[0]);
    ::close(out_pipe[1]);
    to_child_ = in_pipe[1];
    from_child_ = out_pipe[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error(std::string("posix_spawn failed: ") + std::strerror(rc));
    }
    const std::string ready = read_line(std::chrono::seconds(30));
    std::istringstream in(ready);
    std::string word;
    std::string hex;
    in >> word >> base_addr_ >> num_blocks_ >> block_len_ >> hex;
    if (word != "ready" || hex.empty()) {
      throw std::runtime_error("target did not come up: '" + ready + "'");
    }
    metadata_ = from_hex(hex);
  }

  void send(const std::string& line) {
    const std::string data = line + "\n";
    std::size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::write(to_child_, data.data() + off, data.size() - off);
      if (n <= 0) throw std::runtime_error("target pipe closed");
      off += static_cast<std::size_t>(n);
    }
  }

  std::string read_line(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) throw std::runtime_error("timed out waiting for the target");
      pollfd pfd{from_child_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(from_child_, chunk, sizeof(chunk));
      if (n <= 0) throw std::runtime_error("target exited: '" + buffer_ + "'");
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  bool reap(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        pid_ = -1;
        if (to_child_ >= 0) ::close(to_child_);
        if (from_child_ >= 0) ::close(from_child_);
        to_child_ = from_child_ = -1;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  TargetOptions options_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;
  std::uintptr_t base_addr_ = 0;
  std::uint64_t num_blocks_ = 0;
  std::uint64_t block_len_ = 0;
  std::vector<std::uint8_t> metadata_;
};

}  // namespace kvxfer::it
