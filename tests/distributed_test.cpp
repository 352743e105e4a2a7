#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "lamp/data/loader.h"
#include "lamp/distributed.h"

namespace {

using lamp::distributed::Environment;
using lamp::distributed::ProcessGroup;

// Sets torchrun's variables for one test and restores them after.
struct ScopedEnv {
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars) {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT"}) {
      unsetenv(name);
    }
    for (const auto& v : vars)
      setenv(v.first.c_str(), v.second.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT"}) {
      unsetenv(name);
    }
  }
};

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL() << "no error; expected one mentioning '" << part << "'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Environment, AbsentMeansSingleProcess) {
  ScopedEnv env({});
  EXPECT_FALSE(Environment::from_env().has_value());
  auto group = ProcessGroup::from_environment(torch::kCPU);
  EXPECT_EQ(group->world_size(), 1);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_FALSE(group->is_distributed());
  EXPECT_TRUE(group->is_main());
  EXPECT_EQ(group->backend(), "none");
  auto t = torch::tensor({1.0f, 2.0f});
  group->all_reduce_(t); // one process: unchanged
  EXPECT_TRUE(torch::equal(t, torch::tensor({1.0f, 2.0f})));
  group->barrier();
}

TEST(Environment, ReadsTorchrunsVariables) {
  ScopedEnv env({{"RANK", "3"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "29600"}});
  const auto e = Environment::from_env();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world_size, 8);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world_size, 2);
  EXPECT_EQ(e->master_addr, "node0");
  EXPECT_EQ(e->master_port, 29600);
}

TEST(Environment, RejectsPartialOrMalformedVariables) {
  {
    ScopedEnv env({{"RANK", "0"}, {"LOCAL_RANK", "0"}});
    expect_error([] { Environment::from_env(); }, "WORLD_SIZE is not");
  }
  {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
    expect_error([] { Environment::from_env(); },
                 "must be smaller than WORLD_SIZE");
  }
  {
    ScopedEnv env({{"RANK", "x"}, {"WORLD_SIZE", "2"}});
    expect_error([] { Environment::from_env(); }, "RANK='x'");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
    expect_error([] { Environment::from_env(); }, "MASTER_ADDR or MASTER_PORT");
  }
  {
    ScopedEnv env({{"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "70000"}});
    expect_error([] { Environment::from_env(); }, "not a TCP port");
  }
}

TEST(ProcessGroup, AMissingRankFailsWithinTheTimeout) {
  // Rank 0 of 2 alone: the rendezvous gives up after the timeout with an
  // error naming the address, instead of waiting forever.
  if (!lamp::distributed::gloo_available()) {
    GTEST_SKIP()
        << "the CPU rendezvous needs Gloo; without it Gloo.AutoOnTheCpuWithTwoRanksFailsAtOnceWithoutIt applies";
  }
  Environment env;
  env.world_size = 2;
  env.master_port = 20000 + static_cast<int>(std::rand() % 40000);
  const auto start = std::chrono::steady_clock::now();
  expect_error(
      [&] {
        ProcessGroup::create(env, torch::kCPU,
                             lamp::distributed::ProcessGroupOptions().timeout(
                                 std::chrono::seconds(2)));
      },
      "could not join the process group at 127.0.0.1:");
  EXPECT_LT(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      30.0);
}

TEST(ProcessGroup, RejectsABackendThatDoesNotFitTheDevice) {
  Environment env;
  expect_error(
      [&] {
        ProcessGroup::create(
            env, torch::kCPU,
            lamp::distributed::ProcessGroupOptions().backend("mpi"));
      },
      "unknown backend 'mpi'");
  expect_error(
      [&] {
        ProcessGroup::create(
            env, torch::kCPU,
            lamp::distributed::ProcessGroupOptions().backend("nccl"));
      },
      "NCCL backend communicates CUDA tensors");
}

lamp::data::Dataset numbered(int64_t n) {
  lamp::data::Dataset d;
  d.images = torch::zeros({n, 1, 2, 2}, torch::kUInt8);
  d.labels = torch::arange(n, torch::kLong); // the label is the sample id
  return d;
}

std::vector<int64_t> epoch_ids(lamp::data::DeviceLoader& loader,
                               int64_t epoch) {
  loader.set_epoch(epoch);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    const auto labels = loader.batch(i).labels;
    for (int64_t k = 0; k < labels.size(0); ++k)
      ids.push_back(labels[k].item<int64_t>());
  }
  return ids;
}

TEST(DeviceLoaderShards, DisjointCoveringEqualSizedAndReshuffledPerEpoch) {
  const int64_t n = 103, shards = 4; // 103 = 4 * 26 - 1: one padded sample
  const auto data = numbered(n);
  std::vector<std::vector<int64_t>> epoch0, epoch1;
  for (int64_t s = 0; s < shards; ++s) {
    lamp::data::DeviceLoader loader(
        data, torch::kCPU,
        lamp::data::LoaderOptions(8).seed(5).num_shards(shards).shard(s));
    EXPECT_EQ(loader.samples_per_epoch(), 26);
    epoch0.push_back(epoch_ids(loader, 0));
    epoch1.push_back(epoch_ids(loader, 1));
    EXPECT_EQ(epoch0.back().size(), 26u);
    EXPECT_NE(epoch0.back(), epoch1.back())
        << "shard " << s << " not reshuffled";
  }
  for (const auto* epoch : {&epoch0, &epoch1}) {
    std::multiset<int64_t> all;
    for (const auto& shard : *epoch)
      all.insert(shard.begin(), shard.end());
    std::set<int64_t> distinct(all.begin(), all.end());
    EXPECT_EQ(distinct.size(), static_cast<size_t>(n)); // covers the dataset
    EXPECT_EQ(all.size(), static_cast<size_t>(n + 1));  // one padded repeat
  }
  // The shards of one epoch are disjoint but for that repeat.
  std::multiset<int64_t> a(epoch0[0].begin(), epoch0[0].end());
  for (int64_t s = 1; s < shards; ++s) {
    for (auto id : epoch0[s])
      a.insert(id);
  }
  int64_t repeated = 0;
  for (int64_t id = 0; id < n; ++id)
    repeated += a.count(id) > 1;
  EXPECT_EQ(repeated, 1);
}

TEST(DeviceLoaderShards, RejectsBadShards) {
  const auto data = numbered(10);
  expect_error(
      [&] {
        lamp::data::DeviceLoader(
            data, torch::kCPU,
            lamp::data::LoaderOptions(4).num_shards(2).shard(2));
      },
      "must be in [0, num_shards = 2)");
  expect_error(
      [&] {
        lamp::data::DeviceLoader(data, torch::kCPU,
                                 lamp::data::LoaderOptions(4).num_shards(11));
      },
      "would leave some empty");
}

} // namespace
