#pragma once

// One worker thread that runs a group's collectives in the order they were launched, so
// that a backend built from blocking calls is asynchronous exactly as Gloo is: the
// collective returns a PendingWork at once, and DDP's buckets overlap backward. The
// shm backend and the hierarchy each run one.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ddp {
namespace detail {

class TaskQueue {
 public:
  using Task = std::function<void()>;

  TaskQueue();
  ~TaskQueue();
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  /// Queues `task`, which must complete its own future, error or not. Not after stop().
  void submit(Task task);

  /// Takes no more tasks, lets the worker run what is queued and joins it. When a task
  /// is still queued or running, `if_busy` is called first (under the queue's lock): the
  /// owner makes those tasks fail at once there (the shm backend aborts its transport,
  /// so that neither this rank nor its peers wait for the whole timeout). Idempotent.
  void stop(const std::function<void()>& if_busy = nullptr);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;  // pending_ reached 0
  std::deque<Task> queue_;
  size_t pending_ = 0;  // queued or running
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace detail
}  // namespace ddp
