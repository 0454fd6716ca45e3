// SPDX-License-Identifier: Apache-2.0
// The command queue between the tcp lane's callers and its I/O thread, and
// the pool of transfer handles (tcp_commands.h). Touches only its own queue,
// pool, eventfd and the handles' buffers.
#include "engines/tcp/tcp_commands.h"

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace kvxfer::internal::tcp {
namespace {

constexpr std::size_t kPooledXfers = 256;
constexpr std::size_t kPooledBytes = std::size_t{1} << 20;

}  // namespace

Commands::Commands(Lane* owner) : owner_(owner), fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) {
    throw std::runtime_error(fmt::format("kvxfer tcp: eventfd/epoll: {}", strerror(errno)));
  }
}

Commands::~Commands() {
  close();
  for (Xfer* x : pool_) delete x;
  delete spare_.load();
}

void Commands::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Xfer* Commands::take_xfer() {
  // The spare submit() set aside (no lock); else one from the pool (the
  // first post after a burst), else a new one.
  if (Xfer* x = spare_.exchange(nullptr, std::memory_order_acq_rel); x != nullptr) return x;
  {
    std::lock_guard lock(mu_);
    if (!pool_.empty()) {
      Xfer* x = pool_.back();
      pool_.pop_back();
      return x;
    }
  }
  return new Xfer(owner_);
}

void Commands::submit(Command command) {
  const Peer* post_to = command.kind == Command::Kind::kPost ? command.xfer->peer.get() : nullptr;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(command));
    // The next post's transfer, taken while the lock is held anyway.
    if (post_to != nullptr && !pool_.empty() && spare_.load(std::memory_order_relaxed) == nullptr) {
      Xfer* expected = nullptr;
      if (spare_.compare_exchange_strong(expected, pool_.back(), std::memory_order_acq_rel)) {
        pool_.pop_back();
      }
    }
  }
  // A post to a peer whose connection is still sending needs no wake: the
  // thread comes back for that connection (EPOLLOUT) and takes the queue
  // then; it clears `sending` before it looks at the queue (Io::run()).
  // Waking it anyway costs the caller a switch on a busy machine.
  if (post_to != nullptr && post_to->sending.load(std::memory_order_seq_cst)) return;
  // One wake per burst: the thread clears the flag before it takes the queue.
  if (!wake_pending_.exchange(true, std::memory_order_acq_rel)) ring();
}

void Commands::ring() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = write(fd_, &one, sizeof one);
}

void Commands::clear_doorbell() {
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t r = read(fd_, &count, sizeof count);
}

bool Commands::pending() {
  std::lock_guard lock(mu_);
  return !queue_.empty();
}

void Commands::take(std::vector<Command>& into) {
  // Swapped with the queue, so both keep their capacity.
  wake_pending_.store(false, std::memory_order_release);
  std::lock_guard lock(mu_);
  into.swap(queue_);
}

void Commands::unref(Xfer* x) {
  if (x->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) recycle(x);
}

void Commands::recycle(Xfer* x) {
  if (x->held_bytes() > kPooledBytes) {
    delete x;
    return;
  }
  x->reset();
  {
    std::lock_guard lock(mu_);
    if (pool_.size() < kPooledXfers) {
      pool_.push_back(x);
      return;
    }
  }
  delete x;
}

}  // namespace kvxfer::internal::tcp
