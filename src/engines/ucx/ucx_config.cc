// SPDX-License-Identifier: Apache-2.0
#include "engines/ucx/ucx_config.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string_view>

#include "common/ucx_tls.h"

namespace kvxfer::internal::ucx {

UcxSettings compute_ucx_settings(const std::map<std::string, std::string>& engine_config,
                                 const EnvLookup& env, bool has_rdma_device) {
  UcxSettings out;
  out.rma = has_rdma_device;
  for (const auto& [raw_key, value] : engine_config) {
    if (raw_key == "KVXFER_RMA") {
      if (value != "auto" && value != "on" && value != "off") {
        throw std::runtime_error(fmt::format(
            "kvxfer ucx: engine_config KVXFER_RMA={} is not one of auto, on, off", value));
      }
      if (value != "auto") out.rma = value == "on";
      continue;
    }
    const std::string_view name = raw_key;
    // The other lanes' settings and the lane list (lanes.cc): not UCX's.
    if (name.starts_with("KVXFER_CMA_") || name.starts_with("KVXFER_TCP_") ||
        name == "KVXFER_LANES") {
      continue;
    }
    // Settings of the scatter messages and the progress thread's naps, which
    // the lane no longer has: said, not silently ignored.
    if (name.starts_with("KVXFER_SCATTER_") || name == "KVXFER_POST" || name == "KVXFER_NAP_US" ||
        name.starts_with("KVXFER_LINGER") || name == "KVXFER_PROGRESS_NICE") {
      throw std::runtime_error(fmt::format(
          "kvxfer ucx: engine_config {} is gone: the UCX lane writes with puts, and its progress "
          "thread sleeps until UCX or a post wakes it (docs/configuration.md)",
          raw_key));
    }
    // engine_config keys go to ucp_config_modify without the UCX_ prefix.
    std::string_view key = name;
    if (key.starts_with("UCX_")) key.remove_prefix(4);
    out.overrides[std::string(key)] = value;
  }
  if (auto tls = env("UCX_TLS")) out.tls = *tls;
  if (auto it = out.overrides.find("TLS"); it != out.overrides.end()) out.tls = it->second;
  // Where the UCX lane serves RDMA, remote peers without RDMA have the tcp
  // lane: UCX's tcp transport, whose listener executes any client's put
  // (docs/reliability.md), is left out unless the user names it.
  if (has_rdma_device) {
    if (!env("UCX_TLS") && !out.overrides.contains("TLS")) {
      out.tls = "^tcp";
      out.overrides["TLS"] = out.tls;
    } else {
      out.tcp_beside_rdma = tls_allows(out.tls, {"tcp"});
    }
  }
  out.context_tls = tls_without_shared_memory(out.tls);
  if (out.context_tls != out.tls) out.overrides["TLS"] = out.context_tls;
  return out;
}

std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

bool host_has_rdma_device() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

}  // namespace kvxfer::internal::ucx
