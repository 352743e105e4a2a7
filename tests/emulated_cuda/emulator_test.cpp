// The CUDA emulator (tests/emulated_cuda) on its probes: that a kernel sees
// the indices, barriers, shuffles and shared memory a GPU gives it, and
// that what a GPU would refuse or leave undefined fails here with a message
// (tests/emulated_cuda/kernels_test.cpp runs lamp's kernels on it).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "emulated_cuda/emulator.h"
#include "emulated_cuda/probe_kernels.h"

namespace {

namespace probe = lamp_emu_probe;

// The last launch's message contains `part`.
::testing::AssertionResult Said(const std::string& part) {
  const auto message = lamp_emu::last_launch_message();
  if (message.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "the launch said '" << message << "', not '" << part << "'";
}

TEST(CudaEmulator, GivesEachThreadItsIndices) {
  const int gx = 3, gy = 2, bx = 5, by = 4;
  std::vector<int> out(gx * gy * bx * by, -1);
  ASSERT_EQ(probe::indices(gx, gy, bx, by, out.data()), cudaSuccess)
      << lamp_emu::last_launch_message();
  for (int y = 0; y < gy; ++y) {
    for (int x = 0; x < gx; ++x) {
      for (int ty = 0; ty < by; ++ty) {
        for (int tx = 0; tx < bx; ++tx) {
          const int at = ((y * gx + x) * by + ty) * bx + tx;
          EXPECT_EQ(out[at], x + 10 * y + 100 * tx + 1000 * ty) << at;
        }
      }
    }
  }
}

TEST(CudaEmulator, BarrierOrdersAWriteBeforeTheReads) {
  const int blocks = 4, threads = 64;
  std::vector<float> out(blocks * threads, 0.0f);
  ASSERT_EQ(probe::broadcast(blocks, threads, true, out.data()), cudaSuccess);
  for (int i = 0; i < blocks * threads; ++i) {
    EXPECT_EQ(out[i], static_cast<float>(i / threads + 1)) << i;
  }
}

TEST(CudaEmulator, AMissingBarrierGivesWrongValues) {
  // Odd blocks run their threads from the last: their reads come before
  // thread 0's write and see shared memory's garbage (NaN).
  const int blocks = 2, threads = 64;
  std::vector<float> out(blocks * threads, 0.0f);
  ASSERT_EQ(probe::broadcast(blocks, threads, false, out.data()), cudaSuccess);
  int wrong = 0;
  for (int i = 0; i < blocks * threads; ++i) {
    wrong += out[i] == static_cast<float>(i / threads + 1) ? 0 : 1;
  }
  EXPECT_GT(wrong, 0);
  // Block 1's last thread ran first.
  EXPECT_TRUE(std::isnan(out[2 * threads - 1])) << out[2 * threads - 1];
}

TEST(CudaEmulator, AWarpRunsAheadOfTheOthers) {
  // Without the second barrier, thread 0's warp goes on to its next write
  // before the other warps have read: they see the new value.
  const int threads = 128;
  std::vector<float> out(threads, 0.0f);
  ASSERT_EQ(probe::reuse(threads, true, out.data()), cudaSuccess);
  for (const float v : out) {
    EXPECT_EQ(v, 1.0f);
  }
  ASSERT_EQ(probe::reuse(threads, false, out.data()), cudaSuccess);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[threads - 1], 2.0f);
}

TEST(CudaEmulator, ShufflesExchangeWithinAWarp) {
  const int threads = 96;
  std::vector<int> out(threads, -1);
  ASSERT_EQ(probe::warp_sum(threads, out.data()), cudaSuccess);
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(out[t], 496) << t; // 0 + 1 + ... + 31 in every lane
  }
}

TEST(CudaEmulator, SharedMemoryStartsAsGarbage) {
  float out = 0.0f;
  ASSERT_EQ(probe::unwritten_shared(&out), cudaSuccess);
  EXPECT_TRUE(std::isnan(out)) << out;
}

TEST(CudaEmulator, AShuffleWaitsForTheLanesThatHaveNotEnded) {
  // CUDA: every lane the mask names that has not exited must reach the
  // shuffle. Lanes that ended are not waited for, but reading one is
  // undefined; a lane waiting at a barrier instead is a divergence.
  std::vector<int> out(32, -1);
  ASSERT_EQ(probe::partial_shuffle(32, 1, false, out.data()), cudaSuccess);
  EXPECT_EQ(lamp_emu::last_launch_message(), "");
  ASSERT_EQ(probe::partial_shuffle(16, 1, false, out.data()), cudaSuccess);
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(out[lane], lane < 16 ? lane ^ 1 : lane) << lane;
  }
  EXPECT_EQ(probe::partial_shuffle(16, 16, false, out.data()),
            cudaErrorLaunchFailure);
  EXPECT_TRUE(Said("a shuffle reads lane 16, which has ended"));
  EXPECT_EQ(probe::partial_shuffle(16, 1, true, out.data()),
            cudaErrorLaunchFailure);
  EXPECT_TRUE(
      Said("16 of warp 0's lanes wait at a shuffle whose mask names "
           "all 32, 16 at __syncthreads"));
}

TEST(CudaEmulator, ABarrierTheWholeBlockDoesNotReachFailsTheLaunch) {
  std::vector<int> out(64, 0);
  EXPECT_EQ(probe::early_exit(out.data()), cudaErrorLaunchFailure);
  EXPECT_TRUE(Said("32 threads wait at __syncthreads, 32 have ended"));
  EXPECT_EQ(probe::split_barrier(out.data()), cudaErrorLaunchFailure);
  EXPECT_TRUE(Said("wait at __syncthreads from different lines"));
}

TEST(CudaEmulator, AnErrorStaysUntilItIsRead) {
  // As CUDA's runtime: a clean launch after a refused one leaves the
  // refusal for cudaGetLastError(), which reads it once.
  EXPECT_EQ(probe::refused_then_clean(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(lamp_emulated_cuda_get_last_error(), cudaSuccess);
}

TEST(CudaEmulator, SharedMemoryPastABlocksShareIsRefused) {
  std::vector<float> out(32, 0.0f);
  // 40 KiB static + 8 KiB dynamic: exactly the 48 KiB a block may take.
  ASSERT_EQ(probe::shared_bytes(8 * 1024, out.data()), cudaSuccess)
      << lamp_emu::last_launch_message();
  for (const float v : out) {
    EXPECT_EQ(v, 3.0f);
  }
  EXPECT_EQ(probe::shared_bytes(8 * 1024 + 4, out.data()),
            cudaErrorInvalidConfiguration);
  EXPECT_TRUE(
      Said("49156 bytes of shared memory (8196 dynamic): at most "
           "49152"));
  EXPECT_EQ(probe::shared_bytes(48 * 1024 + 4, out.data()),
            cudaErrorInvalidConfiguration);
  EXPECT_TRUE(Said("49156 bytes of dynamic shared memory"));
}

TEST(CudaEmulator, BadConfigurationsAreRefused) {
  const std::int64_t before = lamp_emu::launches();
  EXPECT_EQ(probe::empty(1, 1024), cudaSuccess);
  EXPECT_EQ(probe::empty(0, 32), cudaErrorInvalidConfiguration);
  EXPECT_TRUE(Said("grid (0, 1, 1)"));
  EXPECT_EQ(probe::empty(1, 1025), cudaErrorInvalidConfiguration);
  EXPECT_TRUE(Said("block (1025, 1, 1): 1 to 1024 threads"));
  EXPECT_EQ(probe::empty(1, 0), cudaErrorInvalidConfiguration);
  EXPECT_EQ(probe::large_parameters(), cudaErrorInvalidConfiguration);
  EXPECT_TRUE(Said("4100 bytes of parameters: at most 4096"));
  EXPECT_EQ(lamp_emu::launches() - before, 5);
  EXPECT_EQ(lamp_emulated_cuda_get_last_error(), cudaSuccess);
}

} // namespace
