// SPDX-License-Identifier: Apache-2.0
#include "subprocess.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

int decode_status(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The child's environment: ours with `overrides` applied.
std::vector<std::string> build_env(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [key, value] : overrides) replaced = replaced || key == name;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

Subprocess::Subprocess(const SpawnOptions& options) {
  if (options.argv.empty()) throw std::invalid_argument("Subprocess: empty argv");
  // Everything the child touches is prepared here: after fork() in a
  // process with other threads, only async-signal-safe calls are allowed.
  std::vector<std::string> argv_strings = options.argv;
  std::vector<std::string> env_strings = build_env(options.env);
  std::vector<char*> argv = c_strings(argv_strings);
  std::vector<char*> envp = c_strings(env_strings);

  int in_pipe[2] = {-1, -1};
  int out_pipe[2] = {-1, -1};
  int exec_pipe[2] = {-1, -1};  // CLOEXEC: closes on a successful exec
  if ((options.pipe_stdin && ::pipe2(in_pipe, O_CLOEXEC) != 0) ||
      (options.pipe_stdout && ::pipe2(out_pipe, O_CLOEXEC) != 0) ||
      ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  }
  const int dev_null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (pid_ == 0) {
    ::dup2(options.pipe_stdin ? in_pipe[0] : dev_null, STDIN_FILENO);
    if (options.pipe_stdout) {
      ::dup2(out_pipe[1], STDOUT_FILENO);
    } else if (options.quiet_stdout) {
      ::dup2(dev_null, STDOUT_FILENO);
    }
    if (options.stderr_to_stdout) {
      ::dup2(STDOUT_FILENO, STDERR_FILENO);
    } else if (options.quiet_stderr) {
      ::dup2(dev_null, STDERR_FILENO);
    }
    // Our own SIGPIPE disposition (ignored) must not leak into the child.
    ::signal(SIGPIPE, SIG_DFL);
    ::execvpe(argv[0], argv.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] const ssize_t n = ::write(exec_pipe[1], &err, sizeof(err));
    ::_exit(127);
  }
  ::close(dev_null);
  ::close(exec_pipe[1]);
  if (options.pipe_stdin) {
    ::close(in_pipe[0]);
    stdin_fd_ = in_pipe[1];
  }
  if (options.pipe_stdout) {
    ::close(out_pipe[1]);
    stdout_fd_ = out_pipe[0];
  }
  int err = 0;
  ssize_t n = 0;
  do {
    n = ::read(exec_pipe[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (n == sizeof(err)) {
    wait();
    throw std::runtime_error(
        fmt::format("cannot run {}: {}", options.argv.front(), std::strerror(err)));
  }
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !status_) {
    kill();
    wait();
  }
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

std::optional<int> Subprocess::wait_for(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      status_ = decode_status(status);
      return status_;
    }
    if (r < 0 && errno != EINTR) {
      status_ = -1;
      return status_;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int Subprocess::wait() {
  if (status_) return *status_;
  int status = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  status_ = r == pid_ ? decode_status(status) : -1;
  return *status_;
}

void Subprocess::kill() {
  if (pid_ > 0 && !status_) ::kill(pid_, SIGKILL);
}

Captured run_captured(const SpawnOptions& options, std::chrono::milliseconds timeout) {
  SpawnOptions o = options;
  o.pipe_stdout = true;
  o.stderr_to_stdout = true;
  Subprocess child(o);
  Captured out;
  const auto deadline = Clock::now() + timeout;
  const int fd = child.stdout_fd();
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      out.timed_out = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char chunk[8192];
    const ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child closed its output
    if (out.output.size() < (16u << 20)) out.output.append(chunk, static_cast<std::size_t>(n));
  }
  if (out.timed_out) {
    child.kill();
    child.wait();
    return out;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (const auto status = child.wait_for(std::max(left, std::chrono::milliseconds(100)))) {
    out.status = *status;
  } else {
    out.timed_out = true;
    child.kill();
    child.wait();
  }
  return out;
}

bool in_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::string dirs = path;
  std::size_t pos = 0;
  while (pos <= dirs.size()) {
    auto end = dirs.find(':', pos);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(pos, end - pos);
    const std::string full = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(full.c_str(), X_OK) == 0) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace kvxfer::tools
