// SPDX-License-Identifier: Apache-2.0
// One thread that runs peer registrations in submission order, so they stay
// serialized against each other and off the callers' threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvxfer::internal {

class RegistrationWorker {
 public:
  // A task runs with run == true, or with run == false when the worker
  // stopped before reaching it (it must then connect nothing: it only lets
  // go of what it owns and fails its future).
  using Task = std::function<void(bool run)>;

  RegistrationWorker() = default;
  ~RegistrationWorker();
  RegistrationWorker(const RegistrationWorker&) = delete;
  RegistrationWorker& operator=(const RegistrationWorker&) = delete;

  // Returns false (and does not take the task) once stop() was called. The
  // thread starts with the first task.
  bool submit(Task task) EXCLUDES(mu_);

  // Stops taking tasks, lets the running one finish, abandons the queued
  // ones, joins the thread. Idempotent.
  void stop() EXCLUDES(mu_);

  [[nodiscard]] std::size_t pending() const EXCLUDES(mu_);

 private:
  void loop() EXCLUDES(mu_);

  mutable Mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_ GUARDED_BY(mu_);
  std::size_t running_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  // Started by the first submit() (under mu_), joined by stop().
  std::thread thread_;
};

}  // namespace kvxfer::internal
