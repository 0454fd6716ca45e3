// SPDX-License-Identifier: Apache-2.0
// What an agent's metadata (Transport::agent_metadata) says about the agent,
// read without registering it: for callers that key their peers by the name
// inside, as NIXL's add_remote_agent does.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kvxfer {

// The agent name the metadata carries. Throws std::invalid_argument, as
// Transport::add_remote_peer would, for bytes that are not valid metadata.
[[nodiscard]] std::string metadata_agent_name(std::span<const std::uint8_t> metadata);

}  // namespace kvxfer
