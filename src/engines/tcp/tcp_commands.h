// SPDX-License-Identifier: Apache-2.0
// Where the tcp lane's callers meet its I/O thread: the commands they queue
// (adopt a connection, post a transfer, close a peer's connection), the
// eventfd that wakes the thread, and the transfer handles posts reuse. One
// lock, which a post takes once; nothing here calls out of this room.
#pragma once

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "engines/tcp/tcp_xfer.h"

namespace kvxfer::internal::tcp {

struct Command {
  enum class Kind { kAdopt, kPost, kClose } kind = Kind::kPost;
  int fd = -1;                         // kAdopt: a connected, welcomed socket
  std::shared_ptr<Peer> peer;          // kAdopt, kClose
  Conn* conn = nullptr;                // kPost, kClose
  Xfer* xfer = nullptr;                // kPost
  std::promise<void>* done = nullptr;  // kClose, kAdopt: set once carried out
};

class Commands {
 public:
  // Opens the eventfd (throws std::runtime_error saying why it cannot).
  // `owner` is the lane its transfer handles name.
  explicit Commands(Lane* owner);
  ~Commands();
  Commands(const Commands&) = delete;
  Commands& operator=(const Commands&) = delete;

  // Callers. A transfer handle for a post: the one the last submit() set
  // aside (no lock), else a pooled one, else a new one. Reused with their
  // frame and iovec buffers, so a post allocates nothing of its own once
  // warm (BM_TcpLanePost_*: 8.4 allocations per write before, 4.4 after, the
  // rest the core's).
  [[nodiscard]] Xfer* take_xfer();
  // Queues a command and wakes the I/O thread unless it is bound to come
  // back anyway (a wake already pending; a post to a peer still sending).
  void submit(Command command);
  // Lets go of one reference to a transfer (the core's or the I/O thread's);
  // the last one returns it to the pool.
  void unref(Xfer* x);

  // The I/O thread. The eventfd to wait on, and to empty when it fired.
  [[nodiscard]] int doorbell() const { return fd_; }
  void clear_doorbell();
  // Whether commands wait; moves them into `into` (empty), after clearing
  // the pending wake so a later submit() wakes the thread again.
  [[nodiscard]] bool pending();
  void take(std::vector<Command>& into);

  // Wakes the thread whatever is pending (stop()).
  void ring();
  // Closes the eventfd (the lane's stop(), after the thread ended).
  void close();

 private:
  void recycle(Xfer* x);

  Lane* const owner_;
  int fd_ = -1;
  std::mutex mu_;
  std::vector<Command> queue_;
  // Ended transfers whose buffers the next posts reuse (at most
  // kPooledXfers, each holding at most kPooledBytes), under mu_; and the one
  // the next post takes without a lock, refilled from the pool when a post
  // is queued. So a post takes one lock of this lane.
  std::vector<Xfer*> pool_;
  std::atomic<Xfer*> spare_{nullptr};
  // The thread was woken and has not taken the queue yet, so a burst of
  // posts wakes it once.
  std::atomic<bool> wake_pending_{false};
};

}  // namespace kvxfer::internal::tcp
