// SPDX-License-Identifier: Apache-2.0
// A target's notification inbox, as the lanes between hosts (tcp, ucx)
// keep it: notifications peers sent, oldest first, until the owner takes
// them. Bounded two ways, so no sender can crowd out the others: each
// sender (what the lane proved about it: tcp its name and identity key,
// ucx its lineage) queues at most `per_sender`, and senders without a
// share of their own (tcp: those the owner did not register; ucx: every
// sender) queue at most `shared` together. Taking empties it and every
// share. Called from a lane's receiving thread and the owner's, so it
// keeps its own lock; nothing runs under it but the lane's own filter.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine.h"

namespace kvxfer::internal {

template <typename Sender>
class Inbox {
 public:
  Inbox(std::size_t per_sender, std::size_t shared)
      : per_sender_cap_(per_sender), shared_cap_(shared) {}

  // Queues `note` from `sender` if its share has room; `own_share` says
  // whether the sender has one of its own (not counted against `shared`).
  // False when refused: nothing is queued.
  [[nodiscard]] bool offer(const Sender& sender, bool own_share, Notification note) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    auto [it, fresh] = per_sender_.try_emplace(sender, 0);
    if (it->second >= per_sender_cap_ || (!own_share && shared_ >= shared_cap_)) {
      if (fresh) per_sender_.erase(it);
      return false;
    }
    ++it->second;
    if (!own_share) ++shared_;
    queue_.push_back(Queued{std::move(note), sender, own_share});
    return true;
  }

  // Empties the inbox into `out`, oldest first, handing out only what
  // `keep(note, sender)` accepts (a lane's last check of the sender); what
  // it refuses is dropped. Returns how many were dropped.
  template <typename Keep>
  std::size_t take(std::vector<Notification>* out, Keep&& keep) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    std::size_t dropped = 0;
    for (Queued& q : queue_) {
      if (keep(static_cast<const Notification&>(q.note), static_cast<const Sender&>(q.sender))) {
        out->push_back(std::move(q.note));
      } else {
        ++dropped;
      }
    }
    queue_.clear();
    per_sender_.clear();
    shared_ = 0;
    return dropped;
  }

  [[nodiscard]] std::size_t size() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return queue_.size();
  }

 private:
  struct Queued {
    Notification note;
    Sender sender;
    bool own_share = false;
  };
  const std::size_t per_sender_cap_;
  const std::size_t shared_cap_;
  mutable Mutex mu_;
  std::deque<Queued> queue_ GUARDED_BY(mu_);
  std::map<Sender, std::size_t> per_sender_ GUARDED_BY(mu_);
  std::size_t shared_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvxfer::internal
