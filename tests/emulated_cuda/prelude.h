#pragma once

// Included ahead of every kernel source that tests/emulated_cuda/translate.py
// rewrote for the host compiler (-include): what the CUDA compiler gives a
// kernel (its built-in indices, barriers, warp shuffles, shared memory,
// intrinsics and launches), on tests/emulated_cuda/emulator.cpp's threads.
// The kernels' own arithmetic, indexing and control flow compile unchanged,
// so a CPU runs the code a GPU would, one block at a time.
//
// Not emulated: the GPU's contraction of a multiply and an add into one
// fused multiply-add (nvcc's default; the host compiles with
// -ffp-contract=off, so each rounds on its own, as __fmul_rn/__fadd_rn
// demand), rsqrtf's 2-ulp approximation (a division and a square root here),
// and memory ordering between blocks (they run one after another).

// The runtime's error query is the emulator's (tests/emulated_cuda/
// emulator.cpp), never CUDA's runtime, which a test program linked with a
// CUDA LibTorch loads too.
#define cudaGetLastError lamp_emulated_cuda_get_last_error
#define cudaPeekAtLastError lamp_emulated_cuda_peek_at_last_error

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// The CUDA headers spell these as attributes the host compiler does not
// know: a kernel is an ordinary function here. translate.py has made each
// __shared__ variable a static one (shared by the block's threads, which
// are every thread running at the time); one it left is a compile error.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ __shared___left_by_translate_py

namespace lamp_emu {

/// The indices and sizes of the emulated thread running now.
struct Context {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
const Context& current();

/// __syncthreads() at `file`:`line`: waits for every thread of the block,
/// which must all reach this call (the same source line: a compiler may
/// copy one call into several places).
void sync_threads(const char* file, int line);
/// The rendezvous of a shuffle: every lane of the calling thread's warp.
void sync_warp(unsigned mask);
/// The calling thread's lane's 8 bytes of its warp's shuffle exchange, and
/// another lane's.
void* exchange_slot(unsigned lane);
unsigned lane_id();
/// Fails the launch where a shuffle reads a lane that has ended or does not
/// exist (undefined on a GPU).
void check_source_lane(unsigned lane);

/// Registers a static __shared__ variable of the running kernel (its size
/// counts toward the block's 48 KiB; its bytes are made garbage at the first
/// thread of each block that reaches it, as a GPU's shared memory is).
void shared_variable(const void* address, std::size_t bytes);
/// The launch's dynamic shared memory (extern __shared__), garbage at each
/// block's start.
void* dynamic_shared_memory();
template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_memory());
}

/// A launch's configuration: <<<grid, block, shared bytes, stream>>>.
struct Config {
  Config(dim3 grid, dim3 block, std::size_t shared_bytes = 0,
         cudaStream_t stream = nullptr)
      : grid(grid), block(block), shared_bytes(shared_bytes), stream(stream) {}
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes;
  cudaStream_t stream;

  template <typename... A>
  auto operator()(A&&... args) const;
};

/// Runs `body` once per thread of the launch, block after block. A bad
/// configuration (too much shared memory among it), or a kernel whose
/// threads do what a GPU leaves undefined (a __syncthreads that some of the
/// block's threads ended before or reach from another call, a shuffle that
/// a live lane of the warp waits out at a barrier, a shuffle reading an
/// ended lane), is the launch's error, as cudaGetLastError() returns it.
void launch(const Config& config, std::size_t parameter_bytes,
            void (*body)(void*), void* state);

template <typename... A>
struct Pending {
  Config config;
  std::tuple<std::decay_t<A>...> args;
};

template <typename... A>
auto Config::operator()(A&&... args) const {
  return Pending<A...>{
      *this, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)};
}

/// kernel<<<config>>>(args...), which translate.py writes
/// kernel ^ ::lamp_emu::Config(config)(args...): each thread calls the
/// kernel with its own copy of the parameters, converted once to the
/// kernel's parameter types as a launch converts them.
template <typename... P, typename... A>
void operator^(void (*kernel)(P...), Pending<A...>&& pending) {
  static_assert(sizeof...(P) == sizeof...(A), "a kernel's arguments");
  struct State {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> parameters;
  };
  State state{kernel, std::apply(
                          [](auto&... a) {
                            return std::tuple<std::decay_t<P>...>(a...);
                          },
                          pending.args)};
  launch(
      pending.config, (std::size_t{0} + ... + sizeof(std::decay_t<P>)),
      [](void* s) {
        auto* st = static_cast<State*>(s);
        std::apply(st->kernel, st->parameters); // copies: one per thread
      },
      &state);
}

template <typename T>
T shfl_xor(unsigned mask, T value, int lane_mask) {
  static_assert(sizeof(T) <= 8, "a shuffle of at most 8 bytes");
  const unsigned lane = lane_id();
  std::memcpy(exchange_slot(lane), &value, sizeof(T));
  sync_warp(mask);
  const unsigned source = lane ^ static_cast<unsigned>(lane_mask);
  check_source_lane(source);
  T out;
  std::memcpy(&out, exchange_slot(source), sizeof(T));
  sync_warp(mask); // every lane has read before the next shuffle writes
  return out;
}

template <typename T>
T bit_cast(const void* from) {
  T to;
  std::memcpy(&to, from, sizeof(T));
  return to;
}

} // namespace lamp_emu

#define threadIdx (::lamp_emu::current().thread_idx)
#define blockIdx (::lamp_emu::current().block_idx)
#define blockDim (::lamp_emu::current().block_dim)
#define gridDim (::lamp_emu::current().grid_dim)
#define warpSize 32

// A macro, so that sync_threads() knows the kernel's line.
#define __syncthreads() ::lamp_emu::sync_threads(__FILE__, __LINE__)
// Blocks run one after another and their threads on one host thread: every
// write is already visible.
inline void __threadfence() {}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  return ::lamp_emu::shfl_xor(mask, value, lane_mask);
}
// One host thread runs every emulated one: a read-modify-write is atomic.
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  const unsigned old = *address;
  *address = old + value;
  return old;
}
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}

inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
// A macro: C23's <math.h> (glibc 2.41 on) declares an rsqrtf of its own.
inline float lamp_emu_rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
#define rsqrtf lamp_emu_rsqrtf
inline unsigned __float_as_uint(float v) {
  return ::lamp_emu::bit_cast<unsigned>(&v);
}
inline float __uint_as_float(unsigned v) {
  return ::lamp_emu::bit_cast<float>(&v);
}
inline float __int_as_float(int v) {
  return ::lamp_emu::bit_cast<float>(&v);
}
inline int __float_as_int(float v) {
  return ::lamp_emu::bit_cast<int>(&v);
}
// CUDA's integer max/min, which device code calls unqualified.
inline unsigned max(unsigned a, unsigned b) {
  return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a > b ? a : b;
}
inline int min(int a, int b) {
  return a < b ? a : b;
}
using std::fmaf;
using std::fmaxf;
using std::fminf;
using std::isfinite;
using std::isinf;
using std::isnan;
