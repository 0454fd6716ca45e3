// SPDX-License-Identifier: Apache-2.0
#include "info.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "kvxfer/transport.h"

namespace kvxfer::tools {
namespace {

// The TCP sockets this process listens on, by descriptor ("address:port").
std::map<int, std::string> listening_sockets() {
  std::map<int, std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) {
      continue;
    }
    sockaddr_storage sa{};
    len = sizeof sa;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (sa.ss_family == AF_INET) {
      const auto& in = reinterpret_cast<const sockaddr_in&>(sa);
      ::inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
      out[fd] = fmt::format("{}:{}", text, ntohs(in.sin_port));
    } else if (sa.ss_family == AF_INET6) {
      const auto& in6 = reinterpret_cast<const sockaddr_in6&>(sa);
      ::inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
      out[fd] = fmt::format("[{}]:{}", text, ntohs(in6.sin6_port));
    }
  }
  return out;
}

// The RDMA devices the UCX backend counts (src/engines/ucx/ucx_config.cc,
// host_has_rdma_device: any entry of /sys/class/infiniband).
std::vector<std::string> rdma_devices() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    out.push_back(entry.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Which lanes a transport made here with the default options would run, as
// a transport itself says: its engine counters are named by the lanes it
// runs (cma_*, tcp_*, ucx_*), and the listener it opened is the tcp lane's.
// The rule is src/engines/lanes.cc's; this only asks the result.
}  // namespace

void print_lanes() {
  const char* env_lanes = std::getenv("KVXFER_LANES");
  // lanes.cc's kDefaultLanes.
  const std::string lanes = env_lanes != nullptr ? env_lanes : "cma,ucx,tcp";
  const std::vector<std::string> rdma = rdma_devices();
  const auto before = listening_sockets();
  std::vector<std::uint8_t> pool(4096);
  std::map<std::string, std::uint64_t> counters;
  std::vector<std::string> listeners;
  try {
    Transport probe(fmt::format("info-{}", ::getpid()), Region{pool.data(), 1, pool.size()});
    counters = probe.stats().engine_counters;
    for (const auto& [fd, address] : listening_sockets()) {
      if (!before.contains(fd)) listeners.push_back(address);
    }
  } catch (const std::exception& e) {
    fmt::print("lanes: a transport with the default options cannot start here: {}\n", e.what());
    return;
  }
  const auto runs = [&](std::string_view lane) {
    const std::string prefix = fmt::format("{}_", lane);
    return std::any_of(counters.begin(), counters.end(),
                       [&](const auto& c) { return c.first.starts_with(prefix); });
  };
  const auto listed = [&](std::string_view lane) {
    return fmt::format(",{},", lanes).find(fmt::format(",{},", lane)) != std::string::npos;
  };
  fmt::print("lanes: {} ({}), the first that qualifies serves a peer\n", lanes,
             env_lanes != nullptr ? "KVXFER_LANES from the environment" : "the default");
  fmt::print("  cma  {}\n", listed("cma") ? "on: peers on this host that list cma too"
                                          : "off: not in KVXFER_LANES");
  std::string ucx;
  if (runs("ucx")) {
    ucx = "on: peers with an RDMA device too";
  } else if (!listed("ucx")) {
    ucx = "off: not in KVXFER_LANES";
  } else {
    ucx = "off: no RDMA device here (KVXFER_RMA=on in engine_config: over UCX's tcp, tests only)";
  }
  fmt::print("  ucx  {}\n", ucx);
  if (!runs("tcp")) {
    fmt::print("  tcp  off: not in KVXFER_LANES\n");
  } else {
    const char* address = std::getenv("KVXFER_TCP_ADDRESS");
    const char* ports = std::getenv("KVXFER_TCP_PORTS");
    fmt::print(
        "  tcp  on: every other peer; listens on {} (each transport opens its own listener)\n",
        listeners.empty() ? std::string("(no listener found)")
                          : fmt::format("{}", fmt::join(listeners, ", ")));
    fmt::print("       address: {}; port: {}\n",
               address != nullptr ? fmt::format("{} (KVXFER_TCP_ADDRESS)", address)
                                  : "every interface (KVXFER_TCP_ADDRESS unset)",
               ports != nullptr ? fmt::format("from {} (KVXFER_TCP_PORTS)", ports)
                                : "one the kernel picks (KVXFER_TCP_PORTS unset)");
  }
  fmt::print("RDMA devices: {}\n", rdma.empty() ? std::string("none (/sys/class/infiniband)")
                                                : fmt::format("{}", fmt::join(rdma, ", ")));
}

}  // namespace kvxfer::tools
