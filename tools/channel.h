// SPDX-License-Identifier: Apache-2.0
// Line-oriented messages between the bench initiator and a target, over a
// pair of pipes (a target spawned on this machine) or one TCP socket (a
// target on another host). Every read has a deadline and every line a length
// cap, so a silent or hostile peer can neither hang the tool nor make it
// allocate without bound.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvxfer::tools {

using Millis = std::chrono::milliseconds;

// Longest line either side accepts. The longest legitimate line is READY,
// whose hex metadata is a few KiB.
inline constexpr std::size_t kMaxLineBytes = 64 * 1024;

// The peer closed, went silent past a deadline, or broke the framing.
class ChannelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class LineChannel {
 public:
  // Takes ownership of the descriptors (one socket may be both).
  LineChannel(int read_fd, int write_fd, std::string peer_name);
  ~LineChannel();
  LineChannel(const LineChannel&) = delete;
  LineChannel& operator=(const LineChannel&) = delete;

  // One line without its '\n'. Throws ChannelError on EOF, on timeout, or
  // when the line would exceed max_bytes.
  std::string read_line(Millis timeout, std::size_t max_bytes = kMaxLineBytes);
  void write_line(std::string_view line, Millis timeout);
  // Several lines in one write, for bulk lists.
  void write_raw(std::string_view data, Millis timeout);

  [[nodiscard]] const std::string& peer_name() const { return peer_name_; }
  // The descriptor lines are read from (a socket for a remote session).
  [[nodiscard]] int read_fd() const { return read_fd_; }

 private:
  int read_fd_;
  int write_fd_;
  std::string peer_name_;
  std::string buffer_;
};

// "WORD key=value key=value ..." -> word and fields; `rest` is everything
// after the word (free text for REFUSED).
struct Message {
  std::string word;
  std::map<std::string, std::string> fields;
  std::string rest;

  static Message parse(const std::string& line);
  // The field as text / as an unsigned number; throws ChannelError naming
  // the field when it is missing or malformed.
  [[nodiscard]] const std::string& text(const std::string& key) const;
  [[nodiscard]] std::uint64_t number(const std::string& key) const;
};

// "host:port" or "[v6addr]:port".
struct HostPort {
  std::string host;
  std::uint16_t port = 0;
  static HostPort parse(const std::string& text);
  [[nodiscard]] std::string str() const;
};

// A listening TCP socket; port 0 picks a free port (see bound_port()).
class TcpListener {
 public:
  explicit TcpListener(const HostPort& where);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  [[nodiscard]] std::uint16_t bound_port() const { return port_; }
  // Blocks for the next connection; returns its fd and fills peer_name.
  int accept_one(std::string* peer_name);

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

// Connects with a deadline; returns the connected socket.
int tcp_connect(const HostPort& where, Millis timeout);

// A TCP port that was free a moment ago on the loopback interface (for the
// ucx_perftest pair, which takes a port number, not a socket).
std::uint16_t pick_free_port();

}  // namespace kvxfer::tools
