// SPDX-License-Identifier: Apache-2.0
// The I/O thread's loop (tcp_io.h): epoll over the listener, the commands'
// eventfd and every connection; then the commands, then the sends they
// queued (the ready list: only connections with new work), then the
// deadlines. Everything here is this thread's; it meets the callers' threads
// only in Commands, the inbox, the registered peers and the transfers.
#include "engines/tcp/tcp_io.h"

#include <sys/epoll.h>
#include <unistd.h>

namespace kvxfer::internal::tcp {

Io::Io(int epoll_fd, int listen_fd, Commands& commands, const Target::Setup& target)
    : epoll_fd_(epoll_fd),
      listen_fd_(listen_fd),
      doorbell_(commands.doorbell()),
      commands_(commands),
      conns_(epoll_fd, target.agent_name, target.counters),
      target_(conns_, target),
      initiator_(conns_, commands, target.counters) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.ptr = &doorbell_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, doorbell_, &ev);
}

void Io::run() {
  std::array<epoll_event, 64> events{};
  for (;;) {
    // Wakes at least once a second to close connections that never said
    // hello and to forget idle lineages.
    // A post that skipped the wake because its peer was sending may have
    // queued after this turn's commands were taken, when the sending ended:
    // then look again at once.
    const bool queued = commands_.pending();
    const int n =
        epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), queued ? 0 : 1000);
    for (int i = 0; i < n; ++i) {
      const epoll_event& e = events[static_cast<std::size_t>(i)];
      if (e.data.ptr == &doorbell_) {
        commands_.clear_doorbell();
      } else if (e.data.ptr == &listen_fd_) {
        target_.accept_all(listen_fd_, stopping_);
      } else if (auto* c = static_cast<Conn*>(e.data.ptr); conns_.has(c)) {
        conns_.on_ready(c, e.events);
      }
    }
    carry_out_commands();
    if (stopping_) return;
    const auto now = Clock::now();
    target_.expire(now);
    conns_.expire_closing(now);
  }
}

void Io::carry_out_commands() {
  commands_.take(taken_);
  for (Command& cmd : taken_) {
    switch (cmd.kind) {
      case Command::Kind::kAdopt:
        if (stopping_) {
          close(cmd.fd);
        } else {
          initiator_.adopt(cmd.fd, cmd.peer);
        }
        cmd.done->set_value();
        break;
      case Command::Kind::kPost:
        initiator_.post(cmd.conn, cmd.xfer);
        break;
      case Command::Kind::kClose:
        initiator_.remove(cmd.conn, cmd.peer);
        cmd.done->set_value();
        break;
    }
  }
  taken_.clear();
  conns_.send_ready();
  // Closed on this turn (by a send, a newer registration, a removal).
  conns_.reap();
}

void Io::stop_soon() {
  stopping_.store(true);
  commands_.ring();
}

void Io::close_all() {
  conns_.close_all("the transport is closing");
  // Transfers posted but never taken by the thread.
  std::vector<Command> commands;
  commands_.take(commands);
  for (Command& cmd : commands) {
    if (cmd.kind == Command::Kind::kPost) {
      initiator_.finish(cmd.xfer, Status::kRemoteDisconnect, "the transport is closing");
    } else if (cmd.kind == Command::Kind::kAdopt) {
      close(cmd.fd);
      cmd.done->set_value();
    } else if (cmd.done != nullptr) {
      cmd.done->set_value();
    }
  }
}

}  // namespace kvxfer::internal::tcp
