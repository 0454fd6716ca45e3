// SPDX-License-Identifier: Apache-2.0
#include "core/registration_worker.h"

#include <utility>

namespace kvxfer::internal {

RegistrationWorker::~RegistrationWorker() { stop(); }

bool RegistrationWorker::submit(Task task) {
  {
    MutexLock lock(mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(task));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
  return true;
}

void RegistrationWorker::stop() {
  std::deque<Task> abandoned;
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    MutexLock lock(mu_);
    abandoned.swap(queue_);
  }
  for (auto& task : abandoned) task(false);
}

std::size_t RegistrationWorker::pending() const {
  MutexLock lock(mu_);
  return queue_.size() + running_;
}

void RegistrationWorker::loop() {
  MutexLock lock(mu_);
  for (;;) {
    while (!stopping_ && queue_.empty()) lock.wait(cv_);
    if (stopping_) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    task(true);
    lock.lock();
    --running_;
  }
}

}  // namespace kvxfer::internal
