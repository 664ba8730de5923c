#include "apps/repl/console.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <iostream>
#include <string>
#include <vector>

#include "apps/common/flags.hpp"
#include "apps/repl/session.hpp"

#ifdef AG_REPL_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

namespace ag::repl {

namespace {

constexpr const char* prompt = "ag> ";

// SIGINT: a flag and a byte in a pipe, nothing else (async-signal-safe). The
// main loop decides what it means: clear the line at the prompt, or stop a
// `wait` (session::interrupt also wakes the session's own poll).
volatile sig_atomic_t sigint_seen = 0;
int sig_pipe[2] = {-1, -1};
session* active_session = nullptr;

void on_sigint(int) {
  sigint_seen = 1;
  const char c = 1;
  [[maybe_unused]] auto r = ::write(sig_pipe[1], &c, 1);
  if (active_session) active_session->interrupt();
}

void install_sigint() {
  if (::pipe(sig_pipe) == 0) {
    for (int fd : sig_pipe) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
  }
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: poll() returns EINTR at once
  ::sigaction(SIGINT, &sa, nullptr);
}

void drain_fd(int fd) {
  char buf[64];
  while (fd >= 0 && ::read(fd, buf, sizeof buf) > 0) {
  }
}

// Reads one line from the terminal (cooked mode) without stdio buffering, so
// readline sees every later byte.
std::string read_answer() {
  std::string a;
  char c;
  while (::read(0, &c, 1) == 1 && c != '\n' && c != '\r') a += c;
  while (!a.empty() && (a.back() == ' ' || a.back() == '\r')) a.pop_back();
  while (!a.empty() && a.front() == ' ') a.erase(a.begin());
  return a;
}

#ifdef AG_REPL_HAVE_READLINE

// The plain line mode (no readline) keeps no history.
std::string history_path() {
  if (const char* p = std::getenv("AG_REPL_HISTORY")) return p;  // empty: no history file
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.actorgraph_history";
  return {};
}

struct rl_state {
  session* s = nullptr;
  bool done = false;
  bool last_was_progress = false;
  std::vector<std::string> matches;
};
rl_state rl;

void on_line(char* line) {
  rl.last_was_progress = false;
  if (!line) {  // Ctrl-D on an empty line
    std::printf("quit\n");
    std::fflush(stdout);
    if (rl.s->execute("quit") == exec_status::quit) {
      rl.done = true;
      rl_callback_handler_remove();  // no prompt after the last line
    }
    return;
  }
  std::string l(line);
  std::free(line);
  if (l.find_first_not_of(" \t") != std::string::npos) {
    HIST_ENTRY* last = history_length > 0 ? history_get(history_base + history_length - 1) : nullptr;
    if (!last || l != last->line) add_history(l.c_str());
  }
  if (rl.s->execute(l) == exec_status::quit) {
    rl.done = true;
    rl_callback_handler_remove();
  }
  // A Ctrl-C during the command (a `wait`) was for that command.
  sigint_seen = 0;
  drain_fd(sig_pipe[0]);
  std::fflush(stdout);
}

// Prints reports above the line being typed and redraws that line: the
// prompt and the user's text are saved, erased, and put back afterwards.
void print_above(const std::vector<report>& rs) {
  if (rs.empty()) return;
  const int saved_point = rl_point;
  char* saved_line = rl_copy_text(0, rl_end);
  rl_save_prompt();
  rl_replace_line("", 0);
  rl_redisplay();
  std::fputs("\r\033[K", stdout);
  for (const report& r : rs) {
    // A progress line replaces the previous one when nothing came between.
    if (r.progress && rl.last_was_progress) std::fputs("\033[A\r\033[K", stdout);
    std::fputs(r.text.c_str(), stdout);
    std::fputs("\n", stdout);
    rl.last_was_progress = r.progress;
  }
  std::fflush(stdout);
  rl_restore_prompt();
  rl_replace_line(saved_line, 0);
  rl_point = saved_point;
  rl_forced_update_display();
  std::free(saved_line);
}

char* match_generator(const char*, int state) {
  static std::size_t i;
  if (state == 0) i = 0;
  if (i < rl.matches.size()) return ::strdup(rl.matches[i++].c_str());
  return nullptr;
}

char** attempt_completion(const char* text, int start, int end) {
  const completion c = rl.s->complete(std::string(rl_line_buffer, static_cast<std::size_t>(end)), static_cast<std::size_t>(start));
  if (c.filenames && c.candidates.empty()) {
    rl_attempted_completion_over = 0;  // readline's own file name completion
    return nullptr;
  }
  rl_attempted_completion_over = 1;
  rl.matches = c.candidates;
  rl_completion_append_character = ' ';
  if (rl.matches.size() == 1) {
    const char last = rl.matches[0].empty() ? ' ' : rl.matches[0].back();
    if (last == '=' || last == '(' || last == '[') rl_completion_append_character = '\0';
  }
  if (rl.matches.empty()) return nullptr;
  return rl_completion_matches(text, match_generator);
}

int interactive_readline(session& s) {
  rl.s = &s;
  rl_readline_name = "actorgraph";
  rl_catch_signals = 0;  // our SIGINT handler; readline must not re-raise it
  rl_completer_word_break_characters = const_cast<char*>(" \t");
  rl_attempted_completion_function = attempt_completion;
  using_history();
  stifle_history(1000);
  const std::string hist = history_path();
  if (!hist.empty()) read_history(hist.c_str());

  rl_callback_handler_install(prompt, on_line);
  while (!rl.done) {
    pollfd fds[3] = {{0, POLLIN, 0}, {s.notify_fd(), POLLIN, 0}, {sig_pipe[0], POLLIN, 0}};
    const int n = ::poll(fds, 3, 500);
    if (sigint_seen) {
      sigint_seen = 0;
      drain_fd(sig_pipe[0]);
      // At the prompt Ctrl-C abandons the line being typed.
      rl_replace_line("", 0);
      rl_point = rl_end = 0;
      std::fputs("^C\n", stdout);
      rl_on_new_line();
      rl_redisplay();
      s.drain();  // clears the session's interrupt wake-up byte as well
      continue;
    }
    if (n < 0) continue;
    if (fds[1].revents & POLLIN) print_above(s.drain());
    if (fds[0].revents & (POLLIN | POLLHUP)) rl_callback_read_char();
  }
  if (!hist.empty()) write_history(hist.c_str());
  return 0;
}

#endif

// Without readline: plain lines; reports are printed when they arrive (they
// may split a line being typed: readline avoids that).
int interactive_plain(session& s) {
  bool need_prompt = true;
  std::string pending;
  for (;;) {
    if (need_prompt) {
      std::fputs(prompt, stdout);
      std::fflush(stdout);
      need_prompt = false;
    }
    pollfd fds[3] = {{0, POLLIN, 0}, {s.notify_fd(), POLLIN, 0}, {sig_pipe[0], POLLIN, 0}};
    ::poll(fds, 3, 500);
    if (sigint_seen) {
      sigint_seen = 0;
      drain_fd(sig_pipe[0]);
      std::fputs("^C\n", stdout);
      s.drain();
      need_prompt = true;
      continue;
    }
    if (fds[1].revents & POLLIN) {
      const auto rs = s.drain();
      if (!rs.empty()) {
        std::fputs("\n", stdout);
        for (const auto& r : rs) std::printf("%s\n", r.text.c_str());
        need_prompt = true;
      }
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP))) continue;
    char buf[4096];
    const ssize_t got = ::read(0, buf, sizeof buf);
    if (got <= 0) {  // Ctrl-D
      std::fputs("quit\n", stdout);
      if (s.execute("quit") == exec_status::quit) return 0;
      need_prompt = true;
      continue;
    }
    pending.append(buf, static_cast<std::size_t>(got));
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (s.execute(line) == exec_status::quit) return 0;
      // A Ctrl-C during the command (a `wait`) was for that command.
      sigint_seen = 0;
      drain_fd(sig_pipe[0]);
      need_prompt = true;
    }
  }
}

// What the banner says about line input, so nobody wonders why TAB or the
// arrow keys do nothing.
const char* line_input_note(bool no_readline_flag) {
#ifdef AG_REPL_HAVE_READLINE
  if (!no_readline_flag) return "; TAB completes; Ctrl-D quits";
  return " (plain line input: --no-readline)";
#else
  (void)no_readline_flag;
  return " (plain line input: built without GNU readline, so no line editing, history or completion)";
#endif
}

}  // namespace

int console_main(int argc, char** argv) {
  std::string script, devices, init;
  std::vector<std::string> commands_given;
  bool keep_going = false, no_readline = false;
  ag::apps::flags app("actorgraph",
                                  "actorgraph: an interactive shell over the actorgraph runtime. Type 'help' at the prompt "
                                  "for the commands (docs/REPL.md).");
  app.add_option("-s,--script", script, "run the commands of FILE, then exit (as does a pipe on standard input)")
      ->option_text("FILE");
  app.add_option("--init", init, "run the commands of FILE first, then go on as usual (the prompt, a script or -c)")
      ->option_text("FILE");
  app.add_flag("-k,--keep-going", keep_going, "in a script, continue after a failing command (the exit status is still 1)");
  app.add_option("--devices", devices, "devices to start with (default: cuda:all with a GPU, else sim:4)")->option_text("SPEC");
  app.add_flag("--no-readline", no_readline, "read plain lines even on a terminal");
  app.add_option("-c", commands_given, "run COMMAND (repeatable) as a script, then exit")
      ->option_text("COMMAND")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  if (auto status = apps::parse_flags(app, argc, argv)) return *status;
  if (!devices.empty()) {
    if (auto items = gpu::parse_device_spec(devices); !items) {
      std::cerr << "actorgraph: --devices: " << items.err().message << "\n";
      return apps::bad_flags_status;
    }
  }

  const bool tty = ::isatty(0) && script.empty() && commands_given.empty();
  session_options opt;
  opt.interactive = tty;
  opt.default_devices = devices;
  winsize ws{};
  if (::isatty(1) && ::ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) opt.width = std::max(40, ws.ws_col - 24);
  else if (const char* w = std::getenv("COLUMNS")) opt.width = std::max(40, std::atoi(w) - 24);
  session s(std::cout, opt);
  s.ask = [](const std::string& q) {
    std::fputs(q.c_str(), stdout);
    std::fflush(stdout);
    return read_answer();
  };
  active_session = &s;
  // Only a person at a terminal gets Ctrl-C as "back to the prompt"; a
  // script or pipe keeps the default (Ctrl-C ends it).
  if (tty) install_sigint();

  // --init: a start-up script (the demo's); at a terminal the prompt follows
  // even when one of its commands failed.
  int status = 0;
  if (!init.empty()) {
    status = run_script_file(s, init, std::cout, keep_going);
    if (status != 0 && !tty) return status;
  }
  if (!script.empty()) return std::max(status, run_script_file(s, script, std::cout, keep_going));
  if (!commands_given.empty()) {
    std::string all;
    for (const auto& c : commands_given) all += c + "\n";
    std::istringstream in(all);
    return std::max(status, run_script(s, in, std::cout, keep_going));
  }
  if (!tty) return std::max(status, run_script(s, std::cin, std::cout, keep_going));

  std::cout << "actorgraph REPL: 'help' lists the commands" << line_input_note(no_readline) << "\n";
#ifdef AG_REPL_HAVE_READLINE
  if (!no_readline) return interactive_readline(s);
#endif
  return interactive_plain(s);
}

}  // namespace ag::repl
