#include "stop_signals.h"

#include <unistd.h>

#include <csignal>

namespace lamp_examples {
namespace {

// Written by the handler, read between steps: the one piece of global state
// a signal handler needs.
volatile std::sig_atomic_t received = 0;

void on_signal(int signal) {
  if (received != 0) {
    // write() and _exit() are async-signal-safe; stdio is not.
    static const char message[] =
        "\nsecond signal: stopping at once (the last checkpoint written is "
        "kept whole)\n";
    const ssize_t ignored =
        ::write(STDERR_FILENO, message, sizeof(message) - 1);
    (void)ignored;
    ::_exit(128 + signal);
  }
  received = signal;
}

} // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a read or write the signal interrupts is resumed, not failed
  // with EINTR (the checkpoint and log writes check every call).
  action.sa_flags = SA_RESTART;
  // A closed terminal or ssh session (SIGHUP): a stop like SIGTERM's, which
  // writes the interrupted record and removes the checkpoint's lock. A
  // signal the parent left ignored stays ignored, as Python and the shell's
  // tools keep it: nohup's SIGHUP (the run outlives the session, as nohup
  // asks), a background job's SIGINT in a script (Ctrl-C is the foreground
  // job's).
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction inherited {};
    if (sigaction(signal, nullptr, &inherited) == 0 &&
        inherited.sa_handler == SIG_IGN) {
      continue;
    }
    sigaction(signal, &action, nullptr);
  }
}

int stop_signal() {
  return received;
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

} // namespace lamp_examples
