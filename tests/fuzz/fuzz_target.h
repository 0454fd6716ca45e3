// SPDX-License-Identifier: Apache-2.0
// What every fuzz target in this directory defines: one decision on one
// input, in both builds (libFuzzer with clang, corpus replay with GCC).
//
// Corpus layout (the replay asserts it):
//   corpus/<target>/valid/<name>    inputs the target must accept (decode,
//                                   and pass every check of the target)
//   corpus/<target>/invalid/<name>  inputs it must refuse
// Every target has at least one seed of each kind. Write valid seeds with the
// real encoders (tests/fuzz/make_seeds.cc does: `<build>/tests/fuzz/
// kvxfer_make_seeds tests/fuzz/corpus`), and invalid ones from valid ones:
// truncated, one byte past the end, bad magic, another version, a length
// that lies, a reserved field set. A new byte format gets a target, a
// decision in accepts(), and seeds of both kinds; a new version of a format
// gets valid seeds of the new version and invalid seeds of what it refuses.
#pragma once

#include <cstdint>
#include <span>

namespace kvxfer::fuzz {

// True when the input decodes (and every invariant the target checks on the
// decoded value holds; a broken invariant aborts), false when it is refused.
// Never reads outside `input`.
bool accepts(std::span<const std::uint8_t> input);

}  // namespace kvxfer::fuzz
