// SPDX-License-Identifier: Apache-2.0
#include "engines/tcp/tcp_config.h"

#include <arpa/inet.h>

#include <charconv>
#include <string_view>

namespace kvxfer::internal::tcp {
namespace {

bool parse_port(std::string_view text, std::uint16_t* out) {
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < 1 || value > 65535) {
    return false;
  }
  *out = static_cast<std::uint16_t>(value);
  return true;
}

}  // namespace

TcpSettings compute_tcp_settings(const TcpKeys& keys) {
  TcpSettings out;
  if (const auto& address = keys.address) {
    const std::string& value = address->value;
    in_addr addr{};
    if (!value.empty() && inet_pton(AF_INET, value.c_str(), &addr) != 1) {
      refuse("tcp", *address, "is not an IPv4 address");
    }
    // Peers connect to what is published: it must name this host.
    if (!value.empty() && addr.s_addr == htonl(INADDR_ANY)) {
      refuse("tcp", *address,
             "is no address peers can reach; leave it unset to listen on every interface");
    }
    out.address = value;
  }
  if (const auto& ports = keys.ports) {
    const std::string_view text(ports->value);
    const auto dash = text.find('-');
    std::uint16_t low = 0;
    std::uint16_t high = 0;
    const bool ok = dash == std::string_view::npos
                        ? parse_port(text, &low) && (high = low, true)
                        : parse_port(text.substr(0, dash), &low) &&
                              parse_port(text.substr(dash + 1), &high) && low <= high;
    if (!ok) refuse("tcp", *ports, "is not a port or a range LOW-HIGH in 1..65535");
    out.port_low = low;
    out.port_high = high;
  }
  if (const auto& stall = keys.stall) {
    const std::string_view text(stall->value);
    std::uint32_t ms = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ms);
    if (ec != std::errc{} || end != text.data() + text.size() || ms < 100 || ms > 3'600'000) {
      refuse("tcp", *stall, "is not a number of milliseconds in 100..3600000");
    }
    out.stall_ms = ms;
  }
  if (const auto& encrypt = keys.encrypt) {
    if (encrypt->value != "on" && encrypt->value != "off")
      refuse("tcp", *encrypt, "is not on or off");
    out.encrypt = encrypt->value == "on";
  }
  return out;
}

}  // namespace kvxfer::internal::tcp
