// SPDX-License-Identifier: Apache-2.0
#include "log_bridge.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
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

}  // namespace

void install_log_bridge() {
  if (bridge()) return;
  py::object logger = py::module_::import("logging").attr("getLogger")("kvxfer");
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
  const int level = py::handle(bridge()->logger()).attr("getEffectiveLevel")().cast<int>();
  set_log_level(library_level(level));
}

}  // namespace kvxfer::python
