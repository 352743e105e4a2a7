#pragma once

// SIGINT and SIGTERM for the training programs: the first asks the run to
// stop at the next step boundary (TrainerOptions::stop_requested), so that
// it can save what a resume needs, log it and say how to continue; a second
// one ends the process at once.

namespace lamp_examples {

/// Installs the handlers. The first signal only sets a flag (nothing else is
/// safe in a handler); a second writes one line on stderr and calls _exit()
/// with 128 + its number: checkpoint writes are atomic (written under a
/// temporary name, then renamed), so the last checkpoint saved stays whole.
void install_stop_signals();

/// The signal that asked the run to stop (SIGINT, SIGTERM), or 0.
int stop_signal();

/// "SIGINT", "SIGTERM".
const char* signal_name(int signal);

} // namespace lamp_examples
