// SPDX-License-Identifier: Apache-2.0
#include "kvxfer/metadata.h"
#include "wire/metadata.h"

namespace kvxfer {

std::string metadata_agent_name(std::span<const std::uint8_t> metadata) {
  return wire::decode(metadata).agent_name;
}

}  // namespace kvxfer
