// SPDX-License-Identifier: Apache-2.0
// A target's fence table, as both lanes between hosts keep it (the tcp
// lane's hello, the ucx lane's fence message, wire/fence.h): per initiator
// lineage, the newest registration (gen, epoch) presented for it, the
// identity that presented it, and what the lane keeps beside (tcp: the
// lineage's connections; ucx: the endpoint its fence came on).
//
// One rule for both lanes:
// - a lineage is one identity's: another identity presenting it is refused;
// - an older gen, or the same gen with another epoch, is stale; a newer gen
//   replaces the entry's registration (the lane drops what the older one
//   still holds);
// - the table is bounded (Limits::max_lineages): when full, a new lineage
//   is refused, never an entry forgotten early, except that an identity
//   with room of its own (the tcp lane's registered peers) may hold
//   Limits::own_room lineages past the bound;
// - an entry nothing uses (no connection, no answer in flight) is forgotten
//   once it has been unused for Limits::linger, longer than any honest
//   registration takes to present itself again.
// Single-threaded: a lane's receiving thread (tcp: its I/O thread; ucx: the
// driver's turn) owns its table.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>

namespace kvxfer::internal {

// The identity of a lane that proves none (ucx): every lineage is its.
struct Anonymous {
  friend bool operator==(Anonymous, Anonymous) { return true; }
  friend bool operator<(Anonymous, Anonymous) { return false; }
};

template <typename Identity, typename Extra>
class FenceTable {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    std::size_t max_lineages = 0;
    std::size_t own_room = 0;
    Clock::duration linger{};
  };
  struct Entry {
    std::uint64_t gen = 0;
    std::uint64_t epoch = 0;
    Identity identity{};
    Extra extra{};
    std::size_t users = 0;      // what still needs the entry (hold/release)
    Clock::time_point heard{};  // last presented, touched or let go
  };
  enum class Verdict { kNew, kNewer, kSame, kStale, kNotYours, kFull };
  struct Presented {
    Verdict verdict = Verdict::kFull;
    Entry* entry = nullptr;  // kNew, kNewer, kSame: the lineage's entry
  };

  explicit FenceTable(Limits limits) : limits_(limits) {}

  // Registration (gen, epoch) of `lineage`, presented by `identity`. On
  // kNewer the entry already holds the new registration; its `extra` and
  // users are still the older one's, for the lane to let go.
  Presented present(std::uint64_t lineage, std::uint64_t gen, std::uint64_t epoch,
                    const Identity& identity, bool room_of_own, Clock::time_point now) {
    const auto it = entries_.find(lineage);
    if (it == entries_.end()) {
      if (entries_.size() >= limits_.max_lineages) expire(now);
      if (entries_.size() >= limits_.max_lineages &&
          !(room_of_own && count_of(identity) < limits_.own_room)) {
        return {Verdict::kFull, nullptr};
      }
      ++per_identity_[identity];
      Entry& e =
          entries_.emplace(lineage, Entry{gen, epoch, identity, Extra{}, 0, now}).first->second;
      unused(e);
      return {Verdict::kNew, &e};
    }
    Entry& e = it->second;
    if (!(e.identity == identity)) return {Verdict::kNotYours, nullptr};
    if (gen < e.gen || (gen == e.gen && epoch != e.epoch)) return {Verdict::kStale, nullptr};
    e.heard = now;
    if (gen == e.gen) return {Verdict::kSame, &e};
    e.gen = gen;
    e.epoch = epoch;
    return {Verdict::kNewer, &e};
  }

  [[nodiscard]] Entry* find(std::uint64_t lineage) {
    const auto it = entries_.find(lineage);
    return it == entries_.end() ? nullptr : &it->second;
  }

  // The entry is in use (a connection, an answer in flight): not forgotten
  // until every use is let go.
  void hold(Entry& e) { ++e.users; }
  void release(Entry& e, Clock::time_point now) {
    if (e.users > 0) --e.users;
    e.heard = now;
    if (e.users == 0) unused(e);
  }
  void touch(Entry& e, Clock::time_point now) { e.heard = now; }

  // Forgets every entry unused for the linger. O(1) until one may be due.
  void expire(Clock::time_point now) {
    if (now < next_due_) return;
    next_due_ = Clock::time_point::max();
    for (auto it = entries_.begin(); it != entries_.end();) {
      Entry& e = it->second;
      if (e.users == 0 && now - e.heard >= limits_.linger) {
        const auto k = per_identity_.find(e.identity);
        if (k != per_identity_.end() && --k->second == 0) per_identity_.erase(k);
        it = entries_.erase(it);
        continue;
      }
      if (e.users == 0) unused(e);
      ++it;
    }
  }

  [[nodiscard]] std::size_t size() const { return entries_.size(); }
  [[nodiscard]] std::size_t count_of(const Identity& identity) const {
    const auto it = per_identity_.find(identity);
    return it == per_identity_.end() ? 0 : it->second;
  }

 private:
  // `e` is unused from now on: expire() has work no sooner than its linger.
  void unused(const Entry& e) {
    if (e.heard + limits_.linger < next_due_) next_due_ = e.heard + limits_.linger;
  }

  const Limits limits_;
  std::unordered_map<std::uint64_t, Entry> entries_;
  std::map<Identity, std::size_t> per_identity_;
  Clock::time_point next_due_ = Clock::time_point::max();
};

}  // namespace kvxfer::internal
