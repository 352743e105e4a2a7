#pragma once

// The check of a GradScaler's options and scale, shared by its constructor,
// its loads and its setters (defined in grad_scaler_options.cpp).

#include "lamp/amp/grad_scaler.h"

namespace lamp {
namespace detail {

// Refuses, naming `caller`, a scale that is not finite, positive and
// representable in FP32 (a double that FP32 rounds to 0 or inf).
void check_scale(double scale, const char* caller);

// check_scale(scale), and refuses options out of their ranges.
void check_options(const GradScalerOptions& o, double scale,
                   const char* caller);

} // namespace detail
} // namespace lamp
