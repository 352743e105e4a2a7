#pragma once

// --precision auto in the programs: the device's rule where it is certain,
// a measurement on this model where the answer depends on it.

#include <lamp/lamp.h>

#include <functional>
#include <string>

#include "classifier_program.h"
#include "options.h"

namespace lamp_examples {

/// The mode auto resolves to and the line that says why.
struct AutoPrecision {
  lamp::Precision precision = lamp::Precision::kFP32;
  /// "auto: amp-bf16 (...)", printed by the main rank before the run.
  std::string line;
};

/// Resolves --precision auto for `group`'s device:
///  - a checkpoint resumed keeps the mode it was trained in (`stored`, the
///    checkpoint's precision; empty for a new run);
///  - a CPU with native BF16 (AVX512-BF16 or AMX) trains some models faster
///    in amp-bf16 and others slower than in fp32 (a convolution net ran
///    0.66x on an AVX512-BF16 Xeon without AMX, a GPT 2.3x): the main rank
///    times a few training steps of each on the first batch of `data` with
///    models from `make_model` and every rank takes the faster;
///  - elsewhere, precision_support()'s rule (amp-bf16 on BF16 tensor
///    cores, amp on FP16 ones, fp32 without low-precision hardware).
/// The measurement uses the global random generator: call it before the
/// run seeds it.
AutoPrecision resolve_auto_precision(
    const ProgramConfig& config, const lamp::data::Dataset& data,
    const lamp::training::Task& task, lamp::distributed::ProcessGroup& group,
    const std::function<BuiltModel(lamp::Precision)>& make_model,
    const std::string& stored);

} // namespace lamp_examples
