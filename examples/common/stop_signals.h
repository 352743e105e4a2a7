#pragma once

// SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) for the
// training programs: the first asks the run to stop at the next step
// boundary (TrainerOptions::stop_requested), or a rank that waits for the
// others at the rendezvous to stop waiting, so that it can save what a
// resume needs, log it and say how to continue; a second one ends the
// process at once.

namespace lamp_examples {

/// Installs the handlers, for each signal the process did not inherit as
/// ignored (nohup's SIGHUP, a background job's SIGINT: those stay ignored).
/// The first signal only sets a flag (nothing else is
/// safe in a handler); a second writes one line on stderr and calls _exit()
/// with 128 + its number: checkpoint writes are atomic (written under a
/// temporary name, then renamed), so the last checkpoint saved stays whole.
void install_stop_signals();

/// The signal that asked the run to stop (SIGINT, SIGTERM, SIGHUP), or 0.
int stop_signal();

/// "SIGINT", "SIGTERM", "SIGHUP".
const char* signal_name(int signal);

} // namespace lamp_examples
