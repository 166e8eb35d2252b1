#include "core/bounded_child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/error.h"

namespace pagellm {
namespace {

using Clock = std::chrono::steady_clock;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Field `index` of /proc/<pid>/statm, in bytes (0: size, 1: resident); 0 when unreadable.
size_t statm_bytes(pid_t pid, int index) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/statm", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  unsigned long v[2] = {0, 0};
  const int n = std::fscanf(f, "%lu %lu", &v[0], &v[1]);
  std::fclose(f);
  if (n != 2) return 0;
  return static_cast<size_t>(v[index]) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The reply on the pipe: one status byte, the output's length (8 bytes), the output.
constexpr char kReplyOk = 'O', kReplyFailed = 'F', kReplyOverMemory = 'M';
constexpr size_t kReplyHead = 1 + sizeof(uint64_t);

[[noreturn]] void child_main(int fd, const std::function<std::string()>& work, size_t memory_bytes) {
  // Die with the thread that waits for us; it may already be gone.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) _exit(2);
  // Keep only stdio and the pipe: an inherited client socket held open here
  // would keep that connection alive after the parent closed it.
  if (fd != 3) {
    if (dup2(fd, 3) < 0) _exit(3);
    fd = 3;
  }
  close_range(4, ~0U, 0);
  if (!kSanitized) {  // (sanitizers reserve terabytes of address space)
    rlimit lim{};
    lim.rlim_cur = lim.rlim_max = statm_bytes(getpid(), 0) + memory_bytes;
    setrlimit(RLIMIT_AS, &lim);
  }
  char status = kReplyOk;
  std::string out;
  try {
    out = work();
  } catch (const std::bad_alloc&) {
    status = kReplyOverMemory;
    out.clear();
  } catch (const std::exception& e) {
    status = kReplyFailed;
    out = e.what();
  } catch (...) {
    status = kReplyFailed;
    out = "unknown exception";
  }
  const uint64_t len = out.size();
  const bool ok = write_all(fd, &status, 1) && write_all(fd, &len, sizeof len) && write_all(fd, out.data(), out.size());
  _exit(ok ? 0 : 4);  // no atexit handlers, no flush of the parent's stdio buffers
}

std::string describe_wait_status(int st) {
  if (WIFSIGNALED(st)) {
    const int sig = WTERMSIG(st);
    return fmt::format("the worker process was killed by signal {} ({}){}", sig, strsignal(sig),
                       sig == SIGKILL ? ", perhaps by the kernel for lack of memory" : "");
  }
  if (WIFEXITED(st)) return fmt::format("the worker process exited with status {} before its result", WEXITSTATUS(st));
  return "the worker process ended abnormally";
}

// Kills and reaps the child, closes the pipe, on every way out.
struct ChildHandle {
  pid_t pid;
  int fd;
  bool reaped = false;
  int wait_status = 0;
  ~ChildHandle() {
    ::close(fd);
    if (!reaped) {
      ::kill(pid, SIGKILL);
      reap();
    }
  }
  void reap() {
    while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    reaped = true;
  }
};

}  // namespace

const char* to_string(ChildResult::Status s) {
  switch (s) {
    case ChildResult::Status::Ok: return "ok";
    case ChildResult::Status::Failed: return "failed";
    case ChildResult::Status::OverTime: return "over its time budget";
    case ChildResult::Status::OverMemory: return "over its memory budget";
    case ChildResult::Status::Cancelled: return "cancelled";
    case ChildResult::Status::Crashed: return "crashed";
  }
  return "?";
}

ChildResult run_bounded_child(const std::function<std::string()>& work, const ChildBudget& budget,
                              const std::function<bool()>& cancelled) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail("cannot start a worker process: pipe: {}", std::strerror(errno));
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    fail("cannot start a worker process: fork: {}", std::strerror(err));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], work, budget.memory_bytes);
  }
  ::close(fds[1]);
  ChildHandle child{pid, fds[0]};
  const size_t baseline = statm_bytes(pid, 1);

  ChildResult r;
  std::string buf;
  char chunk[1 << 16];
  auto finish = [&](ChildResult::Status s) {
    r.status = s;
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  };
  for (;;) {
    pollfd p{child.fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, budget.poll.count())));
    if (ready > 0) {
      const ssize_t n = ::read(child.fd, chunk, sizeof chunk);
      if (n > 0) {
        buf.append(chunk, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        break;  // end of the reply (or a broken pipe): look at how the child ended
      }
    }
    if (Clock::now() - t0 > budget.time) return finish(ChildResult::Status::OverTime);
    if (cancelled && cancelled()) return finish(ChildResult::Status::Cancelled);
    if (const size_t rss = statm_bytes(pid, 1); rss > baseline) {
      r.peak_memory_growth = std::max(r.peak_memory_growth, rss - baseline);
      if (rss - baseline > budget.memory_bytes) return finish(ChildResult::Status::OverMemory);
    }
  }
  child.reap();
  uint64_t len = 0;
  if (buf.size() >= kReplyHead) std::memcpy(&len, buf.data() + 1, sizeof len);
  if (buf.size() < kReplyHead || buf.size() - kReplyHead != len) {
    r.output = describe_wait_status(child.wait_status);
    return finish(ChildResult::Status::Crashed);
  }
  const char status = buf[0];
  r.output = buf.substr(kReplyHead);
  if (status == kReplyOk) return finish(ChildResult::Status::Ok);
  if (status == kReplyOverMemory) return finish(ChildResult::Status::OverMemory);
  return finish(ChildResult::Status::Failed);
}

}  // namespace pagellm
