#pragma once

/// \file
/// Forwarding header: this header moved to lamp/ops/relu_max_pool.h in lamp
/// 0.4 (lamp::ops::relu_max_pool2d, the same names). Include that one; this
/// forwarding header will be removed in lamp 0.5.

#include "lamp/ops/relu_max_pool.h"
