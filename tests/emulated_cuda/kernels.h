#pragma once

// The entry points of lamp's CUDA kernels as the emulator's build of them
// names them: tests/emulated_cuda/CMakeLists.txt compiles the kernels with
// `lamp` spelled `lamp_emulated`, so that a test program may link lamp
// itself (for the ATen references) beside them, and a CUDA build's real
// kernels never meet these. Include this before any header that includes
// a kernel header itself (none of the references' headers does).

#include "emulated_cuda/emulator.h"

#define lamp lamp_emulated
#include "nn/float8_cast_kernels.h"
#include "nn/float8_scale_kernels.h"
#include "ops/add_norm_kernels.h"
#include "ops/channel_affine_kernels.h"
#undef lamp
