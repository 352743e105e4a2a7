#pragma once

// Kernels that probe the CUDA emulator itself (tests/emulated_cuda/
// probe_kernels.cu, compiled for the emulator alone): each launcher returns
// its launch's error, as lamp's kernel launchers do.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lamp_emu_probe {

/// out[(block y * grid x + block x) * threads + thread] = its indices packed
/// as bx + 10 by + 100 tx + 1000 ty, for a 2-D grid of 2-D blocks.
cudaError_t indices(int grid_x, int grid_y, int block_x, int block_y, int* out);

/// Thread 0 of each block writes a value to shared memory and every thread
/// copies it to out[block * threads + thread]: with `barrier`, after a
/// __syncthreads; without, racing thread 0's write.
cudaError_t broadcast(int blocks, int threads, bool barrier, float* out);

/// Thread 0 writes 1 to shared memory; after a __syncthreads every thread
/// reads it into out[thread]; then thread 0 writes 2 there: with `barrier`,
/// after a second __syncthreads, without, racing the other threads' reads.
cudaError_t reuse(int threads, bool barrier, float* out);

/// out[thread] = the sum of the lanes' indices over the thread's warp by
/// __shfl_xor_sync (496 for a whole warp).
cudaError_t warp_sum(int threads, int* out);

/// out[0] = a shared float no thread wrote.
cudaError_t unwritten_shared(float* out);

/// A warp of 32 where the first `lanes` lanes shuffle with a full mask
/// (out[lane] = lane ^ lane_mask) and the others go on (out[lane] = lane),
/// to a __syncthreads where `wait`, else to their end.
cudaError_t partial_shuffle(int lanes, int lane_mask, bool wait, int* out);

/// 64 threads, of which the second warp ends before a __syncthreads the
/// first waits at.
cudaError_t early_exit(int* out);

/// 64 threads, each warp at a __syncthreads of its own branch.
cudaError_t split_barrier(int* out);

/// A refused launch, then a clean one, then cudaGetLastError().
cudaError_t refused_then_clean();

/// A kernel of 32 threads with 40 KiB of static shared memory, launched
/// with `dynamic_bytes` (at least 128) of dynamic shared memory: out[t] = 3.
cudaError_t shared_bytes(int dynamic_bytes, float* out);

/// A launch of `threads` threads in `blocks` blocks that does nothing.
cudaError_t empty(unsigned blocks, unsigned threads);

/// A kernel whose parameter takes 4 KiB + 4 bytes.
cudaError_t large_parameters();

} // namespace lamp_emu_probe
