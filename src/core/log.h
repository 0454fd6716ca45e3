// The library's logger: spdlog logger "kvxfer", created on first use. The
// Python module swaps its sink for one that forwards to logging("kvxfer").
#pragma once

#include <memory>

#include <spdlog/spdlog.h>

namespace kvxfer::internal {

// Never null; thread-safe.
spdlog::logger& log();

}  // namespace kvxfer::internal
