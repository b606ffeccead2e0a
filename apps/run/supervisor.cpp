#include "run/supervisor.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "run/output.hpp"

extern char** environ;

namespace troupe_run {

namespace {

using steady = std::chrono::steady_clock;

int signal_pipe[2] = {-1, -1};  // the handler writes each signal's number here
constexpr int handled_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

void message(const std::string& text) {
  write_all(2, "troupe-run: " + text + "\n");
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "signal " + std::to_string(sig);
  }
}

void add_flags(int fd, int fd_flags, int status_flags) {
  if (fd_flags != 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | fd_flags);
  if (status_flags != 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | status_flags);
}

bool install_handlers() {
  if (::pipe(signal_pipe) != 0) return false;
  for (int fd : signal_pipe) add_flags(fd, FD_CLOEXEC, O_NONBLOCK);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigset_t unblock;
  sigemptyset(&unblock);
  for (int sig : handled_signals) {
    sa.sa_flags = SA_RESTART;  // SIGCHLD for stopped and continued children too
    ::sigaction(sig, &sa, nullptr);
    sigaddset(&unblock, sig);
  }
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher
  ::sigprocmask(SIG_UNBLOCK, &unblock, nullptr);
  return true;
}

struct stream {
  int fd = -1;
  line_writer out;
};

struct child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  stream streams[2];                          // the rank's stdout, stderr
  std::optional<steady::time_point> stopped;  // since when it is stopped (SIGSTOP, SIGTSTP, ...)
};

class supervisor {
 public:
  supervisor(double grace_seconds, bool keep_going, std::function<std::size_t()> store_users)
      : grace_seconds_(grace_seconds),
        keep_going_(keep_going),
        store_users_(std::move(store_users)) {}

  int run(const std::vector<rank_spec>& ranks) {
    if (!install_handlers()) {
      message(std::string("cannot create a pipe: ") + strerror(errno));
      return 1;
    }
    // Ranks run in process groups of their own, in the background of a
    // terminal: reading it would stop them, so they read /dev/null instead.
    int stdin_fd = ::isatty(0) ? ::open("/dev/null", O_RDONLY) : -1;
    if (stdin_fd >= 0) add_flags(stdin_fd, FD_CLOEXEC, 0);
    children_.reserve(ranks.size());
    for (const rank_spec& spec : ranks) {
      if (!start(spec, stdin_fd)) {
        begin_stop(1);
        break;
      }
    }
    if (stdin_fd >= 0) ::close(stdin_fd);
    while (running_ > 0) wait_once();
    drain_leftovers();
    if (store_users_ && !stopping_) serve_others();
    return stopping_ ? exit_code_ : first_failure_;
  }

  /// After this node's ranks ended: serves the store while other nodes'
  /// ranks still use it, until they are gone or a signal says stop.
  void serve_others() {
    bool said = false;
    for (;;) {
      pollfd p{signal_pipe[0], POLLIN, 0};
      if (::poll(&p, 1, 200) > 0) {
        unsigned char sigs[64];
        const ssize_t n = ::read(signal_pipe[0], sigs, sizeof sigs);
        for (ssize_t i = 0; i < n; ++i) {
          if (sigs[i] == SIGCHLD) continue;
          message("received " + signal_name(sigs[i]) + "; no longer serving the job's store");
          stopping_ = true;
          exit_code_ = 128 + sigs[i];
          return;
        }
      }
      const std::size_t users = store_users_();
      if (users == 0) return;
      if (!said)
        message(
            "the ranks of this node have ended; serving the job's store while other nodes' "
            "ranks still use it (" +
            std::to_string(users) + (users == 1 ? " connection" : " connections") +
            "; SIGTERM stops it)");
      said = true;
    }
  }

 private:
  bool start(const rank_spec& spec, int stdin_fd) {
    int out[2], err[2];
    if (::pipe(out) != 0) {
      message(std::string("cannot create a pipe: ") + strerror(errno));
      return false;
    }
    if (::pipe(err) != 0) {
      message(std::string("cannot create a pipe: ") + strerror(errno));
      for (int fd : out) ::close(fd);
      return false;
    }
    for (int fd : {out[0], out[1], err[0], err[1]}) add_flags(fd, FD_CLOEXEC, 0);
    std::vector<char*> argv, envp;
    for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    for (const std::string& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    const std::string exec_failed = "troupe-run: cannot run '" + spec.argv.at(0) + "': ";

    // Signals wait until the child has dropped the launcher's handlers.
    sigset_t all, old;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &old);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int sig : handled_signals) ::sigaction(sig, &dfl, nullptr);
      ::sigaction(SIGPIPE, &dfl, nullptr);
      ::setpgid(0, 0);  // signals to the rank's group reach its children too
#ifdef __linux__
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher died (SIGKILL): stop
      if (::getppid() != parent) ::_exit(1);
#endif
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      if (stdin_fd >= 0) ::dup2(stdin_fd, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
#ifdef __linux__
      if (spec.cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(spec.cpu, &set);
        if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
          const std::string text = "troupe-run: warning: cannot bind rank " +
                                   std::to_string(spec.rank) + " to CPU " +
                                   std::to_string(spec.cpu) + ": " + strerror(errno) + "\n";
          ssize_t ignored = ::write(2, text.data(), text.size());
          (void)ignored;
        }
      }
#endif
      environ = envp.data();
      ::execvp(argv[0], argv.data());
      const int e = errno;
      const std::string text = exec_failed + strerror(e) + "\n";
      ssize_t ignored = ::write(2, text.data(), text.size());
      (void)ignored;
      ::_exit(e == ENOENT ? 127 : 126);
    }
    const int fork_errno = errno;
    if (pid > 0) ::setpgid(pid, pid);  // also here: no window where kill(-pid) misses
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      message("cannot start rank " + std::to_string(spec.rank) + ": " + strerror(fork_errno));
      ::close(out[0]);
      ::close(err[0]);
      return false;
    }
    add_flags(out[0], 0, O_NONBLOCK);
    add_flags(err[0], 0, O_NONBLOCK);
    const std::string prefix = "[" + std::to_string(spec.rank) + "] ";
    children_.push_back(
        child{spec.rank,
              pid,
              true,
              {stream{out[0], line_writer(prefix, 1)}, stream{err[0], line_writer(prefix, 2)}},
              std::nullopt});
    ++running_;
    return true;
  }

  /// One round: waits for output, a signal, a child's exit or the deadline.
  void wait_once() {
    std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
    std::vector<stream*> owners{nullptr};
    for (child& c : children_) {
      for (stream& s : c.streams) {
        if (s.fd < 0) continue;
        fds.push_back({s.fd, POLLIN, 0});
        owners.push_back(&s);
      }
    }
    int timeout_ms = -1;
    if (deadline_ && !killed_) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline_ - steady::now());
      timeout_ms = static_cast<int>(std::max<long long>(0, left.count()));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) > 0) {
      if (fds[0].revents != 0) handle_signals();
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) read_stream(*owners[i], false);
      }
    }
    reap();
    if (deadline_ && !killed_ && running_ > 0 && steady::now() >= *deadline_) kill_remaining();
  }

  /// Reads what the pipe holds: one chunk, or with `drain` all of it (bounded).
  void read_stream(stream& s, bool drain) {
    char buf[64 * 1024];
    for (int chunks = 0; s.fd >= 0 && chunks < 64; ++chunks) {
      ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n > 0) {
        s.out.feed(buf, static_cast<std::size_t>(n));
        if (!drain) return;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      s.out.finish();  // end of file (or an error): flush a partial last line
      ::close(s.fd);
      s.fd = -1;
    }
  }

  void handle_signals() {
    unsigned char sigs[64];
    ssize_t n;
    while ((n = ::read(signal_pipe[0], sigs, sizeof sigs)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = sigs[i];
        if (sig == SIGCHLD) continue;  // reap() looks after every round
        message("received " + signal_name(sig) + "; forwarding it to the " +
                std::to_string(running_) + (running_ == 1 ? " running rank" : " running ranks"));
        signal_running(sig);
        if (!stopping_) {
          stopping_ = true;
          exit_code_ = 128 + sig;
          deadline_ = steady::now() + grace();
        }
      }
    }
  }

  void reap() {
    while (running_ > 0) {
      int status = 0;
      // Stopped and continued children too: a stopped rank runs nothing and
      // answers no one, which its peers see only as silence.
      const pid_t pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED);
      if (pid == 0) return;
      if (pid < 0) {
        if (errno == EINTR) continue;
        message(std::string("waitpid failed: ") + strerror(errno));
        for (child& c : children_) c.running = false;
        running_ = 0;
        begin_stop(1);
        return;
      }
      for (child& c : children_) {
        if (!c.running || c.pid != pid) continue;
        if (WIFSTOPPED(status) || WIFCONTINUED(status)) {
          on_stop(c, status);
          continue;
        }
        for (stream& s : c.streams) read_stream(s, true);  // its last words first
        c.running = false;
        --running_;
        on_exit(c, status);
      }
    }
  }

  void on_stop(child& c, int status) {
    const std::string who =
        "rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ")";
    if (WIFCONTINUED(status)) {
      c.stopped.reset();
      message(who + " continued");
      return;
    }
    const int sig = WSTOPSIG(status);
    c.stopped = steady::now();
    message(who + " was stopped by signal " + std::to_string(sig) + " (" + strsignal(sig) +
            "): it runs nothing until it gets SIGCONT, and its peers will find it unresponsive");
  }

  /// "; rank 2 (pid 123) has been stopped for 3.1 s" for each stopped rank:
  /// the likely cause of what failed.
  std::string stopped_ranks() const {
    std::string out;
    for (const child& c : children_) {
      if (!c.running || !c.stopped) continue;
      char since[32];
      std::snprintf(since, sizeof since, "%.1f",
                    std::chrono::duration<double>(steady::now() - *c.stopped).count());
      out += "; rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) +
             ") has been stopped for " + since + " s";
    }
    return out;
  }

  void on_exit(const child& c, int status) {
    const bool failed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
    if (!failed || stopping_) return;
    int code = 0;
    std::string text = "rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ") ";
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      code = 128 + sig;
      text += "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
    } else {
      code = WEXITSTATUS(status);
      text += "failed with exit code " + std::to_string(code);
    }
    text += stopped_ranks();
    if (keep_going_) {
      if (running_ > 0) text += "; the other ranks go on (--keep-going)";
      message(text);
      // A rank that exited with an error fails the job; one killed by a
      // signal was survived (the others went on without it).
      if (!WIFSIGNALED(status) && first_failure_ == 0) first_failure_ = code;
      return;
    }
    if (running_ > 0) text += "; stopping the other ranks";
    message(text);
    begin_stop(code);
  }

  void begin_stop(int code) {
    if (stopping_) return;
    stopping_ = true;
    exit_code_ = code;
    signal_running(SIGTERM);
    deadline_ = steady::now() + grace();
  }

  void kill_remaining() {
    killed_ = true;
    std::string ranks;
    for (const child& c : children_) {
      if (c.running) ranks += (ranks.empty() ? "" : ", ") + std::to_string(c.rank);
    }
    char grace_text[32];
    std::snprintf(grace_text, sizeof grace_text, "%g", grace_seconds_);
    message(std::string(running_ == 1 ? "rank " : "ranks ") + ranks + " still running after the " +
            grace_text + " s grace period; sending SIGKILL");
    signal_running(SIGKILL);
  }

  void signal_running(int sig) {
    for (const child& c : children_) {
      if (c.running && ::kill(-c.pid, sig) != 0) ::kill(c.pid, sig);
      // A stopped rank acts on a signal only once continued (SIGKILL aside).
      if (c.running && c.stopped && sig != SIGKILL && sig != SIGCONT &&
          ::kill(-c.pid, SIGCONT) != 0)
        ::kill(c.pid, SIGCONT);
    }
  }

  /// After the last rank exited: what processes it left behind still write
  /// (briefly), then the partial last lines.
  void drain_leftovers() {
    const auto until = steady::now() + std::chrono::seconds(1);
    while (steady::now() < until) {
      std::vector<pollfd> fds;
      std::vector<stream*> owners;
      for (child& c : children_) {
        for (stream& s : c.streams) {
          if (s.fd < 0) continue;
          fds.push_back({s.fd, POLLIN, 0});
          owners.push_back(&s);
        }
      }
      if (fds.empty() || ::poll(fds.data(), fds.size(), 100) <= 0) break;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0) read_stream(*owners[i], false);
      }
    }
    for (child& c : children_) {
      for (stream& s : c.streams) {
        if (s.fd < 0) continue;
        s.out.finish();
        ::close(s.fd);
        s.fd = -1;
      }
    }
  }

  std::chrono::steady_clock::duration grace() const {
    return std::chrono::duration_cast<steady::duration>(
        std::chrono::duration<double>(grace_seconds_));
  }

  double grace_seconds_;
  std::vector<child> children_;
  int running_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  int exit_code_ = 0;
  bool keep_going_ = false;
  int first_failure_ = 0;                     // --keep-going: the first rank that exited non-zero
  std::function<std::size_t()> store_users_;  // see supervise()
  std::optional<steady::time_point> deadline_;
};

}  // namespace

int supervise(const std::vector<rank_spec>& ranks, double grace_seconds, bool keep_going,
              const std::function<std::size_t()>& store_users) {
  return supervisor(grace_seconds, keep_going, store_users).run(ranks);
}

}  // namespace troupe_run
