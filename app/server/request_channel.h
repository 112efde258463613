// Hands one HTTP request's engine events from the stepping thread to the HTTP worker that answers it. One channel
// per HTTP request; its prompts (choices) are engine requests whose events carry their choice index.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "mambacpp/engine.h"

namespace mambacpp::server {

struct ChoiceEvent {
  size_t choice = 0;
  std::string text;                      // new text (whole UTF-8 characters)
  std::optional<GeneratedToken> token;   // the new token, when the event carries one
  std::optional<GenerateResult> result;  // set on the choice's last event
};

class RequestChannel {
 public:
  explicit RequestChannel(size_t choices) : unfinished_(choices) {}

  // The engine callback for choice `i` (runs on the stepping thread; the channel must be kept alive by the caller).
  void push(size_t choice, const RequestEvent& e) {
    ChoiceEvent ce;
    ce.choice = choice;
    ce.text.assign(e.text);
    if (e.token) ce.token = *e.token;
    if (e.finished) ce.result = *e.result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (e.finished) --unfinished_;
      events_.push_back(std::move(ce));
    }
    ready_.notify_all();
  }

  // Waits until an event is there (or `timeout` passes) and takes every one there is.
  std::deque<ChoiceEvent> take(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    return std::exchange(events_, {});
  }

  // Every choice has sent its last event (some may still be waiting to be taken).
  bool finished() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return unfinished_ == 0;
  }

  // Engine ids of the choices submitted so far (for cancel).
  std::vector<RequestId> ids() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ids_;
  }
  void add_id(RequestId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    ids_.push_back(id);
  }
  // A choice that never reached the engine (its submit failed) counts as finished.
  void drop_unsubmitted(size_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    unfinished_ -= n;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<ChoiceEvent> events_;
  size_t unfinished_;
  std::vector<RequestId> ids_;
};

}  // namespace mambacpp::server
