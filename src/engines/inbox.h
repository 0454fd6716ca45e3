// SPDX-License-Identifier: Apache-2.0
// A target's notifications, from the thread that receives them to the
// owner's take_notifications(): bounded per sender and in total, so one
// sender's flood costs only that sender. Any lane may keep one (the tcp lane
// does); it holds its own lock, calls nothing of a lane's but `keep`, and
// uses nothing but engine.h's Notification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine.h"

namespace kvxfer::internal {

// `Sender` is whatever tells one sender from another (ordered): the tcp
// lane's (agent name, identity key) of a connection, a lineage.
template <typename Sender>
class Inbox {
 public:
  // At most `per_sender` queued from one sender; at most `shared` from the
  // senders without a share of their own, together.
  Inbox(std::size_t per_sender, std::size_t shared) : per_sender_(per_sender), shared_(shared) {}

  // Queues `message` from `sender` under the name `agent`. `own_share`: the
  // sender's share is its own (a registered peer's), outside `shared`. False,
  // and nothing queued or copied, when its share is full.
  [[nodiscard]] bool put(const Sender& sender, bool own_share, const std::string& agent,
                         std::span<const std::uint8_t> message) {
    std::lock_guard lock(mu_);
    const auto it = queued_of_.try_emplace(sender, 0).first;
    if (it->second >= per_sender_ || (!own_share && shared_queued_ >= shared_)) {
      if (it->second == 0) queued_of_.erase(it);
      return false;
    }
    ++it->second;
    if (!own_share) ++shared_queued_;
    queue_.push_back(
        Queued{Notification{agent, {message.begin(), message.end()}}, sender, own_share});
    return true;
  }

  // Appends every queued notification to *out, oldest first, each handed out
  // once; one for which keep(sender, note) is false is dropped instead.
  // `keep` runs under the inbox's lock.
  template <typename Keep>
  void take(std::vector<Notification>* out, Keep&& keep) {
    std::lock_guard lock(mu_);
    while (!queue_.empty()) {
      Queued& q = queue_.front();
      const auto it = queued_of_.find(q.sender);
      if (it != queued_of_.end() && --it->second == 0) queued_of_.erase(it);
      if (!q.own_share) --shared_queued_;
      if (keep(std::as_const(q.sender), std::as_const(q.note))) out->push_back(std::move(q.note));
      queue_.pop_front();
    }
  }

 private:
  struct Queued {
    Notification note;
    Sender sender;
    bool own_share = false;
  };

  const std::size_t per_sender_;
  const std::size_t shared_;
  std::mutex mu_;
  std::deque<Queued> queue_;
  std::map<Sender, std::size_t> queued_of_;
  std::size_t shared_queued_ = 0;
};

}  // namespace kvxfer::internal
