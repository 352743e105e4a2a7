#pragma once

namespace lamp {
namespace detail {

/// Where this LibTorch's CPU LayerNorm and GroupNorm cannot take 16-bit
/// inputs with FP32 parameters (1.13), registers CPU autocast kernels that
/// run them in FP32, once per process; elsewhere does nothing. Called when a
/// CPU autocast guard is entered (autocast_norms.cpp).
void ensure_cpu_autocast_norms();

} // namespace detail
} // namespace lamp
