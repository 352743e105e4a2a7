// What a process group does with and without c10d's Gloo backend. Built into
// lamp_tests (Gloo as configured) and, in builds with Gloo, into
// lamp_without_gloo_tests, which links src/distributed/gloo.cpp compiled with
// LAMP_WITH_GLOO=0 in front of lamp: the build without Gloo is tested too.
// LAMP_TEST_EXPECT_GLOO says which of the two this program is.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <string>

#include "lamp/distributed.h"
#include "test_util.h"

#ifndef LAMP_TEST_EXPECT_GLOO
#error "tests/CMakeLists.txt defines LAMP_TEST_EXPECT_GLOO to 0 or 1"
#endif

namespace {

using lamp::distributed::Environment;
using lamp::distributed::ProcessGroup;
using lamp::distributed::ProcessGroupOptions;
using lamp_test::expect_error;

const char* const kNoGloo =
    "this lamp was built without Gloo (no gloo headers were found at build time); install libgloo-dev and rebuild, or use nccl on CUDA";

TEST(Gloo, AvailableAsConfigured) {
  EXPECT_EQ(lamp::distributed::gloo_available(), LAMP_TEST_EXPECT_GLOO != 0);
}

TEST(Gloo, OneProcessRunsWithOrWithoutIt) {
  auto group = ProcessGroup::create(Environment{}, torch::kCPU);
  EXPECT_FALSE(group->is_distributed());
  EXPECT_EQ(group->backend(), "none");
  auto t = torch::tensor({1.0f, 2.0f});
  group->all_reduce_(t);
  group->broadcast_(t);
  group->barrier();
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.0f, 2.0f})));
}

TEST(Gloo, AskedForByNameFailsWithoutIt) {
  const auto create = [] {
    ProcessGroup::create(Environment{}, torch::kCPU,
                         ProcessGroupOptions().backend("gloo"));
  };
  if (lamp::distributed::gloo_available()) {
    create(); // one process: nothing to set up
  } else {
    expect_error(
        create,
        "cannot use Gloo for backend 'gloo' on cpu with WORLD_SIZE=1: " +
            std::string(kNoGloo));
  }
}

TEST(Gloo, AutoOnTheCpuWithTwoRanksFailsAtOnceWithoutIt) {
  if (lamp::distributed::gloo_available()) {
    GTEST_SKIP()
        << "Gloo is built in: the two-rank tests (label distributed) run it";
  }
  Environment env;
  env.world_size = 2;
  env.master_port = 1; // never reached: the check comes before the rendezvous
  const auto start = std::chrono::steady_clock::now();
  expect_error(
      [&] {
        ProcessGroup::create(
            env, torch::kCPU,
            ProcessGroupOptions().timeout(std::chrono::seconds(60)));
      },
      "cannot use Gloo for backend 'auto' on cpu with WORLD_SIZE=2: " +
          std::string(kNoGloo));
  EXPECT_LT(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      10.0);
}

} // namespace
