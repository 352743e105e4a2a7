// The CUDA emulator's probes (tests/emulated_cuda/probe_kernels.h): CUDA
// written as for a GPU, compiled only through translate.py for the
// emulator, so that its tests check what the emulator does with each
// construct lamp's kernels use.
#include "emulated_cuda/probe_kernels.h"

namespace lamp_emu_probe {
namespace {

__global__ void indices_kernel(int* out) {
  const int block = blockIdx.y * gridDim.x + blockIdx.x;
  const int threads = blockDim.x * blockDim.y;
  const int thread = threadIdx.y * blockDim.x + threadIdx.x;
  out[block * threads + thread] = static_cast<int>(
      blockIdx.x + 10 * blockIdx.y + 100 * threadIdx.x + 1000 * threadIdx.y);
}

__global__ void broadcast_kernel(bool barrier, float* out) {
  __shared__ float value;
  if (threadIdx.x == 0) {
    value = static_cast<float>(blockIdx.x + 1);
  }
  if (barrier) {
    __syncthreads();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

__global__ void reuse_kernel(bool barrier, float* out) {
  __shared__ float value;
  if (threadIdx.x == 0) {
    value = 1.0f;
  }
  __syncthreads();
  const float read = value;
  if (barrier) {
    __syncthreads(); // every thread has read before the next write
  }
  if (threadIdx.x == 0) {
    value = 2.0f;
  }
  out[threadIdx.x] = read;
}

__global__ void warp_sum_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x & 31);
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  out[threadIdx.x] = v;
}

__global__ void unwritten_shared_kernel(float* out) {
  __shared__ float never_written[4];
  out[0] = never_written[threadIdx.x];
}

__global__ void partial_shuffle_kernel(int lanes, int lane_mask, bool wait,
                                       int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (v < lanes) {
    v = __shfl_xor_sync(0xffffffffu, v, lane_mask);
  }
  if (wait) {
    __syncthreads();
  }
  out[threadIdx.x] = v;
}

__global__ void early_exit_kernel(int* out) {
  if (threadIdx.x >= 32) {
    return;
  }
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void split_barrier_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

__global__ void shared_bytes_kernel(float* out) {
  __shared__ float forty_kib[10240];
  extern __shared__ float dynamic[];
  forty_kib[threadIdx.x] = 1.0f;
  dynamic[threadIdx.x] = 2.0f;
  __syncthreads();
  out[threadIdx.x] = forty_kib[threadIdx.x] + dynamic[threadIdx.x];
}

__global__ void empty_kernel() {}

struct Large {
  float values[1025];
};

__global__ void large_parameters_kernel(Large large) {
  (void)large;
}

} // namespace

cudaError_t indices(int grid_x, int grid_y, int block_x, int block_y,
                    int* out) {
  indices_kernel<<<dim3(grid_x, grid_y), dim3(block_x, block_y)>>>(out);
  return cudaGetLastError();
}

cudaError_t broadcast(int blocks, int threads, bool barrier, float* out) {
  broadcast_kernel<<<blocks, threads>>>(barrier, out);
  return cudaGetLastError();
}

cudaError_t reuse(int threads, bool barrier, float* out) {
  reuse_kernel<<<1, threads>>>(barrier, out);
  return cudaGetLastError();
}

cudaError_t warp_sum(int threads, int* out) {
  warp_sum_kernel<<<1, threads>>>(out);
  return cudaGetLastError();
}

cudaError_t unwritten_shared(float* out) {
  unwritten_shared_kernel<<<1, 1>>>(out);
  return cudaGetLastError();
}

cudaError_t partial_shuffle(int lanes, int lane_mask, bool wait, int* out) {
  partial_shuffle_kernel<<<1, 32>>>(lanes, lane_mask, wait, out);
  return cudaGetLastError();
}

cudaError_t early_exit(int* out) {
  early_exit_kernel<<<1, 64>>>(out);
  return cudaGetLastError();
}

cudaError_t split_barrier(int* out) {
  split_barrier_kernel<<<1, 64>>>(out);
  return cudaGetLastError();
}

cudaError_t refused_then_clean() {
  empty_kernel<<<0, 32>>>();
  empty_kernel<<<1, 32>>>();
  return cudaGetLastError();
}

cudaError_t shared_bytes(int dynamic_bytes, float* out) {
  shared_bytes_kernel<<<1, 32, dynamic_bytes>>>(out);
  return cudaGetLastError();
}

cudaError_t empty(unsigned blocks, unsigned threads) {
  empty_kernel<<<blocks, threads>>>();
  return cudaGetLastError();
}

cudaError_t large_parameters() {
  large_parameters_kernel<<<1, 1>>>(Large{});
  return cudaGetLastError();
}

} // namespace lamp_emu_probe
