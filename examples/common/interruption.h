#pragma once

// What a training program says and logs when SIGINT or SIGTERM stopped it
// (stop_signals.h): where it stopped, what its checkpoint holds, and the
// command that continues the run.

#include <lamp/lamp.h>

#include "json_log.h"
#include "options.h"
#include "progress.h"

#include <cstdint>
#include <string>

namespace lamp_examples {

/// After fit() stopped on `signal` (trainer.stop_point()): ends the progress
/// display, writes an "interrupted" record to `log` (when given), prints one
/// line on stderr and returns interrupted_status(signal); the line names the
/// step the checkpoint holds (the trainer writes it at the stop,
/// StopPoint::checkpoint_step) and the command that continues the run: this
/// one with --resume CHECKPOINT in place of its --resume or --init-from.
/// `signal` 0: this rank of a data-parallel run was not signalled, and
/// stopped with the rank that was (StopPoint::asked_by_rank).
int report_interruption(const ProgramConfig& config, const std::string& program,
                        const lamp::training::Trainer& trainer,
                        Progress& progress, JsonLog* log, int signal);

/// Why this rank stopped, as its line says it: "interrupted (SIGINT)", or
/// for `signal` 0 "stopped with rank R, which was asked to stop," (R the
/// StopPoint::asked_by_rank `asked_by_rank`).
std::string stop_reason(int signal, int asked_by_rank);

/// The exit status of a run stopped on `signal`: 128 + `signal` (130 for
/// SIGINT, 143 for SIGTERM), or 1 for a rank that was not signalled and
/// stopped with the one that was (its run did not end as its command says).
int interrupted_status(int signal);

} // namespace lamp_examples
