// SPDX-License-Identifier: Apache-2.0
// The tcp lane's settings (engines/tcp/tcp_config.h): its KVXFER_TCP_* keys
// (engine_config, else the environment: engines/settings.h), their defaults
// and their errors. Pure: no lane, no socket.
#include "engines/tcp/tcp_config.h"

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

namespace kvxfer::internal::tcp {
namespace {

using Config = std::map<std::string, std::string>;

// The settings of these keys, as the engine reads them.
TcpSettings settings_of(const Config& engine_config, const Config& environment) {
  return compute_tcp_settings(read_settings(engine_config, environment).tcp);
}

// The message reading them throws, or "" when it accepts.
std::string error_of(const Config& engine_config, const Config& environment = {}) {
  try {
    (void)settings_of(engine_config, environment);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(TcpConfigTest, DefaultsAreEveryInterfaceAndAKernelPickedPort) {
  const TcpSettings s = settings_of({}, {});
  EXPECT_EQ(s.address, "");
  EXPECT_EQ(s.port_low, 0);
  EXPECT_EQ(s.port_high, 0);
}

TEST(TcpConfigTest, StallIsMillisecondsFrom100ToAnHour) {
  EXPECT_EQ(settings_of({}, {}).stall_ms, 30000u);
  EXPECT_EQ(settings_of({{"KVXFER_TCP_STALL_MS", "100"}}, {}).stall_ms, 100u);
  EXPECT_EQ(settings_of({}, {{"KVXFER_TCP_STALL_MS", "3600000"}}).stall_ms, 3600000u);
  for (const char* bad : {"99", "3600001", "", "1s", "-5", "30000 "}) {
    const std::string e = error_of({{"KVXFER_TCP_STALL_MS", bad}});
    EXPECT_NE(e.find("KVXFER_TCP_STALL_MS"), std::string::npos) << bad << ": " << e;
  }
}

TEST(TcpConfigTest, EncryptionIsOnOrOffAndOffByDefault) {
  EXPECT_FALSE(settings_of({}, {}).encrypt);
  EXPECT_TRUE(settings_of({{"KVXFER_TCP_ENCRYPT", "on"}}, {}).encrypt);
  EXPECT_TRUE(settings_of({}, {{"KVXFER_TCP_ENCRYPT", "on"}}).encrypt);
  EXPECT_FALSE(
      settings_of({{"KVXFER_TCP_ENCRYPT", "off"}}, {{"KVXFER_TCP_ENCRYPT", "on"}}).encrypt);
  for (const char* bad : {"", "yes", "1", "ON", "on "}) {
    const std::string e = error_of({{"KVXFER_TCP_ENCRYPT", bad}});
    EXPECT_NE(e.find("KVXFER_TCP_ENCRYPT"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("is not on or off"), std::string::npos) << bad << ": " << e;
  }
}

TEST(TcpConfigTest, AddressIsADottedIpv4AddressOrEmpty) {
  EXPECT_EQ(settings_of({{"KVXFER_TCP_ADDRESS", "10.1.2.3"}}, {}).address, "10.1.2.3");
  EXPECT_EQ(settings_of({{"KVXFER_TCP_ADDRESS", "127.0.0.1"}}, {}).address, "127.0.0.1");
  // Every interface is the default (unset), not an address to publish.
  EXPECT_NE(error_of({{"KVXFER_TCP_ADDRESS", "0.0.0.0"}}).find("is no address peers can reach"),
            std::string::npos);
  // Empty is the default spelled out: every interface.
  EXPECT_EQ(settings_of({{"KVXFER_TCP_ADDRESS", ""}}, {}).address, "");
  for (const std::string bad :
       {"10.1.2", "10.1.2.256", "host.example", "::1", "fe80::1", " 10.1.2.3", "10.1.2.3 ", "x"}) {
    const std::string msg = error_of({{"KVXFER_TCP_ADDRESS", bad}});
    EXPECT_NE(msg.find("KVXFER_TCP_ADDRESS"), std::string::npos) << "'" << bad << "': " << msg;
    EXPECT_NE(msg.find("is not an IPv4 address"), std::string::npos) << "'" << bad << "': " << msg;
  }
  EXPECT_EQ(error_of({{"KVXFER_TCP_ADDRESS", "10.1.2"}}),
            "kvxfer tcp: engine_config KVXFER_TCP_ADDRESS=10.1.2 is not an IPv4 address");
}

TEST(TcpConfigTest, PortsIsOnePortOrARangeLowHigh) {
  {
    const TcpSettings s = settings_of({{"KVXFER_TCP_PORTS", "7000"}}, {});
    EXPECT_EQ(s.port_low, 7000);
    EXPECT_EQ(s.port_high, 7000);
  }
  {
    const TcpSettings s = settings_of({{"KVXFER_TCP_PORTS", "7000-7010"}}, {});
    EXPECT_EQ(s.port_low, 7000);
    EXPECT_EQ(s.port_high, 7010);
  }
  {
    const TcpSettings s = settings_of({{"KVXFER_TCP_PORTS", "1-65535"}}, {});
    EXPECT_EQ(s.port_low, 1);
    EXPECT_EQ(s.port_high, 65535);
  }
  {
    const TcpSettings s = settings_of({{"KVXFER_TCP_PORTS", "65535"}}, {});
    EXPECT_EQ(s.port_low, 65535);
    EXPECT_EQ(s.port_high, 65535);
  }
  {
    // LOW == HIGH is a one-port range.
    const TcpSettings s = settings_of({{"KVXFER_TCP_PORTS", "9-9"}}, {});
    EXPECT_EQ(s.port_low, 9);
    EXPECT_EQ(s.port_high, 9);
  }
}

TEST(TcpConfigTest, PortsRejectsZeroOutOfRangeReversedAndMalformed) {
  for (const std::string bad : {"0", "65536", "5-3", "a", "1-", "", "-1", "-", "0-5", "5-65536",
                                "1-2-3", "7000 ", " 7000", "+7000", "7000-7010x", "99999999999"}) {
    const std::string msg = error_of({{"KVXFER_TCP_PORTS", bad}});
    EXPECT_NE(msg.find("KVXFER_TCP_PORTS"), std::string::npos) << "'" << bad << "': " << msg;
    EXPECT_NE(msg.find("is not a port or a range LOW-HIGH in 1..65535"), std::string::npos)
        << "'" << bad << "': " << msg;
  }
  EXPECT_EQ(error_of({{"KVXFER_TCP_PORTS", "5-3"}}),
            "kvxfer tcp: engine_config KVXFER_TCP_PORTS=5-3 is not a port or a range LOW-HIGH "
            "in 1..65535");
}

TEST(TcpConfigTest, EnvironmentIsReadWhenEngineConfigIsSilent) {
  const TcpSettings s =
      settings_of({}, {{"KVXFER_TCP_ADDRESS", "192.168.0.7"}, {"KVXFER_TCP_PORTS", "8000-8003"}});
  EXPECT_EQ(s.address, "192.168.0.7");
  EXPECT_EQ(s.port_low, 8000);
  EXPECT_EQ(s.port_high, 8003);
}

TEST(TcpConfigTest, InvalidEnvironmentValueIsRejectedNamingTheEnvironment) {
  const std::string addr = error_of({}, {{"KVXFER_TCP_ADDRESS", "nope"}});
  EXPECT_EQ(addr, "kvxfer tcp: environment KVXFER_TCP_ADDRESS=nope is not an IPv4 address");
  const std::string ports = error_of({}, {{"KVXFER_TCP_PORTS", "65536"}});
  EXPECT_NE(ports.find("environment KVXFER_TCP_PORTS=65536"), std::string::npos) << ports;
}

TEST(TcpConfigTest, EngineConfigWinsOverTheEnvironment) {
  const TcpSettings s =
      settings_of({{"KVXFER_TCP_ADDRESS", "10.0.0.1"}, {"KVXFER_TCP_PORTS", "7000"}},
                  {{"KVXFER_TCP_ADDRESS", "10.0.0.2"}, {"KVXFER_TCP_PORTS", "8000-8010"}});
  EXPECT_EQ(s.address, "10.0.0.1");
  EXPECT_EQ(s.port_low, 7000);
  EXPECT_EQ(s.port_high, 7000);

  // Each key on its own: engine_config sets one, the environment the other.
  const TcpSettings mixed =
      settings_of({{"KVXFER_TCP_PORTS", "7000"}}, {{"KVXFER_TCP_ADDRESS", "10.0.0.2"}});
  EXPECT_EQ(mixed.address, "10.0.0.2");
  EXPECT_EQ(mixed.port_low, 7000);
  EXPECT_EQ(mixed.port_high, 7000);
}

TEST(TcpConfigTest, OtherLanesKeysAreLeftAlone) {
  const TcpSettings s = settings_of({{"KVXFER_CMA_SLICE", "x"},
                                     {"KVXFER_LANES", "tcp"},
                                     {"KVXFER_RMA", "x"},
                                     {"TLS", "sm,self"},
                                     {"RNDV_THRESH", "8K"}},
                                    {{"UCX_TLS", "tcp"}, {"KVXFER_LANES", "cma"}});
  EXPECT_EQ(s, TcpSettings{});
}

}  // namespace
}  // namespace kvxfer::internal::tcp
