// Running out of memory in lamp's large allocations is an error that says
// what was being allocated, how much, and what to do.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <unistd.h>

#include <clocale>
#include <cstdio>
#include <limits>
#include <new>
#include <string>

#include "lamp/amp/master_weights.h"
#include "lamp/platform/address_space.h"
#include "lamp/platform/checkpoint_file.h"
#include "lamp/platform/out_of_memory.h"
#include "test_util.h"
#include "trainer_util.h"

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

// The size reads with a decimal point whatever locale the host program set
// (a German one prints "1,5" with printf). Skipped where no such locale is
// installed.
TEST(OutOfMemory, TheSizeReadsTheSameInEveryLocale) {
  const std::string before = std::setlocale(LC_NUMERIC, nullptr);
  const char* comma = nullptr;
  for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8",
                           "fr_FR.utf8", "ru_RU.UTF-8"}) {
    if (std::setlocale(LC_NUMERIC, name) != nullptr) {
      comma = name;
      break;
    }
  }
  if (comma == nullptr) {
    GTEST_SKIP() << "no locale with a decimal comma is installed";
  }
  const auto error = error_of([] {
    lamp::with_memory_context("the buffer", 3 * 1024 * 1024 / 2,
                              []() -> int { throw std::bad_alloc(); });
  });
  std::setlocale(LC_NUMERIC, before.c_str());
  expect_contains(error, "the buffer (1.5 MiB)");
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

constexpr int64_t kMiB = int64_t{1} << 20;

// The CPU's memory is the machine's physical memory; a size beyond it is
// refused before any allocation, naming the size, the memory, the device
// and the caller's fix; a size within it passes, and so does anything where
// the memory is unknown.
TEST(DeviceMemory, ASizeBeyondTheMemoryIsRefusedNamingTheFix) {
  const uint64_t memory = lamp::device_memory_bytes(torch::kCPU);
  EXPECT_EQ(memory, static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                        static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE)));
  const auto message = lamp_test::error_of([&] {
    lamp::check_fits_in_memory(memory + 1, torch::kCPU, "the model",
                               "give a smaller --width");
  });
  EXPECT_NE(message.find("lamp: the model needs at least "), std::string::npos)
      << message;
  EXPECT_NE(message.find("(" + std::to_string(memory + 1) +
                         " bytes), more than the "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("(" + std::to_string(memory) +
                         " bytes) of memory of cpu; give a smaller --width."),
            std::string::npos)
      << message;
  EXPECT_NO_THROW(
      lamp::check_fits_in_memory(memory, torch::kCPU, "the model", "fix"));
  EXPECT_NO_THROW(
      lamp::check_fits_in_memory(std::numeric_limits<uint64_t>::max(),
                                 torch::Device(torch::kMeta), "x", "y"));
  EXPECT_EQ(lamp::device_memory_bytes(torch::Device(torch::kMeta)), 0u);
}

TEST(AddressSpace, WhatARunNeedsGrowsWithThreadsAndTensors) {
  // The first thread's BLAS buffer is mapped at load: one thread needs the
  // tensors' room alone.
  EXPECT_EQ(lamp::address_space_needed(1, 0), 128 * kMiB);
  EXPECT_EQ(lamp::address_space_needed(3, 100),
            2 * 160 * kMiB + 128 * kMiB + 100);
  expect_contains(error_of([] { lamp::address_space_needed(0, 0); }),
                  "threads must be at least 1");
  expect_contains(error_of([] { lamp::address_space_needed(1, -1); }),
                  "tensor_bytes not negative");
}

TEST(AddressSpace, ALimitWithTooLittleRoomIsRefusedNamingItAndTheFix) {
  lamp::AddressSpace space;
  space.mapped = 1000 * kMiB;
  // No limit: anything goes.
  lamp::check_address_space(space, int64_t{1} << 50, "training");
  space.limit = 1500 * kMiB;
  // Exactly the room needed is enough.
  lamp::check_address_space(space, 500 * kMiB, "training");
  const auto error = error_of(
      [&] { lamp::check_address_space(space, 500 * kMiB + 1, "training"); });
  expect_contains(
      error,
      "the address-space limit (ulimit -v) is 1536000 KiB (1500 MiB) and this "
      "process already maps 1000 MiB; training needs about 500 MiB more");
  // Rounded up to the next whole MiB beyond mapped + needed.
  expect_contains(error,
                  "so training is not started: raise the limit to at least "
                  "1537024 KiB (ulimit -v 1537024) or remove it (ulimit -v "
                  "unlimited), or use fewer threads (OMP_NUM_THREADS).");
}

// A checkpoint the host cannot hold twice in memory (the archive, then its
// checksummed envelope) is refused in lamp's words, and the checkpoint
// written before it is left whole.
TEST(OutOfMemory, ACheckpointTheHostCannotHoldKeepsThePreviousOne) {
  const auto path = lamp_test::temp_path("oom_checkpoint.pt");
  {
    torch::serialize::OutputArchive small;
    small.write("x", torch::ones({4}));
    lamp::save_checked_archive(small, path);
  }
  torch::serialize::OutputArchive large;
  large.write("x", torch::ones({64 * kMiB / 4})); // 64 MiB
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &saved), 0);
  // Room for about one copy of it, not for the two being built.
  const auto soft =
      static_cast<rlim_t>(lamp::address_space().mapped + 80 * kMiB);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < soft) {
    GTEST_SKIP() << "the hard address-space limit is below the test's";
  }
  struct rlimit lowered = saved;
  lowered.rlim_cur = soft;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &lowered), 0);
  const auto error = error_of([&] { lamp::save_checked_archive(large, path); });
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &saved), 0);
  expect_contains(
      error, "lamp: out of memory while allocating the checkpoint " + path +
                 " in host memory");
  torch::serialize::InputArchive read;
  lamp::load_checked_archive(read, path);
  torch::Tensor x;
  read.read("x", x);
  EXPECT_TRUE(torch::equal(x, torch::ones({4})));
  std::remove(path.c_str());
}

TEST(AddressSpace, ReadsTheSoftLimitAndWhatIsMapped) {
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &saved), 0);
  const auto before = lamp::address_space();
  EXPECT_GT(before.mapped, 0); // LibTorch alone maps hundreds of MiB
  if (saved.rlim_cur == RLIM_INFINITY) {
    EXPECT_EQ(before.limit, -1);
  }
  // A soft limit well above what is mapped (the hard one stays), read back,
  // then restored.
  const auto soft = static_cast<rlim_t>(before.mapped + 64 * 1024 * kMiB);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < soft) {
    GTEST_SKIP() << "the hard address-space limit is below the test's";
  }
  struct rlimit lowered = saved;
  lowered.rlim_cur = soft;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &lowered), 0);
  const auto limited = lamp::address_space();
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &saved), 0);
  EXPECT_EQ(limited.limit, static_cast<int64_t>(soft));
}

} // namespace
