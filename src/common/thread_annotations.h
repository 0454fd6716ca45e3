// SPDX-License-Identifier: Apache-2.0
// Clang's thread-safety annotations, as leveldb and abseil spell them: which
// mutex guards a field (GUARDED_BY), which a function needs held (REQUIRES)
// or must not hold (EXCLUDES). Clang checks them with -Wthread-safety (the
// `make tsa` stage); other compilers see nothing. The annotated mutex that
// goes with them is common/mutex.h.
#pragma once

#if defined(__clang__)
#define KVXFER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVXFER_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (a mutex) or a guard that holds one for its scope.
#define CAPABILITY(name) KVXFER_THREAD_ANNOTATION(capability(name))
#define SCOPED_CAPABILITY KVXFER_THREAD_ANNOTATION(scoped_lockable)

// A field read or written only with `mu` held; a pointer whose pointee is.
#define GUARDED_BY(mu) KVXFER_THREAD_ANNOTATION(guarded_by(mu))
#define PT_GUARDED_BY(mu) KVXFER_THREAD_ANNOTATION(pt_guarded_by(mu))

// Which lock is taken first, where a thread holds two.
#define ACQUIRED_BEFORE(...) KVXFER_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) KVXFER_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))

// The caller holds these locks (REQUIRES), or must not (EXCLUDES: the
// function takes them itself, or does something that must not run under
// them, such as a call that can wait).
#define REQUIRES(...) KVXFER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) KVXFER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// A function that takes a lock and returns holding it, or releases one the
// caller held; TRY_ACQUIRE takes it when it returns `result`.
#define ACQUIRE(...) KVXFER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) KVXFER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) KVXFER_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))

// A run-time check that the lock is held, from which the analysis assumes it.
#define ASSERT_CAPABILITY(x) KVXFER_THREAD_ANNOTATION(assert_capability(x))

// Returns a reference to the lock (an accessor the analysis sees through).
#define RETURN_CAPABILITY(x) KVXFER_THREAD_ANNOTATION(lock_returned(x))

// Not checked: say why beside each use.
#define NO_THREAD_SAFETY_ANALYSIS KVXFER_THREAD_ANNOTATION(no_thread_safety_analysis)
