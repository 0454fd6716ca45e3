// SPDX-License-Identifier: Apache-2.0
// Captures what the library logs through spdlog logger "kvxfer", so a test
// can assert that a warning was (or was not) logged. Attach only while no
// other thread logs: spdlog does not guard a logger's sink list.
#pragma once

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace kvxfer::unit {

class LogCapture {
 public:
  struct Entry {
    spdlog::level::level_enum level;
    std::string text;
  };

  LogCapture() : logger_(get_or_create()), sink_(std::make_shared<Sink>()) {
    saved_level_ = logger_->level();
    for (const auto& s : logger_->sinks()) {
      saved_sink_levels_.push_back(s->level());
      // Keep stderr as quiet as before while we listen at debug.
      s->set_level(std::max(s->level(), std::max(saved_level_, spdlog::level::warn)));
    }
    logger_->sinks().push_back(sink_);
    logger_->set_level(spdlog::level::debug);
  }
  ~LogCapture() {
    auto& sinks = logger_->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    for (std::size_t i = 0; i < sinks.size() && i < saved_sink_levels_.size(); ++i) {
      sinks[i]->set_level(saved_sink_levels_[i]);
    }
    logger_->set_level(saved_level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  [[nodiscard]] std::vector<Entry> entries() const { return sink_->entries(); }
  void clear() { sink_->clear(); }

  [[nodiscard]] std::size_t count(spdlog::level::level_enum level) const {
    const auto all = entries();
    return static_cast<std::size_t>(std::count_if(
        all.begin(), all.end(), [level](const Entry& e) { return e.level == level; }));
  }
  // True if some entry at `level` contains every one of `words`.
  [[nodiscard]] bool contains(spdlog::level::level_enum level,
                              std::initializer_list<std::string_view> words) const {
    for (const Entry& e : entries()) {
      if (e.level != level) continue;
      if (std::all_of(words.begin(), words.end(),
                      [&e](std::string_view w) { return e.text.find(w) != std::string::npos; })) {
        return true;
      }
    }
    return false;
  }

 private:
  class Sink final : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::vector<Entry> entries() {
      std::lock_guard lock(this->mutex_);
      return entries_;
    }
    void clear() {
      std::lock_guard lock(this->mutex_);
      entries_.clear();
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      entries_.push_back(Entry{msg.level, std::string(msg.payload.data(), msg.payload.size())});
    }
    void flush_() override {}

   private:
    std::vector<Entry> entries_;
  };

  static std::shared_ptr<spdlog::logger> get_or_create() {
    if (auto existing = spdlog::get("kvxfer")) return existing;
    try {
      auto created = spdlog::stderr_color_mt("kvxfer");
      created->set_level(spdlog::level::warn);
      return created;
    } catch (const spdlog::spdlog_ex&) {
      return spdlog::get("kvxfer");
    }
  }

  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<Sink> sink_;
  spdlog::level::level_enum saved_level_ = spdlog::level::warn;
  std::vector<spdlog::level::level_enum> saved_sink_levels_;
};

}  // namespace kvxfer::unit
