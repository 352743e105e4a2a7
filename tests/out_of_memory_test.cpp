// Running out of memory in lamp's large allocations is an error that says
// what was being allocated, how much, and what to do.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <new>
#include <string>

#include "lamp/amp/master_weights.h"
#include "lamp/platform/out_of_memory.h"
#include "test_util.h"

namespace {

using lamp_test::error_of;

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << text;
}

TEST(OutOfMemory, BadAllocNamesTheAllocationItsSizeAndTheFix) {
  const auto error = error_of([] {
    lamp::with_memory_context("the input buffer", 3 * 1024 * 1024,
                              []() -> int { throw std::bad_alloc(); });
  });
  expect_contains(error,
                  "lamp: out of memory while allocating the input buffer "
                  "(3.0 MiB): std::bad_alloc.");
  expect_contains(error, "Use a smaller batch size");
  expect_contains(error, "ulimit -v");
}

TEST(OutOfMemory, AllocatorErrorsAreNamedOthersPassUnchanged) {
  const auto cpu = error_of([] {
    lamp::with_memory_context("the weights", 1 << 20, []() -> int {
      TORCH_CHECK(false,
                  "DefaultCPUAllocator: not enough memory: you tried to "
                  "allocate 1048576 bytes.");
    });
  });
  expect_contains(cpu, "out of memory while allocating the weights (1.0 MiB)");
  expect_contains(cpu, "you tried to allocate 1048576 bytes");
  const auto other = error_of([] {
    lamp::with_memory_context("the weights", 1 << 20, []() -> int {
      TORCH_CHECK(false, "a shape mismatch");
    });
  });
  EXPECT_EQ(other.find("out of memory"), std::string::npos) << other;
  expect_contains(other, "a shape mismatch");
  EXPECT_EQ(lamp::with_memory_context("nothing", 0, [] { return 7; }), 7);
}

// A real allocation beyond the address space: the FP32 master (256 TiB) of
// a parameter of 2^46 elements (an expanded view, which holds one).
TEST(OutOfMemory, MasterWeightsTooLargeForTheAddressSpace) {
  const int64_t side = int64_t(1) << 23;
  const auto huge = torch::zeros({1, 1}).expand({side, side});
  const auto error = error_of([&] { lamp::MasterWeights master({huge}); });
  expect_contains(error,
                  "out of memory while allocating the FP32 master weights "
                  "(268435456.0 MiB)");
}

} // namespace
