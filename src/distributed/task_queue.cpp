#include "distributed/task_queue.h"

#include <c10/util/Exception.h>

#include <chrono>

namespace ddp {
namespace detail {

TaskQueue::TaskQueue() : worker_([this] { loop(); }) {}

TaskQueue::~TaskQueue() { stop(); }

void TaskQueue::submit(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_INTERNAL_ASSERT(!stopping_, "collective launched on a shut-down group");
    queue_.push_back(std::move(task));
    ++pending_;
  }
  cv_.notify_one();
}

// A task completes its future before it returns, so a caller whose wait() just ended
// can reach stop() while the worker is still leaving that task: nothing is in flight
// then, only the bookkeeping after it. So a queue with nothing queued beyond the
// running task gets a moment to go idle before it counts as busy.
void TaskQueue::stop(const std::function<void()>& if_busy) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    if (pending_ == 1 && queue_.empty()) {
      idle_cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return pending_ == 0; });
    }
    if (pending_ > 0 && if_busy) if_busy();
  }
  cv_.notify_one();
  if (worker_.joinable()) worker_.join();
}

void TaskQueue::loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
    std::lock_guard<std::mutex> lock(mutex_);
    if (--pending_ == 0) idle_cv_.notify_all();
  }
}

}  // namespace detail
}  // namespace ddp
