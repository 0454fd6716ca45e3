// libFuzzer target for the bench handshake: a target's answer to OPEN, as the
// initiator decodes it (READY line, hex metadata, then the metadata format
// itself). Any input must decode or be refused with a kvxfer error type;
// a crash, an over-read or another exception is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>

#include "channel.h"
#include "target_process.h"
#include "wire/metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  try {
    const auto g = kvxfer::tools::parse_ready(line, "fuzz");
    try {
      (void)kvxfer::wire::decode(std::span<const std::uint8_t>(g.metadata));
    } catch (const std::invalid_argument&) {
    }
  } catch (const kvxfer::tools::ChannelError&) {
  } catch (const kvxfer::tools::TargetRefused&) {
  }
  try {
    (void)kvxfer::tools::HostPort::parse(line);
  } catch (const std::invalid_argument&) {
  } catch (const kvxfer::tools::ChannelError&) {
  }
  return 0;
}
