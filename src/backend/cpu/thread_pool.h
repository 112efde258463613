// The CPU backend's worker threads: a fork-join pool that owns its waiting behaviour. Between jobs a worker spins
// for a few microseconds (a decode step issues its jobs back to back) and then sleeps on a futex
// (std::atomic::wait), so an idle pool costs nothing and an oversubscribed machine is not slowed by spinning
// threads, as OpenMP's default active wait does. Nothing is pinned.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mambacpp::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads >= 1, the caller included
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // Runs fn(task) for every task in [0, n_tasks), task t on thread t % threads() (the caller is thread 0), and
  // returns when all are done. Static: the same task always lands on the same thread, so a thread streams the same
  // rows of a weight each step. The first exception thrown by a task is rethrown here. Calls from several threads
  // are serialised; a call from inside a task runs inline.
  void run(int64_t n_tasks, const std::function<void(int64_t)>& fn);

 private:
  void worker(int index);
  void work_share(int index);

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;
  std::atomic<uint32_t> generation_{0};  // bumped per job; workers wait on it
  std::atomic<int> pending_{0};          // workers still inside the current job
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::exception_ptr error_;
  std::mutex error_mutex_;
};

// The process-wide pool for `threads` threads (created on first use, one per distinct count).
ThreadPool& thread_pool(int threads);

// fn(begin, end) over [0, n) split into at most `threads` contiguous ranges of at least `grain` items each; runs
// inline when one range suffices.
template <class F>
void parallel_for(int threads, int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, n / std::max<int64_t>(grain, 1)));
  if (parts <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const std::function<void(int64_t)> task = [&](int64_t p) { fn(n * p / parts, n * (p + 1) / parts); };
  thread_pool(threads).run(parts, task);
}

// fn(i) for every i in [0, n), handed out one at a time to whichever of `threads` threads is free (for tasks of
// uneven cost); runs inline when n == 1 or threads == 1.
template <class F>
void parallel_tasks(int threads, int64_t n, F&& fn) {
  if (n <= 0) return;
  if (n == 1 || threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  const std::function<void(int64_t)> task = [&](int64_t) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  thread_pool(threads).run(std::min<int64_t>(threads, n), task);
}

}  // namespace mambacpp::cpu
