// One parser's fuzz entry point, written once and built two ways:
// - with clang and -DMAMBACPP_FUZZ=ON, as libFuzzer's LLVMFuzzerTestOneInput (fuzz/CMakeLists.txt);
// - with MAMBACPP_FUZZ_REPLAY defined, into the default (gcc) test suite, where tests/fuzz_corpus_replay_test.cpp runs
//   every committed seed (fuzz/corpus/<name>/) and every regression input (fuzz/regressions/<name>/) through it, so
//   that fuzz findings stay fixed without clang.
// The body may throw mambacpp::Error: the input was refused, which is the expected outcome for most inputs. Any
// other exception escaping, a crash, a sanitizer report or a hang is a bug. Checks of what a parser accepted use
// MAMBACPP_FUZZ_CHECK, which traps under libFuzzer (a finding) and throws std::logic_error in the replay test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "mambacpp/error.h"

namespace mambacpp::fuzz {

using TargetFn = void (*)(const uint8_t* data, size_t size);
struct Target {
  const char* name;
  TargetFn run;
};
inline std::vector<Target>& registry() {
  static std::vector<Target> targets;
  return targets;
}
struct Register {
  Register(const char* name, TargetFn fn) { registry().push_back({name, fn}); }
};

}  // namespace mambacpp::fuzz

#ifdef MAMBACPP_FUZZ_REPLAY
#define MAMBACPP_FUZZ_CHECK(cond) \
  do {                            \
    if (!(cond)) throw std::logic_error("fuzz check failed: " #cond); \
  } while (0)
#define MAMBACPP_FUZZ_TARGET(name)                                                                \
  static void name##_one_input(const uint8_t* data, size_t size);                                 \
  static const ::mambacpp::fuzz::Register name##_registered(#name, name##_one_input);             \
  static void name##_one_input(const uint8_t* data, size_t size)
#else
#define MAMBACPP_FUZZ_CHECK(cond) \
  do {                            \
    if (!(cond)) __builtin_trap(); \
  } while (0)
#define MAMBACPP_FUZZ_TARGET(name)                                                                \
  static void name##_one_input(const uint8_t* data, size_t size);                                 \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {                       \
    try {                                                                                         \
      name##_one_input(data, size);                                                               \
    } catch (const ::mambacpp::Error&) {                                                          \
    }                                                                                             \
    return 0;                                                                                     \
  }                                                                                               \
  static void name##_one_input(const uint8_t* data, size_t size)
#endif
