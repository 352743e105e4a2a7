#pragma once

/// \file
/// Small named switches for the process-wide knobs ATen already has, and what
/// this LibTorch build can compute in low precision.

#include <torch/types.h>

#include <string>

namespace lamp {

/// Turns cuDNN's benchmark mode on or off (Python's
/// `torch.backends.cudnn.benchmark`). With it, cuDNN times its algorithms for
/// every new input shape and keeps the fastest. A no-op without CUDA; never
/// throws.
void set_cudnn_benchmark(bool enabled);

/// Whether cuDNN benchmark mode is on.
bool cudnn_benchmark();

/// How many of cuDNN's algorithms benchmark mode tries per new shape
/// (Python's `torch.backends.cudnn.benchmark_limit`; default 10, 0 = all).
/// Lower is a shorter first epoch, higher may find a faster algorithm.
/// Negative values are an error.
void set_cudnn_benchmark_limit(int limit);
/// The number of algorithms benchmark mode tries per new shape (0 = all).
int cudnn_benchmark_limit();

/// Allows or forbids TF32 tensor-core math for FP32 convolutions (cuDNN) and
/// matrix multiplications (cuBLAS), as Python's
/// `torch.backends.cudnn.allow_tf32` and
/// `torch.backends.cuda.matmul.allow_tf32` together. Every
/// FP32-vs-mixed-precision comparison should state this setting. A no-op
/// without CUDA; never throws.
void set_tf32(bool enabled);

/// Whether TF32 is allowed for both cuDNN convolutions and cuBLAS matmuls.
bool tf32();

/// Sets TF32 (set_tf32) for its lifetime, then restores the cuDNN and cuBLAS
/// settings it found, each as it was. The setting is LibTorch's, for the
/// whole process: guards must end in the reverse order of their creation.
///
/// \code
///   {
///     lamp::Tf32Guard no_tf32(false);  // an exact FP32 comparison
///     ...
///   }                                  // TF32 as before
/// \endcode
class Tf32Guard {
 public:
  /// Saves the cuDNN and cuBLAS TF32 settings, then calls set_tf32(enabled).
  explicit Tf32Guard(bool enabled);
  /// Puts back the two settings saved by the constructor.
  ~Tf32Guard();
  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;

 private:
  bool cudnn_;
  bool cublas_;
};

/// Whether this LibTorch can run FP16 convolutions and matrix multiplications
/// on `device`. True on CUDA when a GPU is present. On CPU it is found out once
/// per process by running a tiny FP16 conv2d and linear: LibTorch 1.13 has no
/// CPU kernels for them ("slow_conv2d_cpu" not implemented for 'Half').
bool fp16_compute_available(const torch::Device& device);

/// Whether LayerNorm and GroupNorm on `device` accept `dtype` (FP16/BF16)
/// inputs with FP32 parameters, which HalfOptions::keep_norm_fp32 relies on.
/// LibTorch 2.x's CPU kernels do; 1.13's CPU kernels and CUDA's (through
/// 2.15) do not ("expected scalar type BFloat16 but found Float"). Found out
/// once per process, device type and dtype by running the two ops on tiny
/// tensors on `device` (false for other device types and dtypes).
bool mixed_dtype_norm_available(const torch::Device& device,
                                torch::Dtype dtype);

/// The LibTorch lamp was built with, for reports: the version its headers
/// give (TORCH_VERSION), followed, for a Debian package's LibTorch, by the
/// package and its version: "1.13.0 (Debian package libtorch-dev
/// 1.13.1+dfsg-4)". Debian's libtorch-dev 1.13.1 has headers that say 1.13.0;
/// the package's version is read by CMake (dpkg-query) when lamp is built.
std::string libtorch_version();

/// Whether a CUDA GPU can be used by this process (false for CPU-only builds).
bool cuda_available();

/// Peak bytes allocated through the CUDA caching allocator (as Python's
/// `torch.cuda.max_memory_allocated`) on `device` since the last
/// reset_peak_device_memory(); 0 without CUDA.
int64_t peak_device_memory(const torch::Device& device);

/// Resets the peak counters of the CUDA caching allocator on `device`; a no-op
/// without CUDA.
void reset_peak_device_memory(const torch::Device& device);

/// Bytes allocated now through the CUDA caching allocator on `device` (as
/// `torch.cuda.memory_allocated`); 0 without CUDA.
int64_t allocated_device_memory(const torch::Device& device);

/// Bytes the CUDA caching allocator reserves on `device` now, CUDA-graph
/// pools included (as `torch.cuda.memory_reserved`); 0 without CUDA.
int64_t reserved_device_memory(const torch::Device& device);

/// Returns the caching allocator's unused blocks on every device to the
/// driver (as `torch.cuda.empty_cache`): reserved_device_memory() drops to
/// what live tensors and graph pools hold. A no-op without CUDA.
void release_cached_device_memory();

/// Waits for the work queued on `device` (CUDA); returns at once on CPU. For
/// timing, never inside a training step.
void synchronize(const torch::Device& device);

/// A human-readable name of the device: the GPU's name, or the CPU's model
/// name from /proc/cpuinfo ("cpu" when unknown).
std::string device_name(const torch::Device& device);

/// The CUDA toolkit this LibTorch was built with and the cuDNN it loaded,
/// as "CUDA 13.0, cuDNN 9.19.0" (cuDNN only when present); "" for a LibTorch
/// built without CUDA. Needs no GPU.
std::string cuda_versions();

/// Peak resident memory of this process in bytes (the CPU counterpart of
/// peak_device_memory()); 0 where the OS does not report it.
int64_t peak_host_memory();

} // namespace lamp
