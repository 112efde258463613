// Files are replaced whole or not at all (src/core/atomic_file.h): the program, run as a user runs it, is made to
// fail in the middle of a save — a file-size limit, a full file system, no permission, a kill -9 — and the previous
// file must be there byte for byte, with an error that names the file and the reason. `logits` streams its rows:
// its peak memory does not grow with the number of positions.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "mambacpp/error.h"
#include "mambacpp/npy.h"
#include "support/test_support.h"

namespace mambacpp {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string default_model() { return test::source_dir() + "/models/default"; }

// Temporary files an AtomicFile left in `dir` (a kill leaves one; a failure must not).
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) names.push_back(e.path().filename());
  return names;
}

struct ChildResult {
  int exit_code = -1;   // -1 when killed by a signal
  int signal = 0;
  std::string err;
  std::string out;
  long max_rss_kb = 0;
};

// Runs the mambacpp binary with `args` in a child; `setup` runs in the child before exec (limits, identity).
// Returns once the child ends, or hands its pid to `while_running` first when that is given.
ChildResult run_child(const std::vector<std::string>& args, const std::function<void()>& setup = {},
                      const std::function<void(pid_t)>& while_running = {}) {
  test::TempDir tmp("mambacpp_child");
  const std::string err_path = tmp.file("stderr.txt");
  const std::string out_path = tmp.file("stdout.txt");
  std::vector<std::string> argv_s{MAMBACPP_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) fail("fork: ", std::strerror(errno));
  if (pid == 0) {
    const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) ::dup2(fd, 2);
    if (out >= 0) ::dup2(out, 1);
    if (setup) setup();
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (while_running) while_running(pid);
  int status = 0;
  struct rusage ru {};
  while (::wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {}
  ChildResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.err = slurp(err_path);
  r.out = slurp(out_path);
  r.max_rss_kb = ru.ru_maxrss;
  return r;
}

std::vector<std::string> save_args(const std::string& prompt, const std::string& path) {
  return {"generate", "--device", "cpu", "--model", default_model(), "-p", prompt, "-n", "2", "--temp", "0",
          "--save-state", path};
}

// A state file of the default model saved by the CLI (about 1.1 MB), and its bytes.
std::string save_reference(const std::string& path) {
  const ChildResult r = run_child(save_args("first turn of a conversation", path));
  if (r.exit_code != 0) fail("the reference save failed: ", r.err);
  return slurp(path);
}

TEST(AtomicFile, CommitReplacesAndKeepsTheMode) {
  test::TempDir tmp;
  const std::string path = tmp.file("f.bin");
  std::ofstream(path) << "old";
  ::chmod(path.c_str(), 0640);
  {
    AtomicFile f(path, "test file");
    f.write("new contents");
    EXPECT_EQ(slurp(path), "old");  // nothing visible before commit
    f.commit();
  }
  EXPECT_EQ(slurp(path), "new contents");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_TRUE(leftovers(tmp.path()).empty());
}

TEST(AtomicFile, WithoutCommitThePreviousFileStaysAndNoTemporaryIsLeft) {
  test::TempDir tmp;
  const std::string path = tmp.file("f.bin");
  std::ofstream(path) << "old";
  {
    AtomicFile f(path, "test file");
    std::string big(3 << 20, 'x');  // past the gathering buffer: reaches the temporary file
    f.write(big);
    EXPECT_EQ(leftovers(tmp.path()).size(), 1u);
  }
  EXPECT_EQ(slurp(path), "old");
  EXPECT_TRUE(leftovers(tmp.path()).empty());
}

TEST(AtomicFile, NoFileIsCreatedWhenNoneExistedAndTheSaveFails) {
  test::TempDir tmp;
  { AtomicFile f(tmp.file("new.bin"), "test file"); f.write("abandoned"); }
  EXPECT_FALSE(fs::exists(tmp.file("new.bin")));
  const std::string err = test::error_of([&] { AtomicFile f(tmp.path(), "test file"); });
  EXPECT_THAT(err, AllOf(HasSubstr(tmp.path()), HasSubstr("is a directory")));
  const std::string missing = test::error_of([&] { AtomicFile f(tmp.file("no/such/dir/f"), "test file"); });
  EXPECT_THAT(missing, AllOf(HasSubstr("no/such/dir/f"), HasSubstr("ENOENT"), HasSubstr("no file was written")));
}

TEST(AtomicFile, ThroughASymbolicLinkTheLinkStaysAndItsTargetIsReplaced) {
  test::TempDir tmp;
  std::ofstream(tmp.file("target")) << "old";
  fs::create_symlink(tmp.file("target"), tmp.file("link"));
  write_file_atomically(tmp.file("link"), "new", "test file");
  EXPECT_TRUE(fs::is_symlink(tmp.file("link")));
  EXPECT_EQ(slurp(tmp.file("target")), "new");
}

TEST(NpyF32Writer, RowsAppendedInPiecesReadBackAndAShortFileIsNeverWritten) {
  test::TempDir tmp;
  const std::string path = tmp.file("a.npy");
  std::vector<float> v(6 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f - 3.0f;
  {
    NpyF32Writer w(path, {6, 5});
    w.append(v.data(), 10);
    w.append(v.data() + 10, 20);
    w.commit();
  }
  NpyArray a = read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{6, 5}));
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(a.values[i], v[i]) << i;
  const std::string before = slurp(path);
  {
    NpyF32Writer w(path, {6, 5});
    w.append(v.data(), 5);
    EXPECT_THAT(test::error_of([&] { w.commit(); }), HasSubstr("5 elements written, the shape holds 30"));
    EXPECT_THAT(test::error_of([&] { w.append(v.data(), 26); }), HasSubstr("more than the 30"));
  }
  EXPECT_EQ(slurp(path), before);
  EXPECT_TRUE(leftovers(tmp.path()).empty());
}

// setrlimit(RLIMIT_FSIZE) in the child with SIGXFSZ ignored: write(2) fails with EFBIG past the limit.
TEST(DurableFiles, SaveUnderAFileSizeLimitKeepsThePreviousState) {
  test::TempDir tmp;
  const std::string path = tmp.file("s.state");
  const std::string before = save_reference(path);
  ASSERT_GT(before.size(), 256u << 10);
  const auto limit = [] {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl {256 << 10, 256 << 10};
    ::setrlimit(RLIMIT_FSIZE, &rl);
  };
  const ChildResult r = run_child(save_args("another prompt, another state", path), limit);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("state file '" + path + "'"), HasSubstr("EFBIG"), HasSubstr("File too large"),
                           HasSubstr("the previous file is left as it was")));
  EXPECT_TRUE(slurp(path) == before) << "the state file changed";
  EXPECT_TRUE(leftovers(tmp.path()).empty());
}

// The same limit without ignoring the signal: the program ignores SIGXFSZ itself, so it reports instead of dying.
TEST(DurableFiles, TheProgramReportsAFileSizeLimitInsteadOfDyingOfSigxfsz) {
  test::TempDir tmp;
  std::ofstream(tmp.file("t.txt")) << "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20";
  const std::string out = tmp.file("l.npy");
  std::ofstream(out) << "previous";
  const ChildResult r = run_child(
      {"logits", "--device", "cpu", "--model", default_model(), "--tokens-file", tmp.file("t.txt"), "--out", out},
      [] {
        ::signal(SIGXFSZ, SIG_DFL);
        struct rlimit rl {64 << 10, 64 << 10};  // 20 rows of 4096 logits are 320 KiB
        ::setrlimit(RLIMIT_FSIZE, &rl);
      });
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr(".npy file '" + out + "'"), HasSubstr("EFBIG")));
  EXPECT_EQ(slurp(out), "previous");
  EXPECT_TRUE(leftovers(tmp.path()).empty());
}

TEST(DurableFiles, SaveIntoADirectoryWithoutWritePermissionKeepsThePreviousState) {
  test::TempDir tmp;
  ::chmod(tmp.path().c_str(), 0755);  // an unprivileged child must reach the directory inside
  const std::string dir = tmp.file("ro");
  fs::create_directory(dir);
  const std::string path = dir + "/s.state";
  const std::string before = save_reference(path);
  ::chmod(dir.c_str(), 0555);
  // Root is not refused by permissions: the child then drops to nobody, as the program run by a user would be.
  const bool root = ::geteuid() == 0;
  const ChildResult r = run_child(save_args("another prompt, another state", path), [root] {
    if (root && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(126);
  });
  ::chmod(dir.c_str(), 0755);
  ASSERT_NE(r.exit_code, 126) << "could not drop root privileges";
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("state file '" + path + "'"), HasSubstr("EACCES"),
                           HasSubstr("the previous file is left as it was")));
  EXPECT_TRUE(slurp(path) == before);
}

// A kill -9 the moment the temporary file appears (inotify) lands inside the save: the target must be the previous
// file byte for byte. Attempts repeat until one kill is seen to land before the rename (its temporary file is left).
TEST(DurableFiles, KillDuringASaveLeavesThePreviousStateIntact) {
  test::TempDir tmp;
  const std::string path = tmp.file("s.state");
  std::string previous = save_reference(path);
  // The bytes a completed second save gives (saved elsewhere): after a kill the file is the previous one or this.
  const std::string other = tmp.file("other.state");
  ASSERT_EQ(run_child(save_args("another prompt, another state", other)).exit_code, 0);
  const std::string replaced = slurp(other);
  fs::remove(other);
  ASSERT_NE(previous, replaced);
  int mid_save = 0;
  for (int attempt = 0; attempt < 20 && mid_save < 3; ++attempt) {
    const int in = ::inotify_init1(IN_CLOEXEC);
    ASSERT_GE(in, 0) << std::strerror(errno);
    ASSERT_GE(::inotify_add_watch(in, tmp.path().c_str(), IN_CREATE), 0);
    const ChildResult r = run_child(save_args("another prompt, another state", path), {}, [&](pid_t pid) {
      alignas(struct inotify_event) char buf[4096];
      struct pollfd p {in, POLLIN, 0};
      while (::poll(&p, 1, 60000) > 0) {
        const ssize_t n = ::read(in, buf, sizeof buf);
        for (ssize_t at = 0; at < n;) {
          const auto* e = reinterpret_cast<const struct inotify_event*>(buf + at);
          if (e->len > 0 && std::string(e->name).rfind(".s.state.tmp-", 0) == 0) {
            ::kill(pid, SIGKILL);
            return;
          }
          at += static_cast<ssize_t>(sizeof(struct inotify_event) + e->len);
        }
      }
      ::kill(pid, SIGKILL);
    });
    ::close(in);
    ASSERT_EQ(r.signal, SIGKILL) << "exit " << r.exit_code << ": " << r.err;
    const std::string now = slurp(path);
    const auto left = leftovers(tmp.path());
    if (!left.empty()) {
      ++mid_save;
      EXPECT_TRUE(now == previous) << "killed inside the save, the state file is not the previous one";
      for (const auto& name : left) fs::remove(tmp.file(name));
    } else {
      EXPECT_TRUE(now == previous || now == replaced) << "the state file is neither the previous one nor the new one";
    }
    previous = now;
  }
  EXPECT_GE(mid_save, 1) << "no kill landed inside a save in 20 attempts";
  // And the file still loads: a prompt continuing its tokens is served from it.
  const ChildResult load = run_child({"generate", "--device", "cpu", "--model", default_model(), "-p",
                                      "first turn of a conversation", "-n", "1", "--temp", "0", "--load-state", path});
  EXPECT_EQ(load.exit_code, 0) << load.err;
}

// The prefix cache's disk tier (generate --state-cache-dir): runs killed -9 the moment one of their cache files'
// temporary file appears leave it behind; the next run removes every such leftover before it reads the directory,
// and serves the conversation written before the kills from its file, with a fresh run's tokens.
TEST(DurableFiles, KillDuringPrefixCacheWritesLeavesNoTemporaryFileAfterTheRestart) {
  test::TempDir tmp;
  const std::string dir = tmp.file("cache");
  const auto gen = [&](std::vector<std::string> args, bool cache = true) {
    std::vector<std::string> a{"generate", "--device", "cpu", "--model", default_model(), "--json", "--temp", "0"};
    if (cache) a.insert(a.end(), {"--state-cache-dir", dir, "--state-cache-disk-mb", "64"});
    a.insert(a.end(), args.begin(), args.end());
    return a;
  };
  // What the cache's writes leave when killed: an AtomicFile's temporary, or a whole file not yet named.
  const auto unfinished = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename();
      if (n.find(".tmp-") != std::string::npos || n.find(".state.new") != std::string::npos) names.push_back(n);
    }
    return names;
  };
  const ChildResult first = run_child(gen({"-p", "def parse_args(", "-n", "16"}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const nlohmann::json turn1 = nlohmann::json::parse(first.out);

  bool left = false;
  for (int attempt = 0; attempt < 20 && !left; ++attempt) {
    const int in = ::inotify_init1(IN_CLOEXEC);
    ASSERT_GE(in, 0) << std::strerror(errno);
    ASSERT_GE(::inotify_add_watch(in, dir.c_str(), IN_CREATE), 0);
    const std::string prompt = "class Other" + std::to_string(attempt) + ":\n    def ";
    const ChildResult r = run_child(gen({"-p", prompt, "-n", "8"}), {}, [&](pid_t pid) {
      alignas(struct inotify_event) char buf[4096];
      struct pollfd p {in, POLLIN, 0};
      while (::poll(&p, 1, 60000) > 0) {
        const ssize_t n = ::read(in, buf, sizeof buf);
        for (ssize_t at = 0; at < n;) {
          const auto* e = reinterpret_cast<const struct inotify_event*>(buf + at);
          if (e->len > 0 && std::string(e->name).find(".tmp-") != std::string::npos) {
            ::kill(pid, SIGKILL);
            return;
          }
          at += static_cast<ssize_t>(sizeof(struct inotify_event) + e->len);
        }
      }
      ::kill(pid, SIGKILL);
    });
    ::close(in);
    ASSERT_EQ(r.signal, SIGKILL) << "exit " << r.exit_code << ": " << r.err;
    left = !unfinished().empty();
  }
  ASSERT_TRUE(left) << "no kill landed inside a cache write in 20 attempts";

  // The restart: the conversation's next turn, as token ids so that it continues the first turn exactly.
  std::vector<int32_t> turn2 = turn1["prompt_tokens"].get<std::vector<int32_t>>();
  for (int32_t t : turn1["tokens"].get<std::vector<int32_t>>()) turn2.push_back(t);
  const size_t cached_at_least = turn2.size() - 1;
  turn2.insert(turn2.end(), {13, 14, 15});
  std::string ids;
  for (int32_t t : turn2) ids += std::to_string(t) + " ";
  std::ofstream(tmp.file("turn2.txt")) << ids;
  const ChildResult second = run_child(gen({"--tokens-file", tmp.file("turn2.txt"), "-n", "8"}));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_THAT(unfinished(), ::testing::IsEmpty()) << "leftovers of the killed runs are still in the directory";
  const nlohmann::json served = nlohmann::json::parse(second.out);
  EXPECT_GE(served["cached_prompt_tokens"].get<size_t>(), cached_at_least) << second.out;
  const ChildResult fresh = run_child(gen({"--tokens-file", tmp.file("turn2.txt"), "-n", "8"}, false));
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  EXPECT_EQ(served["tokens"], nlohmann::json::parse(fresh.out)["tokens"]);
}

// A full file system without root: a tmpfs of 2 MiB mounted in a user and mount namespace of a child process,
// filled up after the first save. Kernels or sandboxes that refuse unprivileged user namespaces cannot run it: the
// test then says so and is reported as skipped, never as passed.
TEST(DurableFiles, SaveOnAFullFileSystemKeepsThePreviousState) {
  test::TempDir outer;
  ::chmod(outer.path().c_str(), 0755);
  const std::string mnt = outer.file("mnt");
  fs::create_directory(mnt);
  const std::string script =
      "B='" MAMBACPP_BINARY "'; M='" + default_model() + "'; D='" + mnt + "'; O='" + outer.path() + "'\n" +
      R"(gen() { "$B" generate --device cpu --model "$M" -n 2 --temp 0 -p "$1" --save-state "$D/s.state" >/dev/null; }
gen 'first turn of a conversation' 2>"$O/first.err" || exit 10
cp "$D/s.state" "$O/before.state"
dd if=/dev/zero of="$D/fill" bs=4096 2>/dev/null
gen 'another prompt, another state' 2>"$O/second.err"; echo $? >"$O/second.rc"
cp "$D/s.state" "$O/after.state"
ls -a "$D" >"$O/listing"
)";
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const auto refuse = [&](const char* step) {
      std::ofstream(outer.file("refused")) << step << ": " << std::strerror(errno);
      ::_exit(77);
    };
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) refuse("unshare(CLONE_NEWUSER | CLONE_NEWNS)");
    std::ofstream("/proc/self/setgroups") << "deny";
    { std::ofstream m("/proc/self/uid_map"); m << "0 " << uid << " 1"; if (!m.flush()) refuse("uid_map"); }
    { std::ofstream m("/proc/self/gid_map"); m << "0 " << gid << " 1"; if (!m.flush()) refuse("gid_map"); }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) refuse("mount --make-rprivate /");
    if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=2m") != 0) refuse("mount -t tmpfs");
    ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
    GTEST_SKIP() << "no full file system can be made here without root: " << slurp(outer.file("refused"));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "status " << status << "; first save: " << slurp(outer.file("first.err"));
  const std::string err = slurp(outer.file("second.err"));
  EXPECT_EQ(slurp(outer.file("second.rc")), "1\n") << err;
  EXPECT_THAT(err, AllOf(HasSubstr("state file '" + mnt + "/s.state'"), HasSubstr("ENOSPC"),
                         HasSubstr("No space left on device"), HasSubstr("the previous file is left as it was")));
  EXPECT_TRUE(slurp(outer.file("after.state")) == slurp(outer.file("before.state")));
  EXPECT_THAT(slurp(outer.file("listing")), Not(HasSubstr(".tmp-")));
}

// The rows go to the file as each piece finishes: ten times the positions, about the same peak memory. Holding the
// logits (twice, as before) would add 2 x 7200 rows x 16 KiB = 225 MiB. (A child's peak counts the image it was forked
// from, this test process, a few MB under ctest: it can only hide growth, never invent it.)
TEST(DurableFiles, LogitsPeakMemoryDoesNotGrowWithTheSequence) {
  test::TempDir tmp;
  const auto peak_kb = [&](int64_t L) {
    {
      std::ofstream t(tmp.file("t.txt"));
      for (int64_t i = 0; i < L; ++i) t << (i * 7919) % 4000 + 1 << ' ';
    }
    const ChildResult r = run_child({"logits", "--device", "cpu", "--model", default_model(), "--batch-tokens", "64",
                                     "--tokens-file", tmp.file("t.txt"), "--out", tmp.file("l.npy")});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(fs::file_size(tmp.file("l.npy")), static_cast<uintmax_t>(L) * 4096 * 4 + 128);
    fs::remove(tmp.file("l.npy"));
    return r.max_rss_kb;
  };
  const long small = peak_kb(800);
  const long large = peak_kb(8000);
  EXPECT_LT(large - small, 48 << 10) << "peak RSS " << small << " KiB for 800 positions, " << large << " for 8000";
}

}  // namespace
}  // namespace mambacpp
