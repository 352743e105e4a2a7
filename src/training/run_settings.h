#pragma once

// The settings a trainer's checkpoint stores and a resumed run must repeat,
// listed once: writing a checkpoint and checking one both read this table,
// so a setting cannot be written and forgotten by the check, or the other
// way round.

#include <torch/serialize/archive.h>

#include <string>

#include "lamp/data/loader.h"
#include "lamp/training/trainer.h"

namespace lamp {
namespace training {
namespace detail {

/// What the settings are read from: the trainer's options and its training
/// loader's.
struct RunContext {
  const TrainerOptions& options;
  const data::LoaderOptions& loader;
};

/// Writes every setting of the table under its key.
void write_run_settings(torch::serialize::OutputArchive& archive,
                        const RunContext& run);

/// Reads every setting of the table from `archive` (the checkpoint at
/// `path`) and refuses the first that differs from `run`'s, naming it
/// (TrainerOptions::option_name) with both values and what to resume with.
/// Settings added to the format later read as what runs did before they
/// were stored, where a checkpoint predates them.
void check_run_settings(torch::serialize::InputArchive& archive,
                        const std::string& path, const RunContext& run);

} // namespace detail
} // namespace training
} // namespace lamp
