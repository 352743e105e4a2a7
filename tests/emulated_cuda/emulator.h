#pragma once

// What a test asks of the CUDA emulator (tests/emulated_cuda/emulator.cpp)
// beyond the kernels' own entry points: why the last launch failed, and how
// many launches ran.

#include <driver_types.h> // cudaError_t

#include <cstddef>
#include <cstdint>
#include <string>

/// cudaGetLastError() as the emulated kernels' launchers call it: the last
/// failed launch's error, kept through later launches that succeed until
/// this reads it (then cudaSuccess), as CUDA's runtime keeps it.
extern "C" cudaError_t lamp_emulated_cuda_get_last_error();

namespace lamp_emu {

/// The message of the last failed launch (empty after a clean one), kept
/// until the next launch.
std::string last_launch_message();

/// Launches run since the program started, failed ones included.
std::int64_t launches();

/// The shared memory a block may take without opting in to more, as on
/// every GPU CUDA 12 and 13 build for.
constexpr std::size_t kSharedBytesPerBlock = 48 * 1024;

} // namespace lamp_emu
