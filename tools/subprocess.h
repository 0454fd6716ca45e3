// SPDX-License-Identifier: Apache-2.0
// Child processes for the tool: a target spawned over pipes, ucx_perftest
// pairs and ucx_info. Safe to start from a process that already runs UCX
// threads: everything the child needs is built before fork().
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvxfer::tools {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH unless it has a '/'
  std::vector<std::pair<std::string, std::string>> env;  // added to / replacing ours
  bool pipe_stdin = false;                               // else /dev/null
  bool pipe_stdout = false;  // else inherited (or /dev/null with quiet_stdout)
  bool stderr_to_stdout = false;
  bool quiet_stdout = false;
  bool quiet_stderr = false;
};

class Subprocess {
 public:
  // Throws std::runtime_error when the program cannot be started.
  explicit Subprocess(const SpawnOptions& options);
  ~Subprocess();  // kills and reaps a child still running
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  [[nodiscard]] pid_t pid() const { return pid_; }
  // The parent's ends of the pipes; take_* hands ownership to the caller.
  int take_stdin() { return std::exchange(stdin_fd_, -1); }
  int take_stdout() { return std::exchange(stdout_fd_, -1); }
  [[nodiscard]] int stdout_fd() const { return stdout_fd_; }

  // The exit status (128 + signal when killed), once the child has exited.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  int wait();
  void kill();

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::optional<int> status_;
};

struct Captured {
  int status = -1;  // exit status; -1 when it timed out
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};

// Runs a program to completion (killed at the deadline), capturing its output.
Captured run_captured(const SpawnOptions& options, std::chrono::milliseconds timeout);

// Whether `program` is found in PATH.
bool in_path(const std::string& program);

}  // namespace kvxfer::tools
