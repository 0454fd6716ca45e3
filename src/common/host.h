// SPDX-License-Identifier: Apache-2.0
// What identifies this host to a peer: the Linux boot id, read once per
// process. Two agents with the same boot id (and pid namespace) share a
// kernel, which is what the same-host lane needs.
#pragma once

#include <string>

namespace kvxfer::internal {

// The contents of /proc/sys/kernel/random/boot_id without its newline, or ""
// where it cannot be read (then no peer counts as being on this host).
const std::string& boot_id();

}  // namespace kvxfer::internal
