#pragma once

/// \file
/// Which modules are normalisation layers: the ones network_to_half, the
/// precision report and the weight-decay groups treat apart.

#include <torch/nn/module.h>

namespace lamp {
namespace nn {

/// BatchNorm1d/2d/3d.
bool is_batch_norm(const torch::nn::Module& module);

/// Any normalisation layer: BatchNorm1d/2d/3d, InstanceNorm1d/2d/3d,
/// LayerNorm, GroupNorm or lamp::nn::RMSNorm.
bool is_norm(const torch::nn::Module& module);

} // namespace nn
} // namespace lamp
