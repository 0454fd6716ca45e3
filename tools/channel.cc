// SPDX-License-Identifier: Apache-2.0
#include "channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw std::runtime_error(fmt::format("fcntl(O_NONBLOCK): {}", std::strerror(errno)));
  }
}

// Waits until fd is ready for `events` or the deadline passes.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) {
      throw ChannelError(fmt::format("poll: {}", std::strerror(errno)));
    }
  }
}

bool is_socket(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0;
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const HostPort& where, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* out = nullptr;
  const std::string port = std::to_string(where.port);
  const int rc =
      ::getaddrinfo(where.host.empty() ? nullptr : where.host.c_str(), port.c_str(), &hints, &out);
  if (rc != 0) {
    throw std::runtime_error(fmt::format("cannot resolve {}: {}", where.str(), ::gai_strerror(rc)));
  }
  return AddrInfoPtr(out);
}

std::string describe(const sockaddr* sa) {
  char host[NI_MAXHOST] = {};
  char serv[NI_MAXSERV] = {};
  const socklen_t len = sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return sa->sa_family == AF_INET6 ? fmt::format("[{}]:{}", host, serv)
                                   : fmt::format("{}:{}", host, serv);
}

}  // namespace

LineChannel::LineChannel(int read_fd, int write_fd, std::string peer_name)
    : read_fd_(read_fd), write_fd_(write_fd), peer_name_(std::move(peer_name)) {
  set_nonblocking(read_fd_);
  if (write_fd_ != read_fd_) set_nonblocking(write_fd_);
}

LineChannel::~LineChannel() {
  ::close(read_fd_);
  if (write_fd_ != read_fd_) ::close(write_fd_);
}

std::string LineChannel::read_line(Millis timeout, std::size_t max_bytes) {
  const auto deadline = Clock::now() + timeout;
  std::size_t scanned = 0;
  for (;;) {
    if (const auto nl = buffer_.find('\n', scanned); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return line;
    }
    scanned = buffer_.size();
    if (buffer_.size() > max_bytes) {
      throw ChannelError(fmt::format("{} sent a line longer than {} bytes", peer_name_, max_bytes));
    }
    if (!wait_ready(read_fd_, POLLIN, deadline)) {
      throw ChannelError(
          fmt::format("{} did not answer within {} ms", peer_name_, timeout.count()));
    }
    char chunk[16 * 1024];
    const ssize_t n = ::read(read_fd_, chunk, sizeof(chunk));
    if (n == 0) throw ChannelError(fmt::format("{} closed the connection", peer_name_));
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      throw ChannelError(fmt::format("reading from {}: {}", peer_name_, std::strerror(errno)));
    }
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

void LineChannel::write_line(std::string_view line, Millis timeout) {
  std::string framed;
  framed.reserve(line.size() + 1);
  framed.append(line);
  framed.push_back('\n');
  write_raw(framed, timeout);
}

void LineChannel::write_raw(std::string_view data, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  const bool socket = is_socket(write_fd_);
  while (!data.empty()) {
    // MSG_NOSIGNAL: a vanished peer is an error to report, not a SIGPIPE.
    const ssize_t n = socket ? ::send(write_fd_, data.data(), data.size(), MSG_NOSIGNAL)
                             : ::write(write_fd_, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) {
      throw ChannelError(fmt::format("writing to {}: {}", peer_name_, std::strerror(errno)));
    }
    if (!wait_ready(write_fd_, POLLOUT, deadline)) {
      throw ChannelError(fmt::format("{} stopped reading for {} ms", peer_name_, timeout.count()));
    }
  }
}

Message Message::parse(const std::string& line) {
  Message m;
  const auto space = line.find(' ');
  m.word = line.substr(0, space);
  if (space == std::string::npos) return m;
  m.rest = line.substr(space + 1);
  std::size_t pos = 0;
  while (pos < m.rest.size()) {
    auto end = m.rest.find(' ', pos);
    if (end == std::string::npos) end = m.rest.size();
    const std::string token = m.rest.substr(pos, end - pos);
    if (const auto eq = token.find('='); eq != std::string::npos && eq > 0) {
      m.fields[token.substr(0, eq)] = token.substr(eq + 1);
    }
    pos = end + 1;
  }
  return m;
}

const std::string& Message::text(const std::string& key) const {
  const auto it = fields.find(key);
  if (it == fields.end()) throw ChannelError(fmt::format("{} message lacks {}=", word, key));
  return it->second;
}

std::uint64_t Message::number(const std::string& key) const {
  const std::string& value = text(key);
  std::uint64_t out = 0;
  const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc{} || ptr != value.data() + value.size()) {
    throw ChannelError(fmt::format("{} message: {}={} is not a number", word, key, value));
  }
  return out;
}

HostPort HostPort::parse(const std::string& text) {
  HostPort hp;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw std::invalid_argument("expected [ADDRESS]:PORT, got '" + text + "'");
    }
    hp.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos) {
      throw std::invalid_argument("expected HOST:PORT, got '" + text + "'");
    }
    hp.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  const auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc{} || ptr != port.data() + port.size() || value > 65535) {
    throw std::invalid_argument("bad port in '" + text + "'");
  }
  hp.port = static_cast<std::uint16_t>(value);
  return hp;
}

std::string HostPort::str() const {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

TcpListener::TcpListener(const HostPort& where) {
  const AddrInfoPtr addrs = resolve(where, true);
  std::string last_error = "no address";
  for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 4) == 0) {
      sockaddr_storage bound{};
      socklen_t len = sizeof(bound);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
      port_ = bound.ss_family == AF_INET6
                  ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                  : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      fd_ = fd;
      return;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  throw std::runtime_error(fmt::format("cannot listen on {}: {}", where.str(), last_error));
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) ::close(fd_);
}

int TcpListener::accept_one(std::string* peer_name) {
  for (;;) {
    sockaddr_storage from{};
    socklen_t len = sizeof(from);
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
    if (fd >= 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      *peer_name = "initiator " + describe(reinterpret_cast<sockaddr*>(&from));
      return fd;
    }
    if (errno != EINTR && errno != ECONNABORTED) {
      throw std::runtime_error(fmt::format("accept: {}", std::strerror(errno)));
    }
  }
}

int tcp_connect(const HostPort& where, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  const AddrInfoPtr addrs = resolve(where, false);
  std::string last_error = "no address";
  for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_ready(fd, POLLOUT, deadline)) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  throw std::runtime_error(fmt::format("cannot connect to {}: {}", where.str(), last_error));
}

std::uint16_t pick_free_port() {
  TcpListener probe(HostPort{"127.0.0.1", 0});
  return probe.bound_port();
}

}  // namespace kvxfer::tools
