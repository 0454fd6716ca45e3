// SPDX-License-Identifier: Apache-2.0
// The library's logger: spdlog logger "kvxfer", created on first use. Every
// layer may write to it and none owns it. Users set its level and sink through
// the public kvxfer/log.h; nothing outside src/ includes this header.
#pragma once

#include <spdlog/spdlog.h>

#include <optional>
#include <string_view>

#include "kvxfer/log.h"

namespace kvxfer::internal {

// Never null; thread-safe.
spdlog::logger& log();

// The level a KVXFER_LOG_LEVEL value names ("trace", "debug", "info", "warn"
// or "warning", "error" or "err", "critical", "off"), or nothing when it names
// none of them.
[[nodiscard]] std::optional<LogLevel> parse_log_level(std::string_view text);

}  // namespace kvxfer::internal
