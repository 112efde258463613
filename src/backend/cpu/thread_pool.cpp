#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <map>
#include <memory>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MAMBACPP_PAUSE() _mm_pause()
#else
#define MAMBACPP_PAUSE() std::this_thread::yield()
#endif

namespace mambacpp::cpu {
namespace {

// Spin iterations (one pause each, ~10-40 ns) before a waiting thread sleeps: a few tens of microseconds, enough to
// bridge the short serial pieces between the jobs of one decode step, short enough to cost nothing when idle.
constexpr int kSpins = 2000;

thread_local bool t_inside_task = false;

}  // namespace

ThreadPool::ThreadPool(int threads) : threads_(std::max(1, threads)) {
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work_share(int index) {
  for (int64_t t = index; t < n_tasks_; t += threads_) {
    try {
      (*fn_)(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker(int index) {
  t_inside_task = true;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int s = 0; g == seen && s < kSpins; ++s) {
      MAMBACPP_PAUSE();
      g = generation_.load(std::memory_order_acquire);
    }
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    work_share(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (threads_ == 1 || n_tasks == 1 || t_inside_task) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  std::lock_guard<std::mutex> lock(call_mutex_);
  fn_ = &fn;
  n_tasks_ = n_tasks;
  error_ = nullptr;
  pending_.store(threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  t_inside_task = true;
  work_share(0);
  t_inside_task = false;
  int left = pending_.load(std::memory_order_acquire);
  for (int s = 0; left != 0 && s < kSpins; ++s) {
    MAMBACPP_PAUSE();
    left = pending_.load(std::memory_order_acquire);
  }
  while (left != 0) {
    pending_.wait(left, std::memory_order_acquire);
    left = pending_.load(std::memory_order_acquire);
  }
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

ThreadPool& thread_pool(int threads) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<ThreadPool>& p = pools[std::max(1, threads)];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

}  // namespace mambacpp::cpu
