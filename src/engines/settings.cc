// SPDX-License-Identifier: Apache-2.0
#include "engines/settings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <stdexcept>
#include <vector>

extern char** environ;

namespace kvxfer::internal {
namespace {

constexpr const char* kPage = "docs/configuration.md";

// Every KVXFER_* name kvxfer knows. A new one, a tool's or a test's
// included, gets a row here and a line in docs/configuration.md (a test
// checks that page names every row): an unknown name in the environment
// refuses every transport of backend "UCX".
constexpr KnownKey kKnownKeys[] = {
    {"KVXFER_LANES", "engine", "a comma list of distinct lanes among cma, ucx, tcp", "cma,ucx,tcp",
     kPage, [](EngineSettings& s) { return &s.lanes; }},
    {"KVXFER_PRETOUCH", "engine", "auto, on or off", "auto", kPage,
     [](EngineSettings& s) { return &s.pretouch; }},
    {"KVXFER_CMA_MAP", "cma", "on, populate or off", "on", kPage,
     [](EngineSettings& s) { return &s.cma.map; }},
    {"KVXFER_CMA_SLICE", "cma", "a size: 0 or 4K..1M", "64K", kPage,
     [](EngineSettings& s) { return &s.cma.slice; }},
    {"KVXFER_TCP_ADDRESS", "tcp", "a dotted IPv4 address; empty: every interface", "", kPage,
     [](EngineSettings& s) { return &s.tcp.address; }},
    {"KVXFER_TCP_PORTS", "tcp", "N or LOW-HIGH, 1 <= LOW <= HIGH <= 65535", nullptr, kPage,
     [](EngineSettings& s) { return &s.tcp.ports; }},
    {"KVXFER_TCP_STALL_MS", "tcp", "milliseconds, 100..3600000", "30000", kPage,
     [](EngineSettings& s) { return &s.tcp.stall; }},
    {"KVXFER_TCP_ENCRYPT", "tcp", "on or off", "off", kPage,
     [](EngineSettings& s) { return &s.tcp.encrypt; }},
    {"KVXFER_RMA", "ucx", "auto, on or off", "auto", kPage,
     [](EngineSettings& s) { return &s.ucx.rma; }},
    // Read by others, from the environment alone.
    {"KVXFER_LOG_LEVEL", "the library's logger (src/common/log.cc)",
     "trace, debug, info, warn, error, critical or off", "warn", kPage, nullptr},
    {"KVXFER_BENCH_POOL", "kvxfer bench (tools/pool.h)", "private, shared or huge", "private",
     kPage, nullptr},
    {"KVXFER_CMAKE_BUILD_DIR", "setup.py", "a directory", nullptr, kPage, nullptr},
    {"KVXFER_TEST_TIER", "the integration tests (tests/integration/it_support.h)", "slow", nullptr,
     kPage, nullptr},
    {"KVXFER_NETNS_KEEP", "the network-namespace tests", "1", nullptr, kPage, nullptr},
    {"KVXFER_IT_KEEPALIVE_BOUND_MS", "the network-namespace tests", "milliseconds", nullptr, kPage,
     nullptr},
    {"KVXFER_TEST_UCX_TLS", "the Python tests (tests/python/test_ucx_two_processes.py)",
     "a UCX_TLS value", "sm,self", kPage, nullptr},
};

// Settings of the UCX lane's scatter messages and its progress thread's
// naps, which it no longer has: said, not taken for a misspelling.
struct RemovedKey {
  const char* name;
  bool prefix;  // every name that starts with it
};
constexpr RemovedKey kRemovedKeys[] = {
    {"KVXFER_SCATTER_", true}, {"KVXFER_POST", false},          {"KVXFER_NAP_US", false},
    {"KVXFER_LINGER", true},   {"KVXFER_PROGRESS_NICE", false},
};

char upper(char c) { return static_cast<char>(std::toupper(static_cast<unsigned char>(c))); }

// Letters added, removed, changed or swapped (neighbours) to turn a into b,
// case ignored.
std::size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t change = upper(a[i - 1]) == upper(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + change});
      if (i > 1 && j > 1 && upper(a[i - 1]) == upper(b[j - 2]) &&
          upper(a[i - 2]) == upper(b[j - 1])) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

const KnownKey* find_known(std::string_view name) {
  for (const KnownKey& key : kKnownKeys) {
    if (name == key.name) return &key;
  }
  return nullptr;
}

bool is_removed(std::string_view name) {
  return std::any_of(std::begin(kRemovedKeys), std::end(kRemovedKeys), [&](const RemovedKey& r) {
    return r.prefix ? name.starts_with(r.name) : name == r.name;
  });
}

// Puts a KVXFER_* setting where it belongs, or throws. The environment is
// read first, so that engine_config, read second, overwrites it.
void place(std::string_view name, const std::string& value, bool from_environment,
           EngineSettings* out) {
  const char* source = from_environment ? "environment" : "engine_config";
  if (is_removed(name)) {
    throw std::runtime_error(fmt::format(
        "kvxfer ucx: {} {} is gone: the UCX lane writes with puts, and its progress thread sleeps "
        "until UCX or a post wakes it ({})",
        source, name, kPage));
  }
  const KnownKey* key = find_known(name);
  if (key == nullptr) {
    throw std::runtime_error(
        fmt::format("kvxfer: {} {} is not a kvxfer setting; did you mean {}? ({} lists them all)",
                    source, name, nearest_known_key(name), kPage));
  }
  if (key->slot == nullptr) {
    // Another reader's: the environment is where it looks.
    if (from_environment) return;
    throw std::runtime_error(
        fmt::format("kvxfer: engine_config {} is not an engine setting: {} reads it from the "
                    "environment ({})",
                    name, key->owner, kPage));
  }
  *key->slot(*out) = Setting{std::string(name), value, from_environment};
}

}  // namespace

std::string Setting::said() const {
  return fmt::format("{} {}={}", from_environment ? "environment" : "engine_config", key, value);
}

void refuse(std::string_view lane, const Setting& setting, std::string_view why) {
  throw std::runtime_error(fmt::format("kvxfer {}: {} {}", lane, setting.said(), why));
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  std::uint64_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const auto digit = static_cast<std::uint64_t>(text[i] - '0');
    if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  if (i == 0) return std::nullopt;
  std::uint64_t unit = 1;
  if (i < text.size()) {
    const char u = upper(text[i++]);
    unit = u == 'K'   ? std::uint64_t{1} << 10
           : u == 'M' ? std::uint64_t{1} << 20
           : u == 'G' ? std::uint64_t{1} << 30
                      : 0;
  }
  if (unit == 0 || i != text.size() || value > std::numeric_limits<std::uint64_t>::max() / unit) {
    return std::nullopt;
  }
  return value * unit;
}

std::span<const KnownKey> known_keys() { return kKnownKeys; }

bool is_kvxfer_name(std::string_view name) {
  constexpr std::string_view kPrefix = "KVXFER_";
  if (name.size() < kPrefix.size()) return false;
  for (std::size_t i = 0; i < kPrefix.size(); ++i) {
    if (upper(name[i]) != kPrefix[i]) return false;
  }
  return true;
}

std::string_view nearest_known_key(std::string_view name) {
  std::string_view best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const KnownKey& key : kKnownKeys) {
    const std::size_t d = distance(name, key.name);
    if (d < best_distance) {
      best = key.name;
      best_distance = d;
    }
  }
  return best;
}

EngineSettings read_settings(const std::map<std::string, std::string>& engine_config,
                             const std::map<std::string, std::string>& environment) {
  EngineSettings out;
  for (const auto& [name, value] : environment) {
    if (is_kvxfer_name(name)) {
      place(name, value, /*from_environment=*/true, &out);
    } else if (name == "UCX_TLS") {
      out.ucx.environment_tls = value;
    }
  }
  for (const auto& [name, value] : engine_config) {
    if (is_kvxfer_name(name)) {
      place(name, value, /*from_environment=*/false, &out);
    } else {
      out.ucx.ucx_config[name] = value;
    }
  }
  return out;
}

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> out;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::size_t equals = text.find('=');
    if (equals == std::string_view::npos) continue;
    const std::string_view name = text.substr(0, equals);
    if (is_kvxfer_name(name) || name == "UCX_TLS") {
      out.emplace(std::string(name), std::string(text.substr(equals + 1)));
    }
  }
  return out;
}

}  // namespace kvxfer::internal
