#include "log_bridge.h"

#include <fmt/format.h>
#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "common/log.h"

namespace kvxfer::python {
namespace {

namespace py = pybind11;

int python_level(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return 5;
    case spdlog::level::debug:
      return 10;
    case spdlog::level::info:
      return 20;
    case spdlog::level::warn:
      return 30;
    case spdlog::level::err:
      return 40;
    default:
      return 50;
  }
}

// The least verbose spdlog level that still emits every record a Python
// logger at `level` would accept.
spdlog::level::level_enum spdlog_level(int level) {
  if (level <= 5) return spdlog::level::trace;
  if (level <= 10) return spdlog::level::debug;
  if (level <= 20) return spdlog::level::info;
  if (level <= 30) return spdlog::level::warn;
  if (level <= 40) return spdlog::level::err;
  if (level <= 50) return spdlog::level::critical;
  return spdlog::level::off;
}

// Hands each record to logging.getLogger("kvxfer").log(level, message).
//
// Records come from any thread: a caller's (the GIL is released around
// every call that can log while holding the transport's lock), the
// registration worker, an engine thread. The GIL serializes them, so the
// sink has no lock of its own: a sink lock held while waiting for the GIL
// would deadlock against a thread that holds the GIL and logs.
//
// Once the interpreter starts finalizing, a thread that asks for the GIL is
// stopped for good, even one holding a transport's lock. So the atexit hook
// detaches the sink first, and after that records go to stderr.
class PythonLoggingSink final : public spdlog::sinks::sink {
 public:
  // Takes a reference to `logger` that is never dropped: the sink may be
  // destroyed after the interpreter is gone.
  explicit PythonLoggingSink(PyObject* logger) : logger_(logger) {}

  [[nodiscard]] PyObject* logger() const { return logger_; }

  void log(const spdlog::details::log_msg& msg) override {
    in_flight_.fetch_add(1);
    if (!attached_.load()) {
      in_flight_.fetch_sub(1);
      if (msg.level >= spdlog::level::warn) {
        std::fprintf(stderr, "kvxfer [%s] %.*s\n", spdlog::level::to_string_view(msg.level).data(),
                     static_cast<int>(msg.payload.size()), msg.payload.data());
      }
      return;
    }
    const PyGILState_STATE gil = PyGILState_Ensure();
    forward(msg);
    PyGILState_Release(gil);
    in_flight_.fetch_sub(1);
  }

  void flush() override {}
  void set_pattern(const std::string&) override {}
  void set_formatter(std::unique_ptr<spdlog::formatter>) override {}

  // Called with the GIL held. Waits (GIL released) for records already on
  // their way into Python.
  void detach() {
    attached_.store(false);
    py::gil_scoped_release nogil;
    while (in_flight_.load() != 0) std::this_thread::yield();
  }

 private:
  void forward(const spdlog::details::log_msg& msg) {
    // A record can be emitted while the calling thread has an exception
    // pending (a failed call being unwound); keep it intact.
#if PY_VERSION_HEX >= 0x030C0000
    PyObject* pending = PyErr_GetRaisedException();
#else
    PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
    PyErr_Fetch(&type, &value, &traceback);
#endif
    PyObject* text = PyUnicode_DecodeUTF8(msg.payload.data(),
                                          static_cast<Py_ssize_t>(msg.payload.size()), "replace");
    PyObject* result = nullptr;
    if (text != nullptr) {
      result = PyObject_CallMethod(logger_, "log", "iO", python_level(msg.level), text);
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
  // Imported before any transport exists, so nothing logs concurrently.
  internal::log().sinks().assign(1, bridge());
  py::module_::import("atexit").attr("register")(py::cpp_function([] { bridge()->detach(); }));
  sync_log_level();
}

void sync_log_level() {
  if (!bridge()) return;
  const int level = py::handle(bridge()->logger()).attr("getEffectiveLevel")().cast<int>();
  internal::log().set_level(spdlog_level(level));
}

}  // namespace kvxfer::python
