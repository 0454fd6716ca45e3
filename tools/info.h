// SPDX-License-Identifier: Apache-2.0
// `kvxfer info`'s lanes: which lanes a transport made here would run, the
// RDMA devices the UCX backend counts, and the tcp lane's listening address.
#pragma once

namespace kvxfer::tools {

void print_lanes();

}  // namespace kvxfer::tools
