// SPDX-License-Identifier: Apache-2.0
#include "log_bridge.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "kvxfer/log.h"

namespace kvxfer::python {
namespace {

namespace py = pybind11;

int python_level(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return 5;
    case LogLevel::kDebug:
      return 10;
    case LogLevel::kInfo:
      return 20;
    case LogLevel::kWarn:
      return 30;
    case LogLevel::kError:
      return 40;
    default:
      return 50;
  }
}

// The names stderr records carry once the bridge is detached.
const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "trace";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kCritical:
      return "critical";
    case LogLevel::kOff:
      break;
  }
  return "off";
}

// The least verbose library level that still emits every record a Python
// logger at `level` would accept.
LogLevel library_level(int level) {
  if (level <= 5) return LogLevel::kTrace;
  if (level <= 10) return LogLevel::kDebug;
  if (level <= 20) return LogLevel::kInfo;
  if (level <= 30) return LogLevel::kWarn;
  if (level <= 40) return LogLevel::kError;
  if (level <= 50) return LogLevel::kCritical;
  return LogLevel::kOff;
}

// Hands each record to logging.getLogger("kvxfer").log(level, message).
//
// Records come from the library's log thread alone (kvxfer/log.h), which
// holds none of the library's locks while it waits for the GIL, so a caller
// holding the GIL that logs (or calls into a transport) never waits for it.
//
// Once the interpreter starts finalizing, a thread that asks for the GIL is
// stopped for good, even one holding a transport's lock. So the atexit hook
// detaches the sink first, and after that records go to stderr.
class PythonLoggingSink {
 public:
  // Takes a reference to `logger` that is never dropped: the sink may be
  // destroyed after the interpreter is gone.
  explicit PythonLoggingSink(PyObject* logger) : logger_(logger) {}

  [[nodiscard]] PyObject* logger() const { return logger_; }

  void log(LogLevel level, std::string_view message) {
    in_flight_.fetch_add(1);
    if (!attached_.load()) {
      in_flight_.fetch_sub(1);
      if (level >= LogLevel::kWarn) {
        std::fprintf(stderr, "kvxfer [%s] %.*s\n", level_name(level),
                     static_cast<int>(message.size()), message.data());
      }
      return;
    }
    const PyGILState_STATE gil = PyGILState_Ensure();
    forward(level, message);
    PyGILState_Release(gil);
    in_flight_.fetch_sub(1);
  }

  // Called with the GIL held. Waits (GIL released) for records already on
  // their way into Python.
  void detach() {
    py::gil_scoped_release nogil;
    // What was logged before exit reaches logging while it still can.
    static_cast<void>(flush_log(std::chrono::seconds(1)));
    attached_.store(false);
    while (in_flight_.load() != 0) std::this_thread::yield();
  }

 private:
  void forward(LogLevel level, std::string_view message) {
    // A record can be emitted while the calling thread has an exception
    // pending (a failed call being unwound); keep it intact.
#if PY_VERSION_HEX >= 0x030C0000
    PyObject* pending = PyErr_GetRaisedException();
#else
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
#endif
    // A thread that only logs (an engine's) follows a level change too.
    try {
      follow_log_level();
    } catch (const py::error_already_set&) {
      PyErr_Clear();
    }
    PyObject* text =
        PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
    PyObject* result = nullptr;
    if (text != nullptr) {
      result = PyObject_CallMethod(logger_, "log", "iO", python_level(level), text);
      Py_DECREF(text);
    }
    if (result == nullptr) PyErr_WriteUnraisable(logger_);
    Py_XDECREF(result);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(pending);
#else
    PyErr_Restore(type, value, traceback);
#endif
  }

  PyObject* const logger_;
  std::atomic<bool> attached_{true};
  std::atomic<int> in_flight_{0};
};

std::shared_ptr<PythonLoggingSink>& bridge() {
  static std::shared_ptr<PythonLoggingSink> sink;
  return sink;
}

// How follow_log_level() tells that the logger's level may have changed.
// logging caches isEnabledFor()'s answers in each logger's `_cache` dict and
// empties every logger's cache (in place, under the GIL) whenever a level
// changes: Logger.setLevel on any logger, logging.disable, dictConfig. A
// key of ours in that dict is gone once such a change happened, so its
// presence is checked, one lookup, and put back when the level is read
// again. Only our key counts: logging refills the dict with its own keys
// whenever any record is logged. Without a `_cache` dict (another Python),
// the level is read again at most every kFallbackPeriod.
struct LevelWatch {
  PyObject* cache = nullptr;     // the kvxfer logger's _cache; never released
  PyObject* sentinel = nullptr;  // an object() nobody else has
  std::chrono::steady_clock::time_point next_read{};
};
LevelWatch g_watch;  // read and written with the GIL held
constexpr std::chrono::milliseconds kFallbackPeriod{100};

// An int attribute of `obj`, or nullopt (error cleared) when it has none.
std::optional<long> int_attr(PyObject* obj, const char* name) {
  PyObject* value = PyObject_GetAttrString(obj, name);
  std::optional<long> out;
  if (value != nullptr && PyLong_Check(value)) {
    const long v = PyLong_AsLong(value);
    if (v != -1 || PyErr_Occurred() == nullptr) out = v;
  }
  Py_XDECREF(value);
  PyErr_Clear();
  return out;
}

// The lowest level the logger passes on: what isEnabledFor() computes
// (logger.getEffectiveLevel(), and logging.disable()'s manager.disable),
// read from the attributes alone, so that no Python code runs and no other
// thread can change the level while it is read (see follow_log_level()).
// nullopt when the logger does not have those attributes.
std::optional<long> threshold(PyObject* logger) {
  long level = 0;
  PyObject* at = logger;
  Py_INCREF(at);
  for (int depth = 0; at != Py_None && depth < 64; ++depth) {
    const std::optional<long> own = int_attr(at, "level");
    if (!own) {
      Py_DECREF(at);
      return std::nullopt;
    }
    if (*own != 0) {
      level = *own;
      break;
    }
    PyObject* parent = PyObject_GetAttrString(at, "parent");
    Py_DECREF(at);
    if (parent == nullptr) {
      PyErr_Clear();
      return std::nullopt;
    }
    at = parent;
  }
  Py_DECREF(at);
  PyObject* manager = PyObject_GetAttrString(logger, "manager");
  if (manager == nullptr) {
    PyErr_Clear();
    return std::nullopt;
  }
  const std::optional<long> disable = int_attr(manager, "disable");
  Py_DECREF(manager);
  if (!disable) return std::nullopt;
  return std::max(level, *disable + 1);
}

}  // namespace

void install_log_bridge() {
  if (bridge()) return;
  py::object logger = py::module_::import("logging").attr("getLogger")("kvxfer");
  if (py::hasattr(logger, "_cache")) {
    py::object cache = logger.attr("_cache");
    if (PyDict_CheckExact(cache.ptr())) {
      g_watch.cache = cache.release().ptr();
      g_watch.sentinel = py::module_::import("builtins").attr("object")().release().ptr();
    }
  }
  bridge() = std::make_shared<PythonLoggingSink>(logger.release().ptr());
  // The library keeps this std::function, and so the sink, past the
  // interpreter's end; records then go to stderr (see detach()).
  set_log_sink(
      [sink = bridge()](LogLevel level, std::string_view message) { sink->log(level, message); });
  py::module_::import("atexit").attr("register")(py::cpp_function([] { bridge()->detach(); }));
  sync_log_level();
}

void sync_log_level() {
  if (!bridge()) return;
  PyObject* logger = bridge()->logger();
  // Marked first, read second: a change after the mark removes it again,
  // and the next call reads once more.
  if (g_watch.cache != nullptr && PyDict_SetItem(g_watch.cache, g_watch.sentinel, Py_True) != 0) {
    throw py::error_already_set();
  }
  g_watch.next_read = std::chrono::steady_clock::now() + kFallbackPeriod;
  const std::optional<long> level = threshold(logger);
  set_log_level(library_level(level ? static_cast<int>(std::min(*level, 1000L))
                                    : py::handle(logger).attr("getEffectiveLevel")().cast<int>()));
}

void follow_log_level() {
  if (g_watch.cache != nullptr) {
    if (PyDict_GetItemWithError(g_watch.cache, g_watch.sentinel) != nullptr) return;
    if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  } else if (!bridge() || std::chrono::steady_clock::now() < g_watch.next_read) {
    return;
  }
  sync_log_level();
}

}  // namespace kvxfer::python
