// SPDX-License-Identifier: Apache-2.0
// The agent metadata: what an agent publishes (the user carries it to its
// peers out of band) so that they can register it. It wraps the engine's own
// blob (wire/ucx_blob.h, wire/loopback_blob.h). Read with wire/bytes.h's
// bounds-checked reader; every length has a limit, a checksum covers the
// variable part, and any other shape is refused with a message.
//
// Layout (little-endian), version 2:
//   magic "KVXFMETA" (8) | u16 version | u16 header_len (fixed fields, 40)
//   u64 base_addr | u64 num_blocks | u64 block_len | u32 pid | u32 checksum
//   str engine | str agent_name | str config_fingerprint | str boot_id
//   bytes engine_blob
//   u32 region count (0..kMaxRegions) | per region: u64 id | u64 addr | u64 len
// where str/bytes is a u32 length followed by that many bytes, and checksum
// is FNV-1a over every byte after the fixed fields. Nothing may follow.
// The pool (num_blocks 0 and block_len 0: none) is not in the region list;
// the list holds the regions registered besides it (register_memory),
// each non-empty, inside the address space, with a non-zero id (the pool's
// is 0), in increasing address order without overlap. Version 1 (no
// region list) is refused.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvxfer::wire {

inline constexpr std::uint16_t kMetadataVersion = 2;
// The most regions an agent registers besides its pool.
inline constexpr std::size_t kMaxRegions = 65536;
inline constexpr std::size_t kMaxNameLen = 1024;
inline constexpr std::size_t kMaxBlobLen = 1 << 20;

struct AgentMetadata {
  std::string engine;
  std::string agent_name;
  std::string config_fingerprint;
  std::string boot_id;
  std::uint64_t base_addr = 0;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
  std::uint32_t pid = 0;
  std::vector<std::uint8_t> engine_blob;
  struct Region {
    std::uint64_t id = 0;
    std::uint64_t addr = 0;
    std::uint64_t len = 0;
    friend bool operator==(const Region&, const Region&) = default;
  };
  std::vector<Region> regions;

  friend bool operator==(const AgentMetadata&, const AgentMetadata&) = default;
};

[[nodiscard]] std::vector<std::uint8_t> encode(const AgentMetadata& metadata);

// Throws std::invalid_argument saying what is wrong (empty, truncated, not
// kvxfer metadata, unsupported version, corrupt, oversized field). Never
// reads outside `bytes`.
[[nodiscard]] AgentMetadata decode(std::span<const std::uint8_t> bytes);

}  // namespace kvxfer::wire
