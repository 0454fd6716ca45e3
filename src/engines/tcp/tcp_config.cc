// SPDX-License-Identifier: Apache-2.0
#include "engines/tcp/tcp_config.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <stdexcept>

namespace kvxfer::internal::tcp {
namespace {

constexpr const char* kAddressKey = "KVXFER_TCP_ADDRESS";
constexpr const char* kPortsKey = "KVXFER_TCP_PORTS";

bool parse_port(std::string_view text, std::uint16_t* out) {
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < 1 || value > 65535) {
    return false;
  }
  *out = static_cast<std::uint16_t>(value);
  return true;
}

void apply(const std::string& key, const std::string& value, const char* where, TcpSettings* out) {
  if (key == kAddressKey) {
    in_addr addr{};
    if (!value.empty() && inet_pton(AF_INET, value.c_str(), &addr) != 1) {
      throw std::runtime_error(
          fmt::format("kvxfer tcp: {} KVXFER_TCP_ADDRESS={} is not an IPv4 address", where, value));
    }
    // Peers connect to what is published: it must name this host.
    if (!value.empty() && addr.s_addr == htonl(INADDR_ANY)) {
      throw std::runtime_error(fmt::format(
          "kvxfer tcp: {} KVXFER_TCP_ADDRESS={} is no address peers can reach; leave it unset "
          "to listen on every interface",
          where, value));
    }
    out->address = value;
  } else if (key == kPortsKey) {
    const std::string_view text(value);
    const auto dash = text.find('-');
    std::uint16_t low = 0;
    std::uint16_t high = 0;
    const bool ok = dash == std::string_view::npos
                        ? parse_port(text, &low) && (high = low, true)
                        : parse_port(text.substr(0, dash), &low) &&
                              parse_port(text.substr(dash + 1), &high) && low <= high;
    if (!ok) {
      throw std::runtime_error(fmt::format(
          "kvxfer tcp: {} KVXFER_TCP_PORTS={} is not a port or a range LOW-HIGH in 1..65535", where,
          value));
    }
    out->port_low = low;
    out->port_high = high;
  } else {
    throw std::runtime_error(
        fmt::format("kvxfer tcp: {} {}={} rejected: not a setting of the tcp lane "
                    "(KVXFER_TCP_ADDRESS, KVXFER_TCP_PORTS)",
                    where, key, value));
  }
}

}  // namespace

TcpSettings compute_tcp_settings(const std::map<std::string, std::string>& engine_config,
                                 const std::map<std::string, std::string>& environment) {
  TcpSettings out;
  // The environment first, so engine_config (the caller's explicit choice)
  // wins where both set a key.
  for (const auto& [key, value] : environment) {
    if (key == kAddressKey || key == kPortsKey) apply(key, value, "environment", &out);
  }
  for (const auto& [key, value] : engine_config) {
    if (is_tcp_key(key)) apply(key, value, "engine_config", &out);
  }
  return out;
}

std::map<std::string, std::string> tcp_environment() {
  std::map<std::string, std::string> out;
  for (const char* key : {kAddressKey, kPortsKey}) {
    if (const char* value = std::getenv(key); value != nullptr) out[key] = value;
  }
  return out;
}

}  // namespace kvxfer::internal::tcp
