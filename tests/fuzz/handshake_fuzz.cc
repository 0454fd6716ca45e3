// SPDX-License-Identifier: Apache-2.0
// Fuzz target for the bench handshake: a target's answer to OPEN, as the
// initiator decodes it (READY line, hex metadata, then the metadata format
// itself). Accepted: a READY line whose metadata decodes. Refused: anything
// else, with a kvxfer error type (ChannelError, TargetRefused,
// std::invalid_argument); a crash, an over-read or another exception is a
// bug. The same text is also parsed as a host:port (a command-line value, so
// it does not count for the verdict).
#include <stdexcept>
#include <string>

#include "channel.h"
#include "fuzz_target.h"
#include "handshake.h"
#include "wire/metadata.h"

namespace kvxfer::fuzz {

bool accepts(std::span<const std::uint8_t> input) {
  const std::string line(reinterpret_cast<const char*>(input.data()), input.size());
  try {
    (void)tools::HostPort::parse(line);
  } catch (const std::invalid_argument&) {
  } catch (const tools::ChannelError&) {
  }
  try {
    const auto g = tools::parse_ready(line, "fuzz");
    (void)wire::decode(std::span<const std::uint8_t>(g.metadata));
    return true;
  } catch (const std::invalid_argument&) {
  } catch (const tools::ChannelError&) {
  } catch (const tools::TargetRefused&) {
  }
  return false;
}

}  // namespace kvxfer::fuzz
