// SPDX-License-Identifier: Apache-2.0
// What differs under a sanitizer, named in this one place with its reason.
// No constant or policy changes under a sanitizer: only what a sanitizer
// cannot see (memory another process writes, ordered through that process)
// is kept out of its view. Code and tests use these names, never
// __SANITIZE_THREAD__ or __has_feature themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SANITIZE_THREAD__)
#define KVXFER_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVXFER_THREAD_SANITIZER 1
#endif
#endif

// KVXFER_NO_TSAN marks a function ThreadSanitizer does not instrument: one
// that touches bytes of a pool a peer process writes or reads too, whose
// order goes through that process (a socket, a cookie, the peer's own
// poll), which ThreadSanitizer cannot see. noinline: inlined into an
// instrumented caller, its accesses would be instrumented after all.
#if defined(KVXFER_THREAD_SANITIZER)
#define KVXFER_NO_TSAN __attribute__((no_sanitize("thread"), noinline))
#else
#define KVXFER_NO_TSAN
#endif

namespace kvxfer::internal {

#if defined(KVXFER_THREAD_SANITIZER)
inline constexpr bool kUnderThreadSanitizer = true;
#else
inline constexpr bool kUnderThreadSanitizer = false;
#endif

// Copies len bytes from src to dst. Without ThreadSanitizer: memcpy. Under
// it: the same bytes through volatile accesses in an uninstrumented function
// (memcpy itself is intercepted, and the compiler would turn a plain loop
// into a memcpy call), word by word where both sides allow it. For copies
// into and out of a peer's mapped pool, where two transfers of one block in
// flight at once race by the contract (they have no order).
#if defined(KVXFER_THREAD_SANITIZER)
KVXFER_NO_TSAN inline void uninstrumented_copy(void* dst, const void* src, std::size_t len) {
  auto* d = static_cast<volatile std::uint8_t*>(dst);
  const auto* s = static_cast<const volatile std::uint8_t*>(src);
  std::size_t i = 0;
  constexpr std::size_t kWord = sizeof(std::uint64_t);
  const auto at = [](const volatile std::uint8_t* p) {
    return reinterpret_cast<std::uintptr_t>(p);
  };
  if ((at(d) - at(s)) % kWord == 0) {
    for (; i < len && at(d + i) % kWord != 0; ++i) d[i] = s[i];
    for (; i + kWord <= len; i += kWord) {
      *reinterpret_cast<volatile std::uint64_t*>(d + i) =
          *reinterpret_cast<const volatile std::uint64_t*>(s + i);
    }
  }
  for (; i < len; ++i) d[i] = s[i];
}
#else
inline void uninstrumented_copy(void* dst, const void* src, std::size_t len) {
  std::memcpy(dst, src, len);
}
#endif

}  // namespace kvxfer::internal
