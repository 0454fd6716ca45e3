// SPDX-License-Identifier: Apache-2.0
#include "perftest.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "channel.h"
#include "subprocess.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

// The overall bandwidth of `-f -v` (CSV) output, in MB/s where UCX's MB is
// 2^20 bytes.
std::optional<double> overall_mbps(const std::string& output) {
  const auto lines = split(output, '\n');
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
    if (lines[i].rfind("iterations,", 0) != 0) continue;
    const auto names = split(lines[i], ',');
    const auto values = split(lines[i + 1], ',');
    const auto it = std::find(names.begin(), names.end(), "overall_bw");
    const auto col = static_cast<std::size_t>(it - names.begin());
    if (it == names.end() || col >= values.size()) return std::nullopt;
    try {
      return std::stod(values[col]);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::string last_lines(const std::string& text, std::size_t n) {
  const auto lines = split(text, '\n');
  std::string out;
  for (std::size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) {
    if (!out.empty()) out += " | ";
    out += lines[i];
  }
  return out;
}

}  // namespace

// Whether something listens on TCP `port` (the perftest server, before the
// client may connect: connecting to find out would be taken as the client).
bool port_listening(std::uint16_t port) {
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;  // 0A: LISTEN
      if (std::stoul(local.substr(colon + 1), nullptr, 16) == port) return true;
    }
  }
  return false;
}

std::string wait_listening(Subprocess& server, std::uint16_t port,
                           std::chrono::steady_clock::time_point deadline,
                           const std::string& name) {
  while (!port_listening(port)) {
    if (server.wait_for(std::chrono::milliseconds(0)))
      return name + " server exited before listening";
    if (std::chrono::steady_clock::now() > deadline) return name + " server did not listen in time";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

bool perftest_available() { return in_path("ucx_perftest"); }

PerftestResult run_perftest(const PerftestRequest& request) {
  PerftestResult result;
  if (!perftest_available()) {
    result.error = "ucx_perftest not installed (Debian package ucx-utils)";
    return result;
  }
  const std::uint64_t len = std::max<std::uint64_t>(request.message_len, 1);
  result.iterations = std::clamp<std::uint64_t>(request.bytes / len, 100, 200'000);
  const std::uint64_t warmup = std::clamp<std::uint64_t>(result.iterations / 10, 10, 10'000);
  const std::uint16_t port = pick_free_port();

  std::vector<std::pair<std::string, std::string>> env;
  if (!request.ucx_tls.empty()) env.emplace_back("UCX_TLS", request.ucx_tls);
  const std::vector<std::string> common = {"-t", "ucp_put_bw",
                                           "-s", std::to_string(len),
                                           "-n", std::to_string(result.iterations),
                                           "-w", std::to_string(warmup),
                                           "-p", std::to_string(port)};

  SpawnOptions server_options;
  server_options.argv = {"ucx_perftest"};
  server_options.argv.insert(server_options.argv.end(), common.begin(), common.end());
  server_options.env = env;
  server_options.quiet_stdout = true;
  server_options.quiet_stderr = true;
  const auto deadline = Clock::now() + request.timeout;
  try {
    Subprocess server(server_options);
    if (result.error = wait_listening(server, port, deadline, "ucx_perftest");
        !result.error.empty()) {
      return result;
    }
    SpawnOptions client_options;
    client_options.argv = {"ucx_perftest", "127.0.0.1"};
    client_options.argv.insert(client_options.argv.end(), common.begin(), common.end());
    client_options.argv.insert(client_options.argv.end(), {"-f", "-v"});
    client_options.env = env;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const auto start = Clock::now();
    const Captured client =
        run_captured(client_options, std::max(left, std::chrono::milliseconds(1)));
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    result.ran = true;
    if (!server.wait_for(std::chrono::milliseconds(5000))) server.kill();
    if (client.timed_out) {
      result.error = fmt::format("ucx_perftest timed out after {} s", request.timeout.count());
      return result;
    }
    if (client.status != 0) {
      result.error = fmt::format("ucx_perftest exited with {}: {}", client.status,
                                 last_lines(client.output, 3));
      return result;
    }
    if (const auto mbps = overall_mbps(client.output)) {
      result.gbps = *mbps * 1048576.0 / 1e9;
    } else {
      result.error = "cannot parse ucx_perftest output: " + last_lines(client.output, 3);
    }
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  return result;
}

}  // namespace kvxfer::tools
