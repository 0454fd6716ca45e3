// SPDX-License-Identifier: Apache-2.0
#include "handshake.h"

#include <fmt/format.h>

#include "channel.h"

namespace kvxfer::tools {

TargetGeometry parse_ready(const std::string& line, const std::string& who) {
  const Message m = Message::parse(line);
  if (m.word == "REFUSED") throw TargetRefused(who + " refused: " + m.rest);
  if (m.word != "READY") {
    throw ChannelError(fmt::format("{} did not open a region: '{}'", who, line.substr(0, 200)));
  }
  TargetGeometry g;
  try {
    g.metadata = from_hex(m.text("metadata"));
  } catch (const std::invalid_argument& e) {
    throw ChannelError(fmt::format("{} sent bad metadata: {}", who, e.what()));
  }
  g.base = m.number("base");
  g.num_blocks = m.number("num_blocks");
  g.block_len = m.number("block_len");
  g.fingerprint = m.text("fingerprint");
  return g;
}

std::string to_hex(const std::vector<std::uint8_t>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const auto b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

std::vector<std::uint8_t> from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) throw std::invalid_argument("odd-length hex string");
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::invalid_argument("bad hex digit");
  };
  std::vector<std::uint8_t> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::uint8_t>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

}  // namespace kvxfer::tools
