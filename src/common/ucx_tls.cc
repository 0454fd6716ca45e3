// SPDX-License-Identifier: Apache-2.0
#include "common/ucx_tls.h"

#include "kvxfer/ucx_tls.h"

namespace kvxfer {

bool ucx_tls_is_tcp_only(std::string_view ucx_tls) { return internal::tls_is_tcp_only(ucx_tls); }

}  // namespace kvxfer
