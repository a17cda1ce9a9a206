#include "distributed/task_queue.h"

#include <c10/util/Exception.h>

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

void TaskQueue::stop(const std::function<void()>& if_busy) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
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
    --pending_;
  }
}

}  // namespace detail
}  // namespace ddp
