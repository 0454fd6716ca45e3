// SPDX-License-Identifier: Apache-2.0
#include "common/host.h"

#include <fstream>

namespace kvxfer::internal {

const std::string& boot_id() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  return id;
}

}  // namespace kvxfer::internal
