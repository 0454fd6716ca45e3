// The library's logger: spdlog logger "kvxfer", created on first use. Every
// layer may write to it and none owns it. Users set its level and sink through
// the public kvxfer/log.h; nothing outside src/ includes this header.
#pragma once

#include <spdlog/spdlog.h>

namespace kvxfer::internal {

// Never null; thread-safe.
spdlog::logger& log();

}  // namespace kvxfer::internal
