// SPDX-License-Identifier: Apache-2.0
// The initiator's decoding of a target's answer to OPEN (target_process.h
// has the protocol), apart from the rest of the target's handle so that the
// handshake fuzzer (tests/fuzz/handshake_fuzz.cc) builds without the library.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvxfer::tools {

struct TargetGeometry {
  std::vector<std::uint8_t> metadata;
  std::uintptr_t base = 0;
  std::uint64_t num_blocks = 0;
  std::uint64_t block_len = 0;
  std::string fingerprint;
};

// The target said no (block length, region size or fingerprint); what() is
// its reason.
class TargetRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Decodes a target's answer to OPEN (READY with its geometry and metadata, or
// REFUSED with a reason) from `who`. Throws TargetRefused or ChannelError
// (missing or malformed field); the metadata bytes are then checked by the
// transport when the peer is added. Fuzzed by tests/fuzz/handshake_fuzz.cc.
TargetGeometry parse_ready(const std::string& line, const std::string& who);

std::string to_hex(const std::vector<std::uint8_t>& bytes);
std::vector<std::uint8_t> from_hex(const std::string& hex);

}  // namespace kvxfer::tools
