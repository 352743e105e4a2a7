#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <dlfcn.h>
#include <sys/resource.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "lamp/platform/backends.h"
#include "lamp/platform/host_memory.h"
#include "platform/loaded_library.h"
#include "test_util.h"

namespace {

// Minor page faults of this process so far.
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Allocates `blocks` blocks of `bytes`, writes one byte a page, frees them:
// the page faults it took.
long faults_of_a_round(int blocks, std::size_t bytes) {
  const long before = minor_faults();
  std::vector<void*> held;
  for (int i = 0; i < blocks; ++i) {
    void* p = std::malloc(bytes);
    EXPECT_NE(p, nullptr);
    for (std::size_t at = 0; at < bytes; at += 4096) {
      static_cast<volatile char*>(p)[at] = 1;
    }
    held.push_back(p);
  }
  for (void* p : held) {
    std::free(p);
  }
  return minor_faults() - before;
}

// After keep_host_memory() a second round of 4 MiB blocks (an activation's
// size) reuses the first round's pages. With glibc's defaults each block is
// a fresh mapping, faulted in page by page every round; and even once
// glibc's adaptive thresholds have risen (they cap at a 32 MiB mapping and
// 64 MiB kept free), 128 MiB freed at once is mostly handed back. "Under a
// tenth of the 32,768 pages" leaves room for the allocator's bookkeeping
// and the test harness.
TEST(HostMemory, FreedBlocksServeTheNextRoundWithoutPageFaults) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "keep_host_memory tunes glibc's malloc; this is another";
#else
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's malloc replaces glibc's";
#endif
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr || std::getenv("MALLOC_MMAP_THRESHOLD_") ||
      std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    GTEST_SKIP() << "malloc is tuned by this test's environment";
  }
  ASSERT_EQ(lamp::keep_host_memory(), lamp::HostMemoryTuning::kApplied);
  constexpr int kBlocks = 32;
  constexpr std::size_t kBytes = std::size_t{4} << 20;
  faults_of_a_round(kBlocks, kBytes);
  const long pages = kBlocks * static_cast<long>(kBytes / 4096);
  const long faults = faults_of_a_round(kBlocks, kBytes);
  EXPECT_LT(faults, pages / 10)
      << faults << " page faults for " << pages << " pages reused";
#endif
}

// The environment's settings win; a threshold glibc refuses is an error
// that names the limit.
TEST(HostMemory, LeavesTheEnvironmentsSettingsAndRefusesTooLargeAThreshold) {
  lamp::HostMemoryOptions too_large;
  too_large.mmap_threshold_bytes = std::size_t{64} << 20;
  lamp_test::expect_error([&] { lamp::keep_host_memory(too_large); },
                          "mmap_threshold_bytes 67108864 is above glibc's "
                          "limit of 32 MiB");
  const char* had = std::getenv("MALLOC_TRIM_THRESHOLD_");
  const std::string saved = had != nullptr ? had : "";
  ::setenv("MALLOC_TRIM_THRESHOLD_", "1000000", 1);
  EXPECT_EQ(lamp::keep_host_memory(),
            lamp::HostMemoryTuning::kSetByEnvironment);
  if (had != nullptr) {
    ::setenv("MALLOC_TRIM_THRESHOLD_", saved.c_str(), 1);
  } else {
    ::unsetenv("MALLOC_TRIM_THRESHOLD_");
  }
  EXPECT_EQ(lamp::to_string(lamp::HostMemoryTuning::kSetByEnvironment),
            "set by the environment");
  EXPECT_EQ(lamp::to_string(lamp::HostMemoryTuning::kApplied), "applied");
}

TEST(Backends, SwitchesSetAndReportTheirState) {
  const bool benchmark = lamp::cudnn_benchmark();
  const bool tf32 = lamp::tf32();
  lamp::set_cudnn_benchmark(true);
  EXPECT_TRUE(lamp::cudnn_benchmark());
  lamp::set_cudnn_benchmark(false);
  EXPECT_FALSE(lamp::cudnn_benchmark());
  lamp::set_tf32(true);
  EXPECT_TRUE(lamp::tf32());
  lamp::set_tf32(false);
  EXPECT_FALSE(lamp::tf32());
  lamp::set_cudnn_benchmark(benchmark);
  lamp::set_tf32(tf32);
}

// The guard sets both switches and restores each as it found it, nested.
TEST(Backends, Tf32GuardRestoresEachSwitch) {
  auto& context = at::globalContext();
  const bool cudnn = context.allowTF32CuDNN(),
             cublas = context.allowTF32CuBLAS();
  context.setAllowTF32CuDNN(true);
  context.setAllowTF32CuBLAS(false);
  {
    lamp::Tf32Guard off(false);
    EXPECT_FALSE(context.allowTF32CuDNN());
    EXPECT_FALSE(context.allowTF32CuBLAS());
    {
      lamp::Tf32Guard on(true);
      EXPECT_TRUE(lamp::tf32());
    }
    EXPECT_FALSE(context.allowTF32CuDNN());
    EXPECT_FALSE(context.allowTF32CuBLAS());
  }
  EXPECT_TRUE(context.allowTF32CuDNN());
  EXPECT_FALSE(context.allowTF32CuBLAS());
  context.setAllowTF32CuDNN(cudnn);
  context.setAllowTF32CuBLAS(cublas);
}

TEST(Backends, Fp16ProbeAgreesWithAnFp16Convolution) {
  const auto x = torch::ones({1, 2, 4, 4}, torch::kHalf);
  const auto w = torch::ones({3, 2, 3, 3}, torch::kHalf);
  if (lamp::fp16_compute_available(torch::kCPU)) {
    const auto y = torch::conv2d(x, w);
    EXPECT_EQ(y.scalar_type(), torch::kHalf);
    EXPECT_EQ(y[0][0][0][0].item<float>(), 18.0f);
  } else {
    EXPECT_THROW(torch::conv2d(x, w), c10::Error);
  }
}

TEST(Backends, CudaQueriesAreSafeWithoutAGpu) {
  if (lamp::cuda_available()) {
    EXPECT_TRUE(lamp::fp16_compute_available(torch::kCUDA));
    return;
  }
  EXPECT_FALSE(lamp::fp16_compute_available(torch::kCUDA));
  EXPECT_EQ(lamp::peak_device_memory(torch::kCUDA), 0);
  EXPECT_EQ(lamp::allocated_device_memory(torch::kCUDA), 0);
  EXPECT_EQ(lamp::reserved_device_memory(torch::kCUDA), 0);
  lamp::reset_peak_device_memory(torch::kCUDA); // must not throw
  lamp::release_cached_device_memory();         // must not throw
}

TEST(Backends, PeakDeviceMemoryCountsAllocations_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device device(torch::kCUDA, 0);
  lamp::reset_peak_device_memory(device);
  const int64_t before = lamp::peak_device_memory(device);
  {
    auto big = torch::empty({64 << 20}, torch::TensorOptions().device(device));
    EXPECT_GE(lamp::peak_device_memory(device), before + (256 << 20));
  }
  lamp::reset_peak_device_memory(device);
  EXPECT_LT(lamp::peak_device_memory(device), before + (256 << 20));
}

TEST(Backends, AllocatedAndReservedDeviceMemory_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device device(torch::kCUDA, 0);
  lamp::release_cached_device_memory();
  const int64_t allocated = lamp::allocated_device_memory(device);
  const int64_t reserved = lamp::reserved_device_memory(device);
  EXPECT_GE(reserved, allocated);
  {
    auto big = torch::empty({64 << 20}, torch::TensorOptions().device(device));
    EXPECT_EQ(lamp::allocated_device_memory(device), allocated + (256 << 20));
    EXPECT_GE(lamp::reserved_device_memory(device), reserved + (256 << 20));
  }
  // Freed: still reserved by the cache until it is released.
  EXPECT_EQ(lamp::allocated_device_memory(device), allocated);
  EXPECT_GE(lamp::reserved_device_memory(device), reserved + (256 << 20));
  lamp::release_cached_device_memory();
  EXPECT_LT(lamp::reserved_device_memory(device), reserved + (256 << 20));
}

// The answer network_to_half's keep_norm_fp32 relies on, against the
// kernels themselves: a LayerNorm of FP16/BF16 input with FP32 parameters.
TEST(Backends, MixedDtypeNormAnswersAsTheKernelsRun) {
  std::vector<torch::Device> devices = {torch::kCPU};
  if (lamp::cuda_available()) {
    devices.emplace_back(torch::kCUDA, 0);
  }
  for (const auto& device : devices) {
    for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
      bool runs = true;
      try {
        const auto fp32 = torch::TensorOptions().device(device);
        torch::layer_norm(torch::randn({3, 5}, fp32).to(dtype), {5},
                          torch::rand({5}, fp32), torch::rand({5}, fp32));
      } catch (const c10::Error&) {
        runs = false;
      }
      EXPECT_EQ(lamp::mixed_dtype_norm_available(device, dtype), runs)
          << device << " " << dtype;
    }
    EXPECT_FALSE(lamp::mixed_dtype_norm_available(device, torch::kFloat));
  }
  if (!lamp::cuda_available()) {
    EXPECT_FALSE(lamp::mixed_dtype_norm_available(torch::kCUDA, torch::kHalf));
  }
}

// A GPU index beyond those this process sees: lamp's message, not ATen's
// internal assert from its device-property query.
TEST(Backends, AGpuThisProcessDoesNotSeeIsNamed_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device absent(
      torch::kCUDA, static_cast<c10::DeviceIndex>(torch::cuda::device_count()));
  try {
    lamp::device_name(absent);
    FAIL() << "named a GPU this process does not see";
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("does not exist: this process sees"), std::string::npos)
        << what;
  }
}

TEST(Backends, CudnnBenchmarkLimitRoundTripsAndRefusesNegatives) {
  const int before = lamp::cudnn_benchmark_limit();
  lamp::set_cudnn_benchmark_limit(3);
  EXPECT_EQ(lamp::cudnn_benchmark_limit(), 3);
  lamp::set_cudnn_benchmark_limit(0); // 0: try every algorithm
  EXPECT_EQ(lamp::cudnn_benchmark_limit(), 0);
  EXPECT_THROW(lamp::set_cudnn_benchmark_limit(-1), c10::Error);
  EXPECT_EQ(lamp::cudnn_benchmark_limit(), 0);
  lamp::set_cudnn_benchmark_limit(before);
}

// LAMP_TEST_TORCH_PACKAGE: what CMake found (dpkg-query) holding the
// LibTorch, e.g. "libtorch-dev 1.13.1+dfsg-4", or "" for a torch wheel.
TEST(Backends, LibtorchVersionGivesTheHeadersVersionAndTheDebianPackage) {
  const std::string version = lamp::libtorch_version();
  const std::string package = LAMP_TEST_TORCH_PACKAGE;
  if (package.empty()) {
    EXPECT_EQ(version, TORCH_VERSION);
  } else {
    EXPECT_EQ(version,
              std::string(TORCH_VERSION) + " (Debian package " + package + ")");
    // Debian's package of this LibTorch is libtorch-dev (from libtorch1.13's
    // source package), with its own version after the name.
    EXPECT_EQ(package.rfind("libtorch", 0), 0u) << package;
    EXPECT_NE(package.find(' '), std::string::npos) << package;
  }
}

// LAMP_TEST_UNLOADED_LIBRARY: the path of a shared library built beside the
// tests that no test program links (tests/tools/unloaded_library.cpp).
TEST(LoadedLibrary, TakesTheProcesssCopyAndNeverLoadsOneOfItsOwn) {
  // lamp hands ATen's cuDNN handles to the cuDNN it finds: only the copy
  // LibTorch loaded may serve, never one loaded beside it.
  void* libc = lamp::detail::loaded_library("libc.so.6");
  ASSERT_NE(libc, nullptr);
  EXPECT_EQ(libc, dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD));
  EXPECT_EQ(lamp::detail::loaded_library("liblamp-no-such-library.so.1"),
            nullptr);

  // A library this process has not loaded stays unloaded; once loaded, its
  // copy is the one found.
  const std::string unloaded = LAMP_TEST_UNLOADED_LIBRARY;
  ASSERT_EQ(dlopen(unloaded.c_str(), RTLD_LAZY | RTLD_NOLOAD), nullptr)
      << unloaded << " was loaded before the test";
  EXPECT_EQ(lamp::detail::loaded_library(unloaded), nullptr);
  ASSERT_EQ(dlopen(unloaded.c_str(), RTLD_LAZY | RTLD_NOLOAD), nullptr)
      << "loaded_library() loaded " << unloaded;
  void* loaded = dlopen(unloaded.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(loaded, nullptr) << dlerror();
  void* found = lamp::detail::loaded_library(unloaded);
  EXPECT_EQ(found, loaded);
  if (found != nullptr) {
    dlclose(found);
  }
  dlclose(loaded);

  const auto why = lamp::detail::not_loaded_reason("libcudnn.so.9", "cuDNN", 9);
  EXPECT_NE(why.find("LibTorch has not loaded libcudnn.so.9"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("cuDNN this lamp was built for, version 9"),
            std::string::npos)
      << why;
}

} // namespace
