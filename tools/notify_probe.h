// SPDX-License-Identifier: Apache-2.0
// What `kvxfer bench --op notify` sends in each notification: its number,
// the blocks its write moved (or -1 for a notification without data), and
// when it was posted on CLOCK_MONOTONIC, which both ends read on one
// machine. The target checks the blocks and times the delivery.
#pragma once

#include <time.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

namespace kvxfer::tools {

struct NotifyProbe {
  std::uint64_t seq = 0;
  std::int64_t local = -1;   // the initiator's block written, or -1
  std::int64_t remote = -1;  // the target's block it landed in, or -1
  std::uint64_t posted_ns = 0;

  static constexpr std::size_t kLen = 32;

  // Both ends run on this machine (the bench refuses a remote target), so
  // the layout is native.
  void encode(std::uint8_t* out) const {
    std::memcpy(out, &seq, 8);
    std::memcpy(out + 8, &local, 8);
    std::memcpy(out + 16, &remote, 8);
    std::memcpy(out + 24, &posted_ns, 8);
  }
  static std::optional<NotifyProbe> decode(std::span<const std::uint8_t> bytes) {
    if (bytes.size() != kLen) return std::nullopt;
    NotifyProbe p;
    std::memcpy(&p.seq, bytes.data(), 8);
    std::memcpy(&p.local, bytes.data() + 8, 8);
    std::memcpy(&p.remote, bytes.data() + 16, 8);
    std::memcpy(&p.posted_ns, bytes.data() + 24, 8);
    return p;
  }
};

inline std::uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace kvxfer::tools
