// SPDX-License-Identifier: Apache-2.0
// The few UCP calls whose spelling changed between UCX 1.13 (Debian 12) and
// later releases. Everything else the engine uses exists unchanged in both.
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>

namespace kvxfer::internal::ucx_compat {

#if UCP_API_VERSION >= UCP_VERSION(1, 14)

// 1.14 added ucp_memh_pack and moved ucp_rkey_pack to ucp_compat.h.
inline ucs_status_t pack_rkey(ucp_context_h /*context*/, ucp_mem_h memh, void** buffer,
                              std::size_t* length) {
  ucp_memh_pack_params_t params{};
  params.field_mask = UCP_MEMH_PACK_PARAM_FIELD_FLAGS;
  params.flags = 0;  // a remote-access key, not an export key
  return ucp_memh_pack(memh, &params, buffer, length);
}

inline void release_packed_rkey(void* buffer) { ucp_memh_buffer_release(buffer, nullptr); }

#else

inline ucs_status_t pack_rkey(ucp_context_h context, ucp_mem_h memh, void** buffer,
                              std::size_t* length) {
  return ucp_rkey_pack(context, memh, buffer, length);
}

inline void release_packed_rkey(void* buffer) { ucp_rkey_buffer_release(buffer); }

#endif

}  // namespace kvxfer::internal::ucx_compat
