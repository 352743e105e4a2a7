#pragma once

// Which code a GPT's opt-in fused operations run, for train_gpt's first
// lines and lamp_bench's JSON record: a fused option that falls back to
// ATen ops on the device says so, and why.

#include <lamp/amp/precision.h>
#include <lamp/models/gpt.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace lamp_examples {

/// One line per fused operation `model` turns on, for a run on `device` in
/// `precision`: "residual adds fused with their norms: " followed by
/// lamp::ops::add_norm_path's answer, "MLPs with their biases and GELU
/// fused: " followed by lamp::ops::gelu_mlp_path's (in fp8, for the MLPs
/// whose layers are not FP8), "Linear weights cast to autocast's dtype at
/// once: " followed by lamp::nn::cast_weights_once_path's, "bias gradients
/// in the weight-gradient products: " followed by
/// lamp::ops::linear_bgrad_path's, and in fp8 with `fp8_fused_casts` "FP8
/// casts in one pass: " followed by lamp::nn::float8_fused_casts_path's.
/// Empty when none is on.
std::vector<std::string> gpt_kernel_notes(const lamp::models::GPTOptions& model,
                                          const torch::Device& device,
                                          lamp::Precision precision,
                                          bool fp8_fused_casts = false);

} // namespace lamp_examples
