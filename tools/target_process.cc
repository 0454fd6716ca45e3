#include "target_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "kvxfer/transport.h"
#include "pattern.h"
#include "pool.h"

namespace kvxfer::tools {

std::string to_hex(const std::vector<std::uint8_t>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const auto b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

std::vector<std::uint8_t> from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) throw std::invalid_argument("odd-length hex string");
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::invalid_argument("bad hex digit");
  };
  std::vector<std::uint8_t> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

TargetProcess::TargetProcess(const std::vector<std::string>& args) {
  int to_child[2];
  int from_child[2];
  if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) throw std::runtime_error("pipe failed");
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    ::close(to_child[0]);
    ::close(to_child[1]);
    ::close(from_child[0]);
    ::close(from_child[1]);
    std::vector<char*> argv;
    std::string self = "/proc/self/exe";
    argv.push_back(self.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::_Exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  to_ = ::fdopen(to_child[1], "w");
  from_ = ::fdopen(from_child[0], "r");
  const std::string line = read_line();
  std::istringstream in(line);
  std::string word;
  std::string hex;
  in >> word >> hex >> geometry_.base >> geometry_.num_blocks >> geometry_.block_len;
  if (word != "READY" || !in) {
    throw std::runtime_error("target did not start: '" + line + "'");
  }
  geometry_.metadata = from_hex(hex);
}

TargetProcess::~TargetProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (to_ != nullptr) std::fclose(to_);
  if (from_ != nullptr) std::fclose(from_);
}

std::string TargetProcess::read_line() {
  std::string line;
  int c = 0;
  while ((c = std::fgetc(from_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
  if (c == EOF && line.empty()) throw std::runtime_error("target process exited unexpectedly");
  return line;
}

std::pair<std::uint64_t, std::uint64_t> TargetProcess::verify(
    std::uint64_t seed, const std::vector<std::pair<std::int64_t, std::int64_t>>& pairs) {
  std::fprintf(to_, "VERIFY %llu %zu\n", static_cast<unsigned long long>(seed), pairs.size());
  for (const auto& [r, l] : pairs) {
    std::fprintf(to_, "%lld %lld\n", static_cast<long long>(r), static_cast<long long>(l));
  }
  std::fflush(to_);
  const std::string line = read_line();
  std::istringstream in(line);
  std::string word;
  std::uint64_t good = 0;
  std::uint64_t bad = 0;
  in >> word >> good >> bad;
  if (word != "VERIFIED" || !in) throw std::runtime_error("bad verify reply: '" + line + "'");
  return {good, bad};
}

int TargetProcess::quit() {
  std::fputs("QUIT\n", to_);
  std::fflush(to_);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run_target(std::uint64_t pool_bytes, std::uint64_t block_len,
               const std::map<std::string, std::string>& engine_config) {
  Pool pool(pool_bytes);
  Options options;
  options.engine_config = engine_config;
  Transport transport(fmt::format("target-{}", ::getpid()),
                      Region{pool.data(), pool_bytes / block_len, block_len}, options);
  std::cout << "READY " << to_hex(transport.agent_metadata()) << ' ' << transport.base_addr()
            << ' ' << transport.num_blocks() << ' ' << transport.block_len() << std::endl;
  std::string cmd;
  while (std::cin >> cmd) {
    if (cmd == "QUIT") break;
    if (cmd != "VERIFY") {
      std::cerr << "target: unknown command " << cmd << '\n';
      return 2;
    }
    std::uint64_t seed = 0;
    std::size_t n = 0;
    std::cin >> seed >> n;
    std::uint64_t good = 0;
    std::uint64_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t r = 0;
      std::int64_t l = 0;
      std::cin >> r >> l;
      const bool in_range = r >= 0 && static_cast<std::uint64_t>(r) < transport.num_blocks();
      if (in_range && block_matches(pool.data() + static_cast<std::uint64_t>(r) * block_len,
                                    block_len, seed, static_cast<std::uint64_t>(l))) {
        ++good;
      } else {
        ++bad;
      }
    }
    std::cout << "VERIFIED " << good << ' ' << bad << std::endl;
  }
  transport.close();
  return 0;
}

}  // namespace kvxfer::tools
