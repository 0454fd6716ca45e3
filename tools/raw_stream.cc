// SPDX-License-Identifier: Apache-2.0
#include "raw_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvxfer::tools {
namespace {

constexpr int kAcceptTimeoutMs = 10'000;
constexpr int kIoTimeoutS = 30;

[[noreturn]] void fail(const std::string& what) {
  throw ChannelError(fmt::format("raw TCP stream: {}: {}", what, std::strerror(errno)));
}

void set_io_timeout(int fd) {
  timeval tv{kIoTimeoutS, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

std::string local_address_of(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      addr.sin_family != AF_INET) {
    return "127.0.0.1";
  }
  char text[INET_ADDRSTRLEN] = {};
  if (::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text)) == nullptr) return "127.0.0.1";
  return text;
}

int listen_for_stream(const std::string& host, std::uint16_t* port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    throw ChannelError("raw TCP stream: not an IPv4 address: " + host);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("socket");
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    fail("bind/listen on " + host);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

void receive_stream(int listen_fd, std::uint8_t* dst, std::uint64_t dst_len, std::uint64_t bytes) {
  pollfd p{listen_fd, POLLIN, 0};
  const int ready = ::poll(&p, 1, kAcceptTimeoutMs);
  const int fd = ready > 0 ? ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC) : -1;
  ::close(listen_fd);
  if (fd < 0) {
    if (ready == 0) errno = ETIMEDOUT;
    fail("accept");
  }
  set_io_timeout(fd);
  std::uint64_t got = 0;
  while (got < bytes) {
    const std::uint64_t at = got % dst_len;
    const std::uint64_t want = std::min(bytes - got, dst_len - at);
    const ssize_t n = ::recv(fd, dst + at, want, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n == 0 ? ECONNRESET : errno;
      ::close(fd);
      errno = err;
      fail(fmt::format("receive after {} of {} bytes", got, bytes));
    }
    got += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
}

void send_stream(const HostPort& where, const std::uint8_t* src, std::uint64_t src_len,
                 std::uint64_t bytes, std::uint64_t chunk) {
  const int fd = tcp_connect(where, Millis(kAcceptTimeoutMs));
  // Blocking sends (tcp_connect leaves the socket non-blocking), bounded by
  // the send timeout.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  set_io_timeout(fd);
  std::uint64_t sent = 0;
  while (sent < bytes) {
    const std::uint64_t at = sent % src_len;
    const std::uint64_t want = std::min({bytes - sent, src_len - at, chunk});
    const ssize_t n = ::send(fd, src + at, want, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      errno = err;
      fail(fmt::format("send after {} of {} bytes", sent, bytes));
    }
    sent += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
}

}  // namespace kvxfer::tools
