// SPDX-License-Identifier: Apache-2.0
// A size in an engine_config value, read one way for every lane that takes
// one: "262144", "256K", "1M", "1G".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvxfer::internal {

// The bytes `text` says. Throws std::runtime_error naming `backend` and
// `key` when it is not a size (or overflows 64 bits).
[[nodiscard]] std::uint64_t parse_size_setting(std::string_view backend, const std::string& key,
                                               const std::string& text);

}  // namespace kvxfer::internal
