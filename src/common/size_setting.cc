// SPDX-License-Identifier: Apache-2.0
#include "common/size_setting.h"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>

namespace kvxfer::internal {

std::uint64_t parse_size_setting(std::string_view backend, const std::string& key,
                                 const std::string& text) {
  std::uint64_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (value > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) break;
    value = value * 10 + static_cast<std::uint64_t>(text[i] - '0');
  }
  std::uint64_t unit = 1;
  if (i < text.size() && i > 0) {
    const char u = text[i];
    unit = (u == 'k' || u == 'K')   ? 1024
           : (u == 'm' || u == 'M') ? 1024 * 1024
           : (u == 'g' || u == 'G') ? 1024 * 1024 * 1024
                                    : 0;
    ++i;
  }
  if (i == 0 || i != text.size() || unit == 0 ||
      value > std::numeric_limits<std::uint64_t>::max() / unit) {
    throw std::runtime_error(
        fmt::format("kvxfer {}: engine_config {}={} is not a size (e.g. 65536, 64K, 1M, 1G)",
                    backend, key, text));
  }
  return value * unit;
}

}  // namespace kvxfer::internal
