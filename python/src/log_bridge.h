// SPDX-License-Identifier: Apache-2.0
// Routes the library's log (kvxfer/log.h) to Python's
// logging.getLogger("kvxfer").
#pragma once

#include <pybind11/pybind11.h>

namespace kvxfer::python {

// Sets the library's log sink to one that hands each record to the Python
// logger, and registers an atexit hook that detaches it before the
// interpreter shuts down. Call once, at import, with the GIL held.
void install_log_bridge();

// Sets the library's level from the Python logger's effective level, so
// records Python would drop are never formatted. Call with the GIL held.
void sync_log_level();

// sync_log_level() when the logger's level may have changed since the last
// sync, else nothing (one dict lookup): called with the GIL held on entry to
// the module's calls and before each record goes to Python, so the library
// follows the logger with nobody calling sync_log_level().
void follow_log_level();

}  // namespace kvxfer::python
