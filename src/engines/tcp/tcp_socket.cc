// SPDX-License-Identifier: Apache-2.0
#include "engines/tcp/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace kvxfer::internal::tcp {
namespace {

sockaddr_in to_sockaddr(const wire::TcpAddress& a, std::uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  std::memcpy(&sa.sin_addr, a.bytes.data(), 4);
  return sa;
}

bool is_loopback(const wire::TcpAddress& a) { return a.family == 4 && a.bytes[0] == 127; }

std::string to_text(const wire::TcpAddress& a) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(a.family == 4 ? AF_INET : AF_INET6, a.bytes.data(), text, sizeof text);
  return text;
}

int set_int(int fd, int level, int name, int value) {
  return setsockopt(fd, level, name, &value, sizeof value);
}

}  // namespace

void set_nonblocking(int fd, bool on) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK);
}

void tune(int fd) {
  set_int(fd, IPPROTO_TCP, TCP_NODELAY, 1);
  set_int(fd, SOL_SOCKET, SO_KEEPALIVE, 1);
  set_int(fd, IPPROTO_TCP, TCP_KEEPIDLE, kKeepIdleSeconds);
  set_int(fd, IPPROTO_TCP, TCP_KEEPINTVL, kKeepIntervalSeconds);
  set_int(fd, IPPROTO_TCP, TCP_KEEPCNT, kKeepCount);
  set_int(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, static_cast<int>(kUserTimeoutMs));
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

void cap_send_buffer(int fd) { set_int(fd, SOL_SOCKET, SO_SNDBUF, kTargetSendBuffer); }

int open_listener(const TcpSettings& settings, std::uint16_t* port) {
  in_addr addr{};
  addr.s_addr = htonl(INADDR_ANY);
  if (!settings.address.empty() && inet_pton(AF_INET, settings.address.c_str(), &addr) != 1) {
    throw std::runtime_error(
        fmt::format("kvxfer tcp: {} is not an IPv4 address", settings.address));
  }
  const unsigned low = settings.port_low;
  const unsigned high = settings.port_low == 0 ? 0 : settings.port_high;
  int last_errno = 0;
  for (unsigned p = low; p <= high; ++p) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(fmt::format("kvxfer tcp: socket: {}", strerror(errno)));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr = addr;
    sa.sin_port = htons(static_cast<std::uint16_t>(p));
    if (bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0 && listen(fd, 128) == 0) {
      socklen_t len = sizeof sa;
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
      *port = ntohs(sa.sin_port);
      return fd;
    }
    last_errno = errno;
    close(fd);
  }
  throw std::runtime_error(fmt::format(
      "kvxfer tcp: cannot listen on {} port {} ({}); set KVXFER_TCP_ADDRESS or KVXFER_TCP_PORTS",
      settings.address.empty() ? "every interface" : settings.address,
      low == 0 ? std::string("(any)") : fmt::format("{}-{}", low, high), strerror(last_errno)));
}

std::vector<wire::TcpAddress> published_addresses(const TcpSettings& settings) {
  std::vector<wire::TcpAddress> out;
  if (!settings.address.empty()) {
    wire::TcpAddress a;
    inet_pton(AF_INET, settings.address.c_str(), a.bytes.data());
    out.push_back(a);
    return out;
  }
  std::vector<wire::TcpAddress> loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (const ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
      if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
      if ((it->ifa_flags & IFF_UP) == 0) continue;
      wire::TcpAddress a;
      std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr, 4);
      auto& into = is_loopback(a) ? loopback : out;
      bool seen = false;
      for (const auto& b : into) seen = seen || b == a;
      if (!seen) into.push_back(a);
    }
    freeifaddrs(list);
  }
  if (loopback.empty()) {
    wire::TcpAddress a;
    a.bytes = {127, 0, 0, 1};
    loopback.push_back(a);
  }
  for (const auto& a : loopback) {
    if (out.size() < wire::kMaxTcpAddresses) out.push_back(a);
  }
  if (out.size() > wire::kMaxTcpAddresses) out.resize(wire::kMaxTcpAddresses);
  return out;
}

int connect_any(const std::vector<wire::TcpAddress>& addresses, std::uint16_t port, bool same_host,
                std::chrono::milliseconds timeout, std::string* why) {
  std::string tried;
  for (const wire::TcpAddress& a : addresses) {
    if (a.family != 4 || (is_loopback(a) && !same_host)) continue;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      // Our own process is out of descriptors (or memory): no address of the
      // peer's is at fault, so say what is.
      const int err = errno;
      if (why != nullptr) {
        rlimit r{};
        getrlimit(RLIMIT_NOFILE, &r);
        *why = fmt::format("this process cannot open a socket: {}{}", strerror(err),
                           err == EMFILE ? fmt::format(" (RLIMIT_NOFILE {})",
                                                       static_cast<std::uint64_t>(r.rlim_cur))
                                         : std::string());
      }
      return -1;
    }
    const sockaddr_in sa = to_sockaddr(a, port);
    int err = 0;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
        socklen_t len = sizeof err;
        if (n == 1) {
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    if (err == 0) {
      set_nonblocking(fd, false);
      tune(fd);
      return fd;
    }
    close(fd);
    tried +=
        fmt::format("{}{}:{} ({})", tried.empty() ? "" : ", ", to_text(a), port, strerror(err));
  }
  if (why != nullptr) {
    *why = tried.empty() ? "no address it publishes is reachable from this host" : tried;
  }
  return -1;
}

bool read_exactly(int fd, void* buf, std::size_t len, std::chrono::milliseconds timeout) {
  auto* at = static_cast<std::uint8_t*>(buf);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (len > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    const ssize_t n = ::recv(fd, at, len, 0);
    if (n <= 0) {
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return false;
    }
    at += n;
    len -= static_cast<std::size_t>(n);
  }
  return true;
}

bool write_all(int fd, const void* buf, std::size_t len) {
  const auto* at = static_cast<const std::uint8_t*>(buf);
  while (len > 0) {
    const ssize_t n = ::send(fd, at, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    at += n;
    len -= static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace kvxfer::internal::tcp
