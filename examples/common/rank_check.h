#pragma once

// What the ranks of a data-parallel run compare before they train: the
// flags each was started with, and the data each read. A wrapper script or a
// stale configuration on one node then stops the run at once, naming the
// flag and its value on every rank, instead of aborting inside the backend
// or training on with wrong results.

#include <lamp/lamp.h>

#include <CLI/CLI.hpp>

#include "options.h"

#include <string>
#include <utility>
#include <vector>

namespace lamp_examples {

/// Every flag of `app` as (--name, value), for the ranks to compare. Flags
/// that may differ per rank are left out (--device, --data: each node has
/// its own paths, the data is compared by content; what only rank 0 uses to
/// report: --log-json, --log-every, --no-progress, --report-precision); of
/// --checkpoint, --resume, --init-from and --export-state-dict only whether
/// they were
/// given counts.
std::vector<std::pair<std::string, std::string>> rank_flag_settings(
    const CLI::App& app);

/// rank_flag_settings(app) with the values `config` holds for the stored
/// flags the command line left out: after a resume, the checkpoint's (the
/// run record's `flags`, what the run trains with).
std::vector<std::pair<std::string, std::string>> run_flag_settings(
    const CLI::App& app, const ProgramConfig& config);

/// Refuses, on every rank, a run whose ranks were given different flags
/// (`flags`, from rank_flag_settings) or read different data (by
/// lamp::data::fingerprint of `train` and `test`). A collective: every rank
/// calls it once, before training.
void check_ranks_agree(
    lamp::distributed::ProcessGroup& group,
    const std::vector<std::pair<std::string, std::string>>& flags);

} // namespace lamp_examples
