// The library's logger. Belongs to no layer: the core, the engines and the
// bindings all write to it; the public kvxfer/log.h sets its level and sink.
#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <memory>

namespace kvxfer::internal {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("kvxfer")) return existing;
    auto created = spdlog::stderr_color_mt("kvxfer");
    created->set_level(spdlog::level::warn);
    if (const char* level = std::getenv("KVXFER_LOG_LEVEL")) {
      created->set_level(spdlog::level::from_str(level));
    }
    return created;
  }();
  return *logger;
}

}  // namespace kvxfer::internal
