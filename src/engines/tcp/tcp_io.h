// SPDX-License-Identifier: Apache-2.0
// The tcp lane's I/O thread: one epoll loop that owns every socket. It takes
// the callers' commands (Commands), and hands each connection's bytes to its
// side (tcp_target.h, tcp_initiator.h). Of the lane it is given only what
// Target::Setup names, the command queue, the listener and the epoll fd.
#pragma once

#include <array>
#include <atomic>
#include <vector>

#include "engines/tcp/tcp_commands.h"
#include "engines/tcp/tcp_conn.h"
#include "engines/tcp/tcp_initiator.h"
#include "engines/tcp/tcp_target.h"

namespace kvxfer::internal::tcp {

class Io {
 public:
  // Waits on `listen_fd` and the commands' eventfd in `epoll_fd` (both the
  // lane's to close, after close_all()).
  Io(int epoll_fd, int listen_fd, Commands& commands, const Target::Setup& target);

  // The thread's body: returns on its first turn after stop_soon().
  void run();
  // Any thread: ends run() soon.
  void stop_soon();
  // After run() returned: closes every connection and ends every command
  // still queued.
  void close_all();

 private:
  void carry_out_commands();

  const int epoll_fd_;
  // Their addresses tag their epoll events.
  int listen_fd_;
  int doorbell_;
  Commands& commands_;
  Conns conns_;
  Target target_;
  Initiator initiator_;
  std::vector<Command> taken_;  // carry_out_commands(): the queue taken
  std::atomic<bool> stopping_{false};
};

}  // namespace kvxfer::internal::tcp
