// SPDX-License-Identifier: Apache-2.0
#include "engines/ucx/ucx_config.h"

#include <filesystem>
#include <string_view>

#include "common/ucx_tls.h"

namespace kvxfer::internal::ucx {

UcxSettings compute_ucx_settings(const UcxKeys& keys, bool has_rdma_device) {
  UcxSettings out;
  out.rma = has_rdma_device;
  if (const auto& rma = keys.rma) {
    if (rma->value != "auto" && rma->value != "on" && rma->value != "off") {
      refuse("ucx", *rma, "is not one of auto, on, off");
    }
    if (rma->value != "auto") out.rma = rma->value == "on";
  }
  // engine_config keys go to ucp_config_modify without the UCX_ prefix.
  for (const auto& [name, value] : keys.ucx_config) {
    std::string_view key = name;
    if (key.starts_with("UCX_")) key.remove_prefix(4);
    out.overrides[std::string(key)] = value;
  }
  if (keys.environment_tls) out.tls = *keys.environment_tls;
  if (auto it = out.overrides.find("TLS"); it != out.overrides.end()) out.tls = it->second;
  // Where the UCX lane serves RDMA, remote peers without RDMA have the tcp
  // lane: UCX's tcp transport, whose listener executes any client's put
  // (docs/reliability.md), is left out unless the user names it.
  if (has_rdma_device) {
    if (!keys.environment_tls && !out.overrides.contains("TLS")) {
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

bool host_has_rdma_device() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

}  // namespace kvxfer::internal::ucx
