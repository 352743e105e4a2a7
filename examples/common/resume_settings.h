#pragma once

// --resume PATH alone continues a run: the settings the checkpoint stores
// are the defaults of the flags this command line leaves out.

#include <CLI/CLI.hpp>

#include "options.h"

namespace lamp_examples {

/// With config.resume given: each flag the checkpoint stores a value for
/// (the rows of run_flags() with a stored key: --model,
/// --precision/--fp16, --optimizer, --batch-size, --epochs, --lr, ...; and
/// the program's own settings
/// (ProgramConfig::program_settings: train_gpt's shape and dropout, --data)
/// by their flags) takes the stored value
/// unless it was given on the command line (`app`'s count()). A flag given
/// with another value is refused, every difference listed at once (flag,
/// stored value, given value) with the way to continue; more --epochs than
/// stored is left to the trainer, which continues a constant schedule and
/// refuses the others; --epochs on a checkpoint of a run measured in
/// --steps is refused (a larger --steps lengthens it). A checkpoint
/// of another program's kind of model (a
/// GPT of train_gpt in an image program, an image model in train_gpt) is
/// refused naming the program that takes it. Throws c10::Error; does
/// nothing without --resume. `not_training` (--eval-only, or train_gpt's
/// --sample-only: the flag, for messages; nullptr for a run that trains):
/// the training flags given are taken as given, not compared (a sample
/// with another --seed, an evaluation in another --precision); the
/// program's settings still are.
void apply_resume_settings(CLI::App& app, ProgramConfig& config,
                           const std::string& program,
                           const char* not_training = nullptr);

} // namespace lamp_examples
