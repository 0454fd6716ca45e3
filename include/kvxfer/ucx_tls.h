// SPDX-License-Identifier: Apache-2.0
// UCX_TLS values (engine_config "TLS", or the environment's UCX_TLS) as the
// UCX backend reads them, for programs that plan or label runs by transport
// (the kvxfer command's bench and fan).
#pragma once

#include <string_view>

namespace kvxfer {

// Whether TCP is the only way the value lets two processes reach each other
// (tcp allowed, no shared-memory transport allowed).
[[nodiscard]] bool ucx_tls_is_tcp_only(std::string_view ucx_tls);

}  // namespace kvxfer
