// SPDX-License-Identifier: Apache-2.0
// `kvxfer bench --op notify`: how long a notification takes from its post
// to the target's get_notifications(), after a one-block write and alone,
// one in flight at a time, with every delivered message checked there.
#pragma once

#include "bench.h"

namespace kvxfer::tools {

// Spawns a target on this machine (the delivery is timed on one clock).
// Returns 0 when every notification was delivered once, in order, after
// its bytes.
int run_notify_bench(const BenchArgs& args);

}  // namespace kvxfer::tools
