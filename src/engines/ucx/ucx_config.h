// SPDX-License-Identifier: Apache-2.0
// What the UCX lane asks of UCX, from its keys (engines/settings.h): whether
// the lane runs at all (KVXFER_RMA), the keys for ucp_config_modify and the
// effective UCX_TLS. A pure function, tested without a UCX context.
#pragma once

#include <map>
#include <string>

#include "engines/settings.h"

namespace kvxfer::internal::ucx {

struct UcxSettings {
  // The lane writes with puts, so it runs where an RDMA device is, unless
  // KVXFER_RMA=on|off says otherwise. KVXFER_RMA=on without one makes UCX's
  // tcp transport carry the puts, whose listener carries out any client's
  // put to any address of the process: for tests (docs/reliability.md).
  bool rma = false;
  std::map<std::string, std::string> overrides;  // ucp_config_modify keys
  // UCX_TLS as set ("all" when nobody did; "^tcp" then beside RDMA).
  std::string tls = "all";
  // The user's UCX_TLS lets UCX's tcp run beside an RDMA device (tests do):
  // the engine warns once.
  bool tcp_beside_rdma = false;
  // What the context gets: `tls` without shared-memory transports (the
  // same-host lane serves those peers, and they cost most of the worker's
  // start-up: 15-20 ms against ~1 ms without).
  std::string context_tls = "^sm";

  friend bool operator==(const UcxSettings&, const UcxSettings&) = default;
};

// Throws std::runtime_error, naming the setting and where it came from, for
// a KVXFER_RMA value other than auto, on or off. The UCX keys are UCX's to
// judge (ucp_config_modify, where the lane runs).
[[nodiscard]] UcxSettings compute_ucx_settings(const UcxKeys& keys, bool has_rdma_device);

[[nodiscard]] bool host_has_rdma_device();

}  // namespace kvxfer::internal::ucx
