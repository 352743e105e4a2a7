// One rank of the two-process data-parallel tests; tests/CMakeLists.txt
// starts two of these through run_ranks.sh (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT as torchrun sets them), each running the same test.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distributed/process_group_seam.h"
#include "lamp/amp/grad_scaler.h"
#include "lamp/amp/train_step.h"
#include "lamp/distributed.h"
#include "lamp/models/mnist_cnn.h"
#include "lamp/nn/float8.h"
#include "lamp/nn/linear.h"
#include "lamp/optim/clip.h"
#include "lamp/training/checkpoint_weights.h"
#include "platform/archive.h"
#include "platform/compat.h"
#include "sharded_state.h"
#include "test_util.h"
#include "trainer_util.h"
#include "training/shard_files.h"

namespace {

using lamp::distributed::ProcessGroup;
using lamp::distributed::ProcessGroupOptions;
using lamp_test::AllClose;
using lamp_test::BitEqual;
using lamp_test::expect_same_state;
using lamp_test::gathered_state;
using lamp_test::LoadFailsLast;

std::shared_ptr<ProcessGroup> group(
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto g = ProcessGroup::from_environment(
      torch::kCPU, ProcessGroupOptions().timeout(timeout));
  EXPECT_EQ(g->world_size(), 2) << "run through run_ranks.sh 2";
  EXPECT_EQ(g->backend(), "gloo");
  return g;
}

// Rank 0's copy of `t`, on every rank.
torch::Tensor from_rank0(ProcessGroup& g, const torch::Tensor& t) {
  auto copy = t.detach().clone();
  g.broadcast_(copy, 0);
  return copy;
}

lamp::OptimizerFactory sgd() {
  return [](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(
        std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9));
  };
}

// Two ranks on the two halves of a batch end with the parameters of one
// process trained on the whole batch, identical on both ranks.
void expect_matches_one_process(lamp::Precision precision,
                                lamp::distributed::DataParallelOptions dp,
                                double rtol, double atol, int64_t min_buckets) {
  auto g = group();
  torch::manual_seed(0);
  lamp::models::MnistCNN replica;
  torch::manual_seed(0);
  lamp::models::MnistCNN reference;
  if (g->rank() == 1) {
    // A different start on rank 1: the broadcast must replace it.
    torch::NoGradGuard no_grad;
    for (auto& p : replica->parameters())
      p.add_(1.0);
  }
  lamp::TrainStep distributed_step(
      replica.ptr(), sgd(),
      lamp::TrainStepOptions(precision).gradient_sync(
          lamp::distributed::data_parallel(g, dp)));
  lamp::TrainStep single_step(reference.ptr(), sgd(),
                              lamp::TrainStepOptions(precision));
  auto* data_parallel = dynamic_cast<lamp::distributed::DataParallel*>(
      distributed_step.gradient_sync());
  ASSERT_NE(data_parallel, nullptr);
  EXPECT_GE(data_parallel->bucket_count(), min_buckets);

  torch::manual_seed(1);
  const auto images = torch::randn({16, 1, 28, 28});
  const auto labels = torch::randint(0, 10, {16}, torch::kLong);
  const auto half = images.narrow(0, 8 * g->rank(), 8);
  const auto half_labels = labels.narrow(0, 8 * g->rank(), 8);
  for (int step = 0; step < 5; ++step) {
    distributed_step.step([&] {
      return torch::nll_loss(
          replica->forward(distributed_step.cast_input(half)).to(torch::kFloat),
          half_labels);
    });
    single_step.step([&] {
      return torch::nll_loss(
          reference->forward(single_step.cast_input(images)).to(torch::kFloat),
          labels);
    });
  }
  const auto mine = replica->parameters();
  const auto expected = reference->parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(BitEqual(mine[i], from_rank0(*g, mine[i])))
        << "parameter " << i;
    EXPECT_TRUE(AllClose(mine[i], expected[i], rtol, atol))
        << "parameter " << i;
  }
}

TEST(TwoRanks, MatchOneProcessOnTheWholeBatch) {
  // FP32: only the order of the sums differs (the mean over 16 samples vs
  // the mean of two means over 8, and the convolutions' reductions); after 5
  // steps that stays within a few FP32 ulps of the weights' size.
  expect_matches_one_process(lamp::Precision::kFP32, {}, 1e-5, 1e-6, 1);
}

TEST(TwoRanks, SeveralBucketsGiveTheSameResult) {
  // 0.02 MiB buckets split the 28,938 parameters (113 KiB) into several.
  expect_matches_one_process(
      lamp::Precision::kFP32,
      lamp::distributed::DataParallelOptions().bucket_cap_mb(0.02), 1e-5, 1e-6,
      3);
}

// With accumulation (set_sync(false) for the first micro-batch), a
// parameter whose gradient came in the first micro-batch but not in the
// synced last one (a branch it did not take) keeps what it accumulated,
// averaged over the ranks as one process would have it, not zeroed.
TEST(TwoRanks, AGradientAccumulatedBeforeTheLastMicroBatchIsKept) {
  auto g = group();
  auto model = std::make_shared<torch::nn::Module>();
  auto a = model->register_parameter("a", torch::ones({3}));
  auto b = model->register_parameter("b", torch::ones({2}));
  auto unused = model->register_parameter("unused", torch::ones({2}));
  lamp::distributed::DataParallel dp(model, g);
  const double r = g->rank() + 1;
  dp.before_forward();
  dp.set_sync(false);
  ((a * r).sum() + (b * (10 * r)).sum()).backward();
  dp.set_sync(true);
  dp.before_forward();
  (a * r).sum().backward();
  dp.finish_gradient_sync();
  // a: 2r on rank r, b: 10r; their means over ranks 1 and 2: 3 and 15,
  // exact in FP32. `unused` has none anywhere: zero.
  EXPECT_TRUE(BitEqual(a.grad(), torch::full({3}, 3.0f)));
  EXPECT_TRUE(BitEqual(b.grad(), torch::full({2}, 15.0f)));
  EXPECT_TRUE(BitEqual(unused.grad(), torch::zeros({2})));
}

TEST(TwoRanks, Bf16ModelAndBf16CommunicationStayClose) {
  // bf16: BF16 weights and gradients (communicated in BF16) with FP32
  // masters. Both runs round to BF16 in different places (the half-batch
  // gradients and their average vs the whole-batch gradient), so they agree
  // to BF16's precision (2^-8 relative) rather than bit for bit.
  expect_matches_one_process(lamp::Precision::kBF16, {}, 2e-2, 2e-3, 1);
}

TEST(TwoRanks, InfOnOneRankSkipsTheStepOnBoth) {
  auto g = group();
  auto w = torch::ones({4}, torch::requires_grad());
  torch::optim::SGD optimizer({w}, torch::optim::SGDOptions(0.1));
  lamp::GradScaler scaler(lamp::GradScalerOptions().init_scale(1024.0));
  scaler.set_found_inf_reduction(lamp::distributed::found_inf_reduction(g));
  // Step 1: rank 1's gradient has an inf, rank 0's is finite. No gradient
  // all-reduce here: only the scaler's flag can tell rank 0.
  scaler.scale((w * 2).sum()).backward();
  if (g->rank() == 1) {
    torch::NoGradGuard no_grad;
    w.mutable_grad()[0] = std::numeric_limits<float>::infinity();
  }
  EXPECT_FALSE(scaler.step(optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_TRUE(BitEqual(w.detach(), torch::ones({4})));
  // Step 2: finite everywhere: both step, identically.
  optimizer.zero_grad();
  scaler.scale((w * 2).sum()).backward();
  EXPECT_TRUE(scaler.step(optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_TRUE(BitEqual(w.detach(), torch::full({4}, 0.8f)));
  EXPECT_EQ(scaler.steps_skipped(), 1);
}

TEST(TwoRanks, BroadcastsRankZerosBuffersBeforeForward) {
  auto g = group();
  torch::manual_seed(g->rank()); // different weights and buffers per rank
  lamp_test::SmallNet net;
  lamp::distributed::DataParallel dp(net.ptr(), g);
  for (const auto& p : net->parameters()) {
    EXPECT_TRUE(BitEqual(p, from_rank0(*g, p)));
  }
  {
    torch::NoGradGuard no_grad;
    net->bn1->running_mean.fill_(static_cast<float>(g->rank() + 1));
  }
  dp.before_forward();
  EXPECT_TRUE(BitEqual(net->bn1->running_mean, torch::ones({8})));
}

TEST(TwoRanks, BroadcastsRankZerosFrozenParameters) {
  // A frozen layer initialised from each rank's own seed starts as rank 0's
  // on every rank, as the trained ones do; it is still not reduced.
  auto g = group();
  torch::manual_seed(g->rank());
  lamp_test::SmallNet net;
  net->conv1->weight.requires_grad_(false);
  // A cap below every parameter's size: one bucket per reduced parameter.
  lamp::distributed::DataParallel dp(
      net.ptr(), g,
      lamp::distributed::DataParallelOptions().bucket_cap_mb(1e-6));
  for (const auto& p : net->named_parameters()) {
    EXPECT_TRUE(BitEqual(p.value(), from_rank0(*g, p.value()))) << p.key();
  }
  EXPECT_FALSE(net->conv1->weight.requires_grad());
  EXPECT_EQ(dp.bucket_count(),
            static_cast<int64_t>(net->parameters().size()) - 1);
}

// The message of `f`'s c10::Error; fails the test without one.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(TwoRanks, CheckSameNamesTheFirstDifferenceOnEveryRank) {
  auto g = group();
  // The same settings in another order agree.
  std::vector<lamp::distributed::RankSetting> same = {{"--epochs", "3"},
                                                      {"--model", "cnn"}};
  if (g->rank() == 1) {
    std::swap(same[0], same[1]);
  }
  g->check_same("the flags", same);
  // A value that differs is named with each rank's value, on both ranks;
  // names and values may hold the encoding's separator.
  const auto lr = g->rank() == 0 ? "0.1" : "0.2:3";
  const auto message = error_of([&] {
    g->check_same("the flags",
                  {{"--epochs", "3"}, {"--lr", lr}, {"--seed", lr}},
                  "Start every rank alike.");
  });
  EXPECT_NE(message.find("the ranks differ in the flags: --lr is 0.1 on rank 0 "
                         "and 0.2:3 on rank 1 (2 ranks at 127.0.0.1:"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Start every rank alike."), std::string::npos);
  // A setting only one rank has.
  std::vector<lamp::distributed::RankSetting> partial = {{"--epochs", "3"}};
  if (g->rank() == 1) {
    partial.emplace_back("--checkpoint", "given");
  }
  const auto absent = error_of([&] { g->check_same("the flags", partial); });
  EXPECT_NE(
      absent.find("--checkpoint is (absent) on rank 0 and given on rank 1"),
      std::string::npos)
      << absent;
  g->barrier(); // the group still works after a refusal
}

TEST(TwoRanks, DataParallelRefusesAModelThatDiffersBeforeBroadcasting) {
  auto g = group();
  torch::manual_seed(0);
  // Rank 1 has two more classes: a broadcast of rank 0's weights would
  // fail inside Gloo on the sizes.
  lamp_test::SmallNet net(g->rank() == 0 ? 4 : 6);
  const auto message =
      error_of([&] { lamp::distributed::DataParallel dp(net.ptr(), g); });
  EXPECT_NE(
      message.find("the ranks differ in the model given to DataParallel: "
                   "parameter fc.weight is Float [4, 16], trained on rank 0 "
                   "and Float [6, 16], trained on rank 1"),
      std::string::npos)
      << message;
  // Options too: another bucket size means another bucket order.
  lamp_test::SmallNet same;
  const auto options = lamp::distributed::DataParallelOptions().bucket_cap_mb(
      g->rank() == 0 ? 25.0 : 1.0);
  const auto cap = error_of(
      [&] { lamp::distributed::DataParallel dp(same.ptr(), g, options); });
  EXPECT_NE(cap.find("DataParallelOptions::bucket_cap_mb is 25 on rank 0 and 1 "
                     "on rank 1"),
            std::string::npos)
      << cap;
}

TEST(TwoRanks, TrainStepRefusesReplicasWithDifferentOptions) {
  auto g = group();
  torch::manual_seed(0);
  lamp::models::MnistCNN model;
  const auto message = error_of([&] {
    lamp::TrainStep step(
        model.ptr(), sgd(),
        lamp::TrainStepOptions(lamp::Precision::kFP32)
            .accumulation_steps(g->rank() == 0 ? 1 : 2)
            .gradient_sync(lamp::distributed::data_parallel(g)));
  });
  EXPECT_NE(message.find("the ranks differ in the TrainStep options: "
                         "TrainStepOptions::accumulation_steps is 1 on rank 0 "
                         "and 2 on rank 1"),
            std::string::npos)
      << message;
}

// Delayed FP8 scaling in a data-parallel TrainStep: rank 1's inputs are 4x
// rank 0's, yet after each step both ranks hold the scales of the larger
// amaxes (agreed with one MAX all-reduce), and the same weights. Ranks that
// differ in the recipe are refused before the first step.
TEST(TwoRanks, Float8AmaxesAreAgreedOverTheRanks) {
#if LAMP_TORCH_FLOAT8
  auto g = group();
  torch::manual_seed(0);
  torch::nn::Linear first(32, 32), second(32, 16);
  torch::nn::Sequential model(first, second);
  const auto recipe = lamp::nn::Float8Recipe()
                          .scaling(lamp::nn::Float8Scaling::kDelayed)
                          .amax_history_len(4);
  lamp::TrainStep step(model.ptr(), sgd(),
                       lamp::TrainStepOptions(lamp::Precision::kAMPBF16)
                           .float8(recipe)
                           .gradient_sync(lamp::distributed::data_parallel(g)));
  torch::manual_seed(1);
  for (int i = 0; i < 3; ++i) {
    const auto x = torch::randn({16, 32}) * (g->rank() == 0 ? 1.0 : 4.0);
    torch::Tensor second_input;
    step.step([&] {
      auto h = torch::relu(lamp::nn::linear(x, first));
      second_input = h.detach();
      return lamp::nn::linear(h, second).to(torch::kFloat).square().mean();
    });
    // Rank 1's input amax is the larger one: both ranks hold its scale.
    auto* state = lamp::nn::float8_state(*first);
    const auto scale = state->scale.clone();
    EXPECT_TRUE(BitEqual(scale, from_rank0(*g, scale))) << "step " << i;
    auto x_amax = x.abs().max().reshape({1});
    g->all_reduce_(x_amax, lamp::distributed::ReduceOp::kMax);
    EXPECT_TRUE(AllClose(state->amax_history.select(1, 0).narrow(0, 0, 1),
                         x_amax, 0, 0));
    // Each layer its own: the second one's input amax, agreed as well.
    auto h_amax = second_input.abs().max().to(torch::kFloat).reshape({1});
    g->all_reduce_(h_amax, lamp::distributed::ReduceOp::kMax);
    const auto* second_state = lamp::nn::float8_state(*second);
    EXPECT_TRUE(AllClose(
        second_state->amax_history.select(1, 0).narrow(0, 0, 1), h_amax, 0, 0))
        << "step " << i;
  }
  for (const auto& p : model->parameters()) {
    EXPECT_TRUE(BitEqual(p.detach(), from_rank0(*g, p)));
  }
  // Another recipe on one rank: refused by name on both.
  torch::nn::Sequential other(torch::nn::Linear(32, 32));
  const auto message = error_of([&] {
    lamp::TrainStep refused(
        other.ptr(), sgd(),
        lamp::TrainStepOptions(lamp::Precision::kAMPBF16)
            .float8(g->rank() == 0 ? recipe
                                   : lamp::nn::Float8Recipe(recipe).margin(1))
            .gradient_sync(lamp::distributed::data_parallel(g)));
  });
  EXPECT_NE(message.find("TrainStepOptions::float8 is delayed scaling, amax "
                         "history 4 (max), margin 0 on rank 0 and delayed "
                         "scaling, amax history 4 (max), margin 1 on rank 1"),
            std::string::npos)
      << message;
#else
  GTEST_SKIP() << "this LibTorch has no float8 types (LibTorch 2.5 or newer)";
#endif
}

TEST(TwoRanks, AFailedBucketAllReduceGivesTheCollectiveMessage) {
  // The asynchronous all-reduce of the gradient buckets fails as the
  // synchronous collectives do: naming the rank, the backend and the cause.
  auto g = group(std::chrono::seconds(5));
  torch::manual_seed(0);
  lamp_test::SmallNet net;
  lamp::distributed::DataParallel dp(net.ptr(), g);
  g->barrier();
  if (g->rank() == 1) {
    std::_Exit(0); // gone without a word, like a crashed rank
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto message = error_of([&] {
    for (int i = 0; i < 20; ++i) {
      dp.before_forward();
      net->forward(torch::randn({2, 3, 8, 8})).sum().backward();
      dp.finish_gradient_sync();
    }
  });
  EXPECT_NE(message.find(" failed on rank 0 of 2 (gloo): "), std::string::npos)
      << message;
  // Its listener refuses: named as gone, not as "probably exited".
  EXPECT_NE(message.find(": nothing listens there (connection refused)): its "
                         "process has ended, killed (by a signal, or by the "
                         "out-of-memory killer: see the system log, dmesg), "
                         "crashed, or done with fewer collectives than this "
                         "rank (the timeout is 5 s"),
            std::string::npos)
      << message;
}

TEST(TwoRanks, AStoppedRankMakesTheOtherFailAfterTheTimeout) {
  // A rank that stops answering (SIGSTOP, a hung node): the other fails
  // once the group's timeout has passed, not after the default 10 minutes.
  auto g = group(std::chrono::seconds(3));
  g->barrier();
  if (g->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(12));
    std::_Exit(0);
  }
  const auto start = std::chrono::steady_clock::now();
  auto t = torch::ones({4});
  const auto message = error_of([&] { g->all_reduce_(t); });
  EXPECT_NE(message.find("all_reduce_ failed on rank 0 of 2"),
            std::string::npos)
      << message;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_GE(seconds, 2.5);
  EXPECT_LT(seconds, 10.0);
}

// A group whose collectives report their waits into `lines` every second.
std::shared_ptr<ProcessGroup> reporting_group(
    std::shared_ptr<std::vector<std::string>> lines,
    std::shared_ptr<std::mutex> mutex, std::chrono::milliseconds timeout) {
  auto g = ProcessGroup::from_environment(
      torch::kCPU, ProcessGroupOptions()
                       .timeout(timeout)
                       .collective_wait_report(std::chrono::seconds(1))
                       .wait_report([lines, mutex](const std::string& line) {
                         std::lock_guard<std::mutex> lock(*mutex);
                         lines->push_back(line);
                       }));
  EXPECT_EQ(g->world_size(), 2) << "run through run_ranks.sh 2";
  return g;
}

std::string joined(const std::vector<std::string>& lines, std::mutex& mutex) {
  std::lock_guard<std::mutex> lock(mutex);
  std::string text;
  for (const auto& line : lines) {
    text += line + "\n";
  }
  return text;
}

TEST(TwoRanks, ACollectiveThatWaitsSaysForWhom) {
  // Rank 1 comes 4.5 s late to an all-reduce: rank 0 says, each second,
  // how long it has waited, where, for whom and until when; the collective
  // then completes, and a healthy one is not reported at all.
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mutex = std::make_shared<std::mutex>();
  auto g = reporting_group(lines, mutex, std::chrono::seconds(20));
  g->barrier();
  auto t = torch::ones({4});
  // The report at 3 s has 1.5 s to come before rank 1 arrives, however
  // late a loaded machine wakes the watch.
  if (g->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(4500));
  }
  g->all_reduce_(t, lamp::distributed::ReduceOp::kSum, "the test's all-reduce");
  EXPECT_TRUE(torch::equal(t, torch::full({4}, 2.0f)));
  for (int i = 0; i < 20; ++i) {
    g->all_reduce_(t);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto text = joined(*lines, *mutex);
  if (g->rank() == 1) {
    EXPECT_EQ(text, "");
    return;
  }
  for (const char* waited : {"1 s", "2 s", "3 s"}) {
    EXPECT_NE(
        text.find(std::string("lamp::distributed: rank 0 of 2 has waited ") +
                  waited +
                  " in the test's all-reduce (collective 1) for rank 1, "
                  "which has not reached it; giving up after 20 s "
                  "(--dist-timeout / ProcessGroupOptions::timeout).\n"),
        std::string::npos)
        << text;
  }
  // One line a second: four, or five where rank 1's barrier was late, or
  // three where rank 0's was.
  const auto count = std::count(text.begin(), text.end(), '\n');
  EXPECT_GE(count, 3) << text;
  EXPECT_LE(count, 5) << text;
  EXPECT_EQ(text.find("all_reduce_"), std::string::npos) << text;
}

TEST(TwoRanks, CollectivesCalledInDifferentOrdersAreNamed) {
  // Rank 0 compares settings while rank 1 is in an all-reduce: each says
  // which collective the other waits in, until the timeout ends both.
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mutex = std::make_shared<std::mutex>();
  auto g = reporting_group(lines, mutex, std::chrono::seconds(5));
  auto t = torch::ones({4});
  const auto message = error_of([&] {
    if (g->rank() == 0) {
      g->check_same("the flags", {{"--lr", "0.1"}});
    } else {
      g->all_reduce_(t, lamp::distributed::ReduceOp::kSum,
                     "the loss's all-reduce");
    }
  });
  EXPECT_NE(message, "");
  const auto text = joined(*lines, *mutex);
  const std::string other =
      g->rank() == 0 ? "; rank 1 waits in collective 0, the loss's all-reduce: "
                       "the ranks call collectives in different orders; "
                     : "; rank 0 waits in collective 0, comparing the flags "
                       "across ranks: the ranks call collectives in different "
                       "orders; ";
  EXPECT_NE(text.find(other), std::string::npos) << text;
}

TEST(Ranks, AllGatherAndReduceScatterOfShards) {
  // Any number of ranks (run by 2 and by 3): shards of 5 elements, which no
  // world size divides evenly into anything else.
  auto g = ProcessGroup::from_environment(
      torch::kCPU, ProcessGroupOptions().timeout(std::chrono::seconds(60)));
  const int world = g->world_size(), rank = g->rank();
  const int64_t n = 5;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kLong}) {
    auto shard = (torch::arange(n) + 100 * rank).to(dtype);
    auto flat = torch::empty({world * n}, torch::TensorOptions(dtype));
    g->all_gather_(flat, shard);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(BitEqual(flat.narrow(0, r * n, n),
                           (torch::arange(n) + 100 * r).to(dtype)))
          << dtype << " rank " << r;
    }
  }
  const auto expect_reduce_scatter_sums = [&](const std::string& path) {
    for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
      // Small integers: every sum is exact in either dtype.
      auto flat = (torch::arange(world * n) + rank).to(dtype);
      auto shard = torch::empty({n}, torch::TensorOptions(dtype));
      auto flat_again = flat.clone();
      g->reduce_scatter_(shard, flat);
      const auto sum =
          torch::arange(world * n) * world + world * (world - 1) / 2;
      EXPECT_TRUE(BitEqual(shard, sum.narrow(0, rank * n, n).to(dtype)))
          << path << ", " << dtype << ": " << shard;
      // Started, then waited for: the same slice.
      auto later = torch::full({n}, -1, torch::TensorOptions(dtype));
      auto work = g->reduce_scatter_async_(later, flat_again);
      work->wait();
      EXPECT_TRUE(BitEqual(later, shard))
          << path << ", " << dtype << ": " << later;
    }
  };
  expect_reduce_scatter_sums("the backend's path");
  // Gloo has its own reduce-scatter from LibTorch 2.x; 1.13's all-reduces.
  EXPECT_EQ(g->has_reduce_scatter(), TORCH_VERSION_MAJOR >= 2);
  // The all-reduce fallback, on every LibTorch.
  lamp::detail::ProcessGroupSeam::use_all_reduce_for_reduce_scatter(*g);
  EXPECT_FALSE(g->has_reduce_scatter());
  expect_reduce_scatter_sums("the all-reduce fallback");
  auto flat = torch::zeros({world * n});
  auto shard = torch::zeros({n + 1});
  EXPECT_NE(error_of([&] { g->reduce_scatter_(shard, flat); })
                .find("flat has " + std::to_string(world * n) +
                      " elements but must have world_size (" +
                      std::to_string(world) + ") times the shard's 6"),
            std::string::npos);
  auto half_shard = torch::zeros({n}, torch::kHalf);
  EXPECT_NE(error_of([&] {
              g->all_gather_(flat, half_shard);
            }).find("flat is Float but the shard Half"),
            std::string::npos);
}

std::shared_ptr<ProcessGroup> any_group() {
  return ProcessGroup::from_environment(
      torch::kCPU, ProcessGroupOptions().timeout(std::chrono::seconds(60)));
}

TEST(Ranks, GroupAgreeStopsEveryRankAtOnce) {
  // ProcessGroup::agree, as a trainer of one's own calls it around reading
  // its data: a c10::Error on the last rank (a node without the file) is
  // that rank's own message, without the backtrace, and on every other rank
  // a message naming it; two failed ranks are both named, with the first
  // one's reason. Nothing waits for the timeout.
  auto g = any_group();
  const int n = g->world_size();
  const int last = n - 1;
  const auto message = [&](const std::function<void()>& work) {
    try {
      g->agree("reading the data", work);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("(no error)");
  };
  const auto one = message([&] {
    TORCH_CHECK(g->rank() != last, "no such file: /data/train.bin.");
  });
  EXPECT_EQ(one, g->rank() == last
                     ? "no such file: /data/train.bin."
                     : "lamp: rank " + std::to_string(last) +
                           " failed in reading the data: no such file: "
                           "/data/train.bin (rank " +
                           std::to_string(g->rank()) + " stops too).");
  // Every rank but 0 fails, each with its own reason: rank 0 names them
  // all and the first one's reason.
  const auto many = message([&] {
    TORCH_CHECK(g->rank() == 0, "rank ", g->rank(), "'s disk is full");
  });
  std::string failed;
  for (int r = 1; r < n; ++r) {
    failed += (r > 1 ? ", " : "") + std::to_string(r);
  }
  EXPECT_EQ(many, g->rank() == 0 ? "lamp: rank " + failed +
                                       " failed in reading the data: rank 1's "
                                       "disk is full (rank 0 stops too)."
                                 : "rank " + std::to_string(g->rank()) +
                                       "'s disk is full");
  // Work that succeeds everywhere runs once on each rank and returns.
  int ran = 0;
  EXPECT_EQ(message([&] { ++ran; }), "(no error)");
  EXPECT_EQ(ran, 1);
  g->barrier(); // the group still works after the refusals
}

using ShardFactory = lamp::distributed::ShardedOptimizer::Factory;

ShardFactory sgd_momentum() {
  return [](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(
        std::move(params),
        torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  };
}

ShardFactory adamw() {
  return [](std::vector<torch::Tensor> params) {
    return std::make_unique<torch::optim::AdamW>(
        std::move(params), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  };
}

TEST(Ranks, ShardedOptimizerMatchesTheReplicatedOneAndHoldsItsShare) {
  // The same batches on every rank (the gradients need no averaging): five
  // steps of the sharded optimizer end where the whole optimizer on every
  // rank ends, and each rank holds 1/N of the weights, gradients and state.
  auto g = any_group();
  const int world = g->world_size();
  struct Case {
    const char* name;
    ShardFactory make;
    int state_tensors; // per element: momentum, or Adam's two moments
  };
  for (const Case& c :
       {Case{"sgd", sgd_momentum(), 1}, Case{"adamw", adamw(), 2}}) {
    torch::manual_seed(0);
    lamp_test::SmallNet sharded_net;
    torch::manual_seed(0);
    lamp_test::SmallNet whole_net;
    lamp::distributed::ShardedOptimizer sharded(sharded_net->parameters(),
                                                c.make, g);
    auto whole = c.make(whole_net->parameters());
    torch::manual_seed(1);
    for (int step = 0; step < 5; ++step) {
      const auto images = torch::randn({4, 3, 8, 8});
      const auto labels = torch::randint(0, 4, {4}, torch::kLong);
      sharded.zero_grad();
      torch::cross_entropy_loss(sharded_net->forward(images), labels)
          .backward();
      sharded.step();
      whole->zero_grad();
      torch::cross_entropy_loss(whole_net->forward(images), labels).backward();
      whole->step();
    }
    const auto mine = sharded_net->parameters();
    const auto expected = whole_net->parameters();
    int64_t numel = 0;
    for (size_t i = 0; i < mine.size(); ++i) {
      numel += mine[i].numel();
      // Every rank the same bits; against the whole optimizer, the same
      // elementwise arithmetic on other tensor boundaries (a vectorised
      // loop's tail may contract a multiply-add: 1e-6 relative).
      EXPECT_TRUE(BitEqual(mine[i], from_rank0(*g, mine[i])))
          << c.name << " parameter " << i;
      EXPECT_TRUE(AllClose(mine[i], expected[i], 1e-5, 1e-6))
          << c.name << " parameter " << i << ": max difference "
          << (mine[i] - expected[i]).abs().max().item<double>();
    }
    // FP32 weights and gradient, plus the state, for this rank's shard.
    const int64_t shard = (numel + world - 1) / world;
    ASSERT_EQ(sharded.layouts().size(), 1u);
    EXPECT_EQ(sharded.layouts()[0].shard_numel(), shard);
    EXPECT_EQ(sharded.state_bytes(), shard * 4 * (2 + c.state_tensors))
        << c.name;
  }
}

TEST(Ranks, ShardedOptimizerStepsAParameterWithoutAGradientAsZero) {
  // A parameter that gets no gradient in a step (a branch the step did not
  // use) is stepped with a zero gradient, as data-parallel training gives
  // it: momentum and weight decay go on, the shard does not keep the
  // gradient of the step before. The whole optimizer, given that zero
  // gradient, is the reference.
  auto g = any_group();
  for (const auto& [name, make] :
       std::vector<std::pair<std::string, ShardFactory>>{
           {"sgd", sgd_momentum()}, {"adamw", adamw()}}) {
    torch::nn::Sequential nets[2];
    for (auto& net : nets) {
      torch::manual_seed(4);
      net = torch::nn::Sequential(torch::nn::Linear(6, 5),
                                  torch::nn::Linear(5, 3));
    }
    lamp::distributed::ShardedOptimizer sharded(nets[0]->parameters(), make, g);
    auto whole = make(nets[1]->parameters());
    torch::manual_seed(5);
    for (int step = 0; step < 5; ++step) {
      const auto x = torch::randn({4, 6});
      // Odd steps train the first layer alone: the second gets no gradient.
      const auto loss = [&](torch::nn::Sequential& net) {
        const auto hidden = net[0]->as<torch::nn::Linear>()->forward(x);
        return step % 2 == 0 ? net[1]
                                   ->as<torch::nn::Linear>()
                                   ->forward(hidden)
                                   .pow(2)
                                   .mean()
                             : hidden.pow(2).mean();
      };
      sharded.zero_grad();
      loss(nets[0]).backward();
      sharded.step();
      whole->zero_grad();
      loss(nets[1]).backward();
      for (auto& p : nets[1]->parameters()) {
        if (!p.grad().defined()) {
          p.mutable_grad() = torch::zeros_like(p);
        }
      }
      whole->step();
    }
    const auto mine = nets[0]->parameters();
    const auto expected = nets[1]->parameters();
    for (size_t i = 0; i < mine.size(); ++i) {
      // As in ShardedOptimizerMatchesTheReplicatedOneAndHoldsItsShare.
      EXPECT_TRUE(AllClose(mine[i], expected[i], 1e-5, 1e-6))
          << name << " parameter " << i << ": max difference "
          << (mine[i] - expected[i]).abs().max().item<double>();
    }
  }
}

TEST(Ranks, ShardedOptimizerKeepsFp32MastersOfBf16Parameters) {
  // BF16 and FP32 parameters side by side: one shard per dtype, FP32
  // masters for both, the BF16 weights the masters' rounding, as with
  // MasterWeights on one process.
  auto g = any_group();
  torch::manual_seed(3);
  std::vector<torch::Tensor> params{
      torch::randn({7, 3}).to(torch::kBFloat16).set_requires_grad(true),
      torch::randn({5}).set_requires_grad(true),
      torch::randn({11}).to(torch::kBFloat16).set_requires_grad(true)};
  std::vector<torch::Tensor> masters;
  for (const auto& p : params) {
    // A copy even of the FP32 one (to() would return the parameter itself).
    masters.push_back(
        p.detach().to(torch::kFloat).clone().set_requires_grad(true));
  }
  lamp::distributed::ShardedOptimizer sharded(params, adamw(), g);
  auto whole = adamw()(masters);
  EXPECT_EQ(sharded.shards().size(), 2u);
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      const auto grad = torch::randn(params[i].sizes());
      params[i].mutable_grad() = grad.to(params[i].scalar_type());
      masters[i].mutable_grad() = params[i].grad().to(torch::kFloat);
    }
    sharded.step();
    whole->step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(AllClose(
        params[i].to(torch::kFloat),
        masters[i].detach().to(params[i].scalar_type()).to(torch::kFloat), 1e-2,
        1e-3))
        << "parameter " << i;
  }
  // The FP32 masters themselves: this rank's pieces against the whole.
  for (size_t k = 0; k < sharded.layouts().size(); ++k) {
    const std::vector<size_t> members =
        k == 0 ? std::vector<size_t>{0, 2} : std::vector<size_t>{1};
    for (const auto& piece : sharded.layouts()[k].pieces(g->rank())) {
      const auto got = sharded.shards()[k].detach().narrow(
          0, piece.shard_offset, piece.length);
      const auto want =
          masters[members[piece.tensor]].detach().reshape(-1).narrow(
              0, piece.tensor_offset, piece.length);
      EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-6)) << "group " << k;
    }
  }
}

TEST(Ranks, ShardedOptimizerRefusesRanksWithOtherParameters) {
  auto g = any_group();
  std::vector<torch::Tensor> params{torch::zeros({4}, torch::requires_grad())};
  if (g->rank() == 1) {
    params.push_back(torch::zeros({2}, torch::requires_grad()));
  }
  const auto message = error_of(
      [&] { lamp::distributed::ShardedOptimizer(params, sgd_momentum(), g); });
  EXPECT_NE(message.find("the ranks differ in the parameters of the "
                         "sharded optimizer: parameter 1 is (absent) on rank"),
            std::string::npos)
      << message;
}

// A weight tied between two modules, given twice (Module::parameters()):
// refused on every rank, naming both places and lamp::unique_parameters.
TEST(Ranks, ShardedOptimizerRefusesATiedWeightTwice) {
  auto g = any_group();
  const auto tied = torch::zeros({4}, torch::requires_grad());
  const std::vector<torch::Tensor> params{
      tied, torch::zeros({2}, torch::requires_grad()), tied};
  const auto message = error_of(
      [&] { lamp::distributed::ShardedOptimizer(params, sgd_momentum(), g); });
  EXPECT_NE(message.find("parameter 2 is parameter 0 again (a weight tied "
                         "between two modules"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("lamp::unique_parameters(*model)"), std::string::npos)
      << message;
}

// AdamW with a GPT recipe's param groups: weight decay and a learning rate
// of their own for the matrices and kernels, none and half the rate for the
// rest.
std::unique_ptr<torch::optim::AdamW> grouped_adamw(
    const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
  for (const auto& p : params) {
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  using torch::optim::AdamWOptions;
  return std::make_unique<torch::optim::AdamW>(
      std::vector<torch::optim::OptimizerParamGroup>{
          {decay, std::make_unique<AdamWOptions>(
                      AdamWOptions(1e-2).weight_decay(0.1))},
          {no_decay,
           std::make_unique<AdamWOptions>(AdamWOptions(5e-3).weight_decay(0))}},
      AdamWOptions(1e-3));
}

// One step of SmallNet's loss on the batch `seed` draws, then `step`.
template <typename Step>
void small_net_step(lamp_test::SmallNet& net, uint64_t seed, Step step) {
  torch::manual_seed(seed);
  const auto images = torch::randn({4, 3, 8, 8});
  const auto labels = torch::randint(0, 4, {4}, torch::kLong);
  torch::cross_entropy_loss(net->forward(images), labels).backward();
  step();
}

std::vector<torch::Tensor> copies_of(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> result;
  for (const auto& t : ts) {
    result.push_back(t.detach().clone());
  }
  return result;
}

// The same SmallNet twice: one trained by the sharded optimizer with
// grouped_adamw's groups, the other by the whole optimizer with them.
struct ShardedAndWhole {
  static lamp_test::SmallNet seeded() {
    torch::manual_seed(0);
    return lamp_test::SmallNet();
  }
  explicit ShardedAndWhole(std::shared_ptr<ProcessGroup> g)
      : sharded_net(seeded()),
        whole_net(seeded()),
        sharded(sharded_net->parameters(),
                grouped_adamw(sharded_net->parameters()), std::move(g)),
        whole(grouped_adamw(whole_net->parameters())) {}

  // Every rank's weights the same bits, and the whole optimizer's within
  // 1e-5 relative (as in
  // ShardedOptimizerMatchesTheReplicatedOneAndHoldsItsShare).
  void expect_the_same_weights(ProcessGroup& g) const {
    const auto mine = sharded_net->parameters();
    const auto expected = whole_net->parameters();
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_TRUE(BitEqual(mine[i], from_rank0(g, mine[i])))
          << "parameter " << i;
      EXPECT_TRUE(AllClose(mine[i], expected[i], 1e-5, 1e-6))
          << "parameter " << i << ": max difference "
          << (mine[i] - expected[i]).abs().max().item<double>();
    }
  }

  lamp_test::SmallNet sharded_net;
  lamp_test::SmallNet whole_net;
  lamp::distributed::ShardedOptimizer sharded;
  std::unique_ptr<torch::optim::AdamW> whole;
};

TEST(Ranks, ShardedOptimizerTakesAnOptimizerWithParamGroups) {
  // Five steps of the sharded optimizer with two param groups end where the
  // whole optimizer with the same groups ends on every rank; each group
  // keeps its own options and steps its own shard.
  auto g = any_group();
  ShardedAndWhole pair(g);
  auto& [sharded_net, whole_net, sharded, whole] = pair;
  for (uint64_t step = 0; step < 5; ++step) {
    sharded.zero_grad();
    small_net_step(sharded_net, 10 + step, [&] { sharded.step(); });
    whole->zero_grad();
    small_net_step(whole_net, 10 + step, [&] { whole->step(); });
  }
  pair.expect_the_same_weights(*g);
  int64_t numel[2] = {0, 0};
  for (const auto& p : sharded_net->parameters()) {
    numel[p.dim() >= 2 ? 0 : 1] += p.numel();
  }
  // One FP32 shard per group, which the group steps with its own options.
  auto& groups = sharded.optimizer().param_groups();
  ASSERT_EQ(groups.size(), 2u);
  ASSERT_EQ(sharded.shards().size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    ASSERT_EQ(groups[k].params().size(), 1u);
    EXPECT_TRUE(groups[k].params()[0].is_same(sharded.shards()[k]));
    EXPECT_EQ(sharded.layouts()[k].numel(), numel[k]) << "group " << k;
  }
  const auto& decay =
      static_cast<const torch::optim::AdamWOptions&>(groups[0].options());
  const auto& no_decay =
      static_cast<const torch::optim::AdamWOptions&>(groups[1].options());
  EXPECT_EQ(decay.weight_decay(), 0.1);
  EXPECT_EQ(no_decay.lr(), 5e-3);
  // The optimizer must not have stepped, and must hold the parameters.
  const auto stepped = error_of([&] {
    lamp::distributed::ShardedOptimizer(whole_net->parameters(),
                                        std::move(whole), g);
  });
  EXPECT_NE(stepped.find("the optimizer has state already; shard it before "
                         "its first step"),
            std::string::npos)
      << stepped;
  const auto others = error_of([&] {
    lamp::distributed::ShardedOptimizer(
        {torch::zeros({3}, torch::requires_grad())},
        grouped_adamw(whole_net->parameters()), g);
  });
  EXPECT_NE(others.find("holds a tensor that is not one of the model's "
                        "trainable parameters"),
            std::string::npos)
      << others;
}

TEST(Ranks, ShardedOptimizerScalesTheLossAndSkipsAnOverflowOnEveryRank) {
  // Scaled losses, and in the fourth step an inf in the last gradient
  // element, which lies in the last rank's shard alone: every rank skips
  // that step and backs off its scale, as the whole optimizer with its
  // GradScaler does, and the other steps end where that one's end.
  auto g = any_group();
  ShardedAndWhole pair(g);
  auto& [sharded_net, whole_net, sharded, whole] = pair;
  const auto options = lamp::GradScalerOptions().init_scale(1024);
  lamp::GradScaler sharded_scaler(options);
  lamp::GradScaler whole_scaler(options);
  const auto scaled_step = [](lamp_test::SmallNet& net, uint64_t seed,
                              lamp::GradScaler& scaler, bool overflow) {
    torch::manual_seed(seed);
    const auto images = torch::randn({4, 3, 8, 8});
    const auto labels = torch::randint(0, 4, {4}, torch::kLong);
    scaler.scale(torch::cross_entropy_loss(net->forward(images), labels))
        .backward();
    if (overflow) {
      net->parameters().back().grad().view(-1)[-1] =
          std::numeric_limits<float>::infinity();
    }
  };
  for (uint64_t step = 0; step < 5; ++step) {
    const bool overflow = step == 3;
    const auto before = copies_of(sharded_net->parameters());
    sharded.zero_grad();
    scaled_step(sharded_net, 40 + step, sharded_scaler, overflow);
    const bool stepped = sharded.step(sharded_scaler);
    sharded_scaler.update();
    whole->zero_grad();
    scaled_step(whole_net, 40 + step, whole_scaler, overflow);
    EXPECT_EQ(whole_scaler.step(*whole), !overflow);
    whole_scaler.update();
    EXPECT_EQ(stepped, !overflow) << "step " << step;
    EXPECT_EQ(sharded_scaler.get_scale(), whole_scaler.get_scale())
        << "step " << step;
    if (overflow) {
      for (size_t i = 0; i < before.size(); ++i) {
        EXPECT_TRUE(BitEqual(sharded_net->parameters()[i], before[i]))
            << "parameter " << i << " of the skipped step";
      }
    }
  }
  EXPECT_EQ(sharded_scaler.get_scale(), 512.0);
  EXPECT_EQ(sharded_scaler.steps_skipped(), 1);
  // The scaler's own reduction (none) is back after each call.
  EXPECT_FALSE(static_cast<bool>(sharded_scaler.found_inf_reduction()));
  pair.expect_the_same_weights(*g);
}

TEST(Ranks, ShardedOptimizerClipsWithTheNormOfTheWholeGradient) {
  // unscale_, clip_grad_norm_ and step(scaler), as PyTorch's sequence on the
  // whole optimizer: each step's norm is the whole gradient's, the same on
  // every rank, and the clipped steps end where the whole optimizer's end.
  auto g = any_group();
  ShardedAndWhole pair(g);
  auto& [sharded_net, whole_net, sharded, whole] = pair;
  const auto options = lamp::GradScalerOptions().init_scale(256);
  lamp::GradScaler sharded_scaler(options);
  lamp::GradScaler whole_scaler(options);
  constexpr double kMaxNorm = 0.05;
  for (uint64_t step = 0; step < 4; ++step) {
    torch::Tensor norms[2];
    for (int k = 0; k < 2; ++k) {
      auto& net = k == 0 ? sharded_net : whole_net;
      auto& scaler = k == 0 ? sharded_scaler : whole_scaler;
      torch::manual_seed(50 + step);
      const auto images = torch::randn({4, 3, 8, 8});
      const auto labels = torch::randint(0, 4, {4}, torch::kLong);
      if (k == 0) {
        sharded.zero_grad();
      } else {
        whole->zero_grad();
      }
      scaler.scale(torch::cross_entropy_loss(net->forward(images), labels))
          .backward();
      if (k == 0) {
        sharded.unscale_(sharded_scaler);
        norms[k] = sharded.clip_grad_norm_(kMaxNorm);
        EXPECT_TRUE(sharded.step(sharded_scaler));
      } else {
        whole_scaler.unscale_(*whole);
        norms[k] =
            lamp::optim::clip_grad_norm_(whole_net->parameters(), kMaxNorm);
        EXPECT_TRUE(whole_scaler.step(*whole));
      }
      scaler.update();
    }
    // Clipping acts: the norm is above the bound in every step.
    EXPECT_GT(norms[1].item<double>(), kMaxNorm) << "step " << step;
    EXPECT_TRUE(BitEqual(norms[0], from_rank0(*g, norms[0])))
        << "step " << step;
    // Sums of squares over other partitions of the elements: 1e-5 relative.
    EXPECT_TRUE(AllClose(norms[0], norms[1], 1e-5, 0))
        << "step " << step << ": " << norms[0].item<double>() << " against "
        << norms[1].item<double>();
  }
  pair.expect_the_same_weights(*g);
}

// Where rank `rank` of a run of `g`'s size saves its archive.
std::string sharded_archive_path(const ProcessGroup& g, int rank) {
  return ::testing::TempDir() + "lamp_sharded_optimizer_" +
         std::string(std::getenv("MASTER_PORT")) + "_" +
         std::to_string(g.world_size()) + "_" + std::to_string(rank) + ".pt";
}

TEST(Ranks, ShardedOptimizerResumesExactlyFromItsArchive) {
  // Three steps, save, two more; a new model and optimizer that load the
  // archive take the same two steps to the same bits: the shards, the
  // moments and step counts of each group, and the parameters gathered.
  auto g = any_group();
  torch::manual_seed(0);
  lamp_test::SmallNet net;
  lamp::distributed::ShardedOptimizer opt(net->parameters(),
                                          grouped_adamw(net->parameters()), g);
  for (uint64_t step = 0; step < 3; ++step) {
    opt.zero_grad();
    small_net_step(net, 20 + step, [&] { opt.step(); });
  }
  const auto path = sharded_archive_path(*g, g->rank());
  {
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    archive.save_to(path);
  }
  const auto saved = copies_of(net->parameters());
  const auto saved_buffers = copies_of(net->buffers());
  for (uint64_t step = 3; step < 5; ++step) {
    opt.zero_grad();
    small_net_step(net, 20 + step, [&] { opt.step(); });
  }
  torch::manual_seed(7); // other initial weights: the load replaces them
  lamp_test::SmallNet resumed_net;
  {
    // The running statistics are the model's to save, not the optimizer's.
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < saved_buffers.size(); ++i) {
      resumed_net->buffers()[i].copy_(saved_buffers[i]);
    }
  }
  lamp::distributed::ShardedOptimizer resumed(
      resumed_net->parameters(), grouped_adamw(resumed_net->parameters()), g);
  {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    resumed.load(archive);
  }
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_TRUE(BitEqual(resumed_net->parameters()[i], saved[i]))
        << "parameter " << i << " after the load";
  }
  for (uint64_t step = 3; step < 5; ++step) {
    resumed.zero_grad();
    small_net_step(resumed_net, 20 + step, [&] { resumed.step(); });
  }
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_TRUE(BitEqual(resumed_net->parameters()[i], net->parameters()[i]))
        << "parameter " << i << " two steps after the load";
  }
  g->barrier();
  std::remove(path.c_str());
}

TEST(Ranks, ShardedOptimizerLoadFailingOnOneRankChangesNoRank) {
  // The optimizer's own load fails on the last rank alone, after the
  // checks passed everywhere: every rank refuses (that rank with its own
  // message, the others naming it) and every rank keeps its shards, its
  // moments and step counts and its learning rate, the ranks whose load
  // succeeded as well. Then a load that fails nowhere takes the archive's.
  auto g = any_group();
  const int last = g->world_size() - 1;
  torch::manual_seed(0);
  lamp_test::SmallNet net;
  LoadFailsLast<torch::optim::AdamW>* flaky = nullptr;
  lamp::distributed::ShardedOptimizer opt(
      net->parameters(),
      [&flaky](std::vector<torch::Tensor> params) {
        auto made = std::make_unique<LoadFailsLast<torch::optim::AdamW>>(
            std::move(params), torch::optim::AdamWOptions(1e-2));
        flaky = made.get();
        return made;
      },
      g);
  opt.zero_grad();
  small_net_step(net, 30, [&] { opt.step(); });
  torch::serialize::OutputArchive saved;
  opt.save(saved);
  std::stringstream bytes;
  saved.save_to(bytes);
  const auto archive = bytes.str();
  opt.zero_grad();
  small_net_step(net, 31, [&] { opt.step(); });
  const auto state_of = [&] {
    std::vector<torch::Tensor> out = copies_of(opt.shards());
    for (const auto& p : flaky->param_groups()[0].params()) {
      const auto& state = static_cast<torch::optim::AdamWParamState&>(
          *flaky->state().at(lamp::detail::optimizer_state_key(p)));
      out.push_back(state.exp_avg().clone());
      out.push_back(state.exp_avg_sq().clone());
      out.push_back(torch::full({1}, state.step(), torch::kLong));
    }
    return out;
  };
  const auto before = state_of();
  const auto load = [&] {
    std::istringstream in(archive);
    torch::serialize::InputArchive from;
    from.load_from(in);
    opt.load(from);
  };
  ASSERT_NE(flaky, nullptr);
  flaky->fail = g->rank() == last;
  const auto refused = lamp_test::error_of(load);
  const std::string reason = "LoadFailsLast: its own check failed";
  EXPECT_EQ(refused,
            g->rank() == last
                ? reason + "."
                : "lamp: rank " + std::to_string(last) +
                      " failed in loading the optimizer's state: " + reason +
                      " (rank " + std::to_string(g->rank()) + " stops too).");
  EXPECT_EQ(flaky->param_groups()[0].options().get_lr(), 1e-2);
  const auto after = state_of();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(BitEqual(after[i], before[i])) << "tensor " << i;
  }
  flaky->fail = false;
  load();
  EXPECT_EQ(state_of().back().item<int64_t>(), 1); // the archive's count
  EXPECT_EQ(before.back().item<int64_t>(), 2);
}

TEST(Ranks, ShardedOptimizerLoadRefusedByOneRankChangesNoRank) {
  // Rank 0 is given rank 1's archive, the others their own: every rank
  // refuses, naming rank 0's reason, and no rank's weights or state change
  // (a rank that loaded alone would wait in the gather for the others).
  // Then every rank given the next rank's: each names its own reason.
  auto g = any_group();
  torch::manual_seed(0);
  lamp_test::SmallNet net;
  lamp::distributed::ShardedOptimizer opt(net->parameters(),
                                          grouped_adamw(net->parameters()), g);
  opt.zero_grad();
  small_net_step(net, 30, [&] { opt.step(); });
  {
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    archive.save_to(sharded_archive_path(*g, g->rank()));
  }
  g->barrier();
  opt.zero_grad();
  small_net_step(net, 31, [&] { opt.step(); });
  const auto before = copies_of(net->parameters());
  const auto shards_before = copies_of(opt.shards());
  const auto load_from = [&](int rank) {
    return error_of([&] {
      torch::serialize::InputArchive archive;
      archive.load_from(sharded_archive_path(*g, rank));
      opt.load(archive);
    });
  };
  const int world = g->world_size();
  const auto one = load_from(g->rank() == 0 ? 1 : g->rank());
  // Rank 0 its own error, the others rank 0's named.
  const std::string reason =
      "lamp::distributed::ShardedOptimizer::load: holds rank 1's shard of "
      "the optimizer state, but this is rank 0";
  EXPECT_EQ(
      one.find(g->rank() == 0 ? reason
                              : "lamp: rank 0 failed in checking the sharded "
                                "optimizer's archive: " +
                                    reason),
      0u)
      << one;
  const int next = (g->rank() + 1) % world;
  const auto every = load_from(next);
  EXPECT_NE(every.find("holds rank " + std::to_string(next) +
                       "'s shard of the optimizer state, but this is rank " +
                       std::to_string(g->rank())),
            std::string::npos)
      << every;
  // An archive of something else (the model's) is refused alike on every
  // rank, each naming what is missing.
  const auto model_archive = error_of([&] {
    torch::serialize::OutputArchive written;
    net->save(written);
    std::ostringstream bytes;
    written.save_to(bytes);
    std::istringstream in(bytes.str());
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    opt.load(archive);
  });
  EXPECT_NE(model_archive.find("lamp::distributed::ShardedOptimizer::load: "
                               "the archive has no 'optimizer_shard'"),
            std::string::npos)
      << model_archive;
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(BitEqual(net->parameters()[i], before[i])) << "parameter " << i;
  }
  for (size_t u = 0; u < shards_before.size(); ++u) {
    EXPECT_TRUE(BitEqual(opt.shards()[u], shards_before[u])) << "shard " << u;
  }
  // The step counts of the second step, not the first's.
  ASSERT_FALSE(opt.optimizer().state().empty());
  for (const auto& entry : opt.optimizer().state()) {
    EXPECT_EQ(
        static_cast<const torch::optim::AdamWParamState&>(*entry.second).step(),
        2);
  }
  g->barrier();
  std::remove(sharded_archive_path(*g, g->rank()).c_str());
}

void expect_bit_equal(const std::vector<torch::Tensor>& a,
                      const std::vector<torch::Tensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(BitEqual(a[i], b[i])) << what << ": tensor " << i;
  }
}

TEST(Ranks, ShardedOptimizerReshardsForAnotherNumberOfRanks) {
  // N ranks take three steps and save; a run of one rank (each rank its
  // own) loads their N archives and holds the same weights and state bit
  // for bit, then takes two more steps as the N ranks do; N ranks load its
  // one archive back, bit for bit again. Refusals change nothing.
  auto g = any_group();
  const int world = g->world_size();
  torch::manual_seed(0);
  lamp_test::SmallNet net;
  lamp::distributed::ShardedOptimizer wide(net->parameters(),
                                           grouped_adamw(net->parameters()), g);
  for (uint64_t step = 0; step < 3; ++step) {
    wide.zero_grad();
    small_net_step(net, 40 + step, [&] { wide.step(); });
  }
  {
    torch::serialize::OutputArchive archive;
    wide.save(archive);
    archive.save_to(sharded_archive_path(*g, g->rank()));
  }
  g->barrier(); // every rank's archive written
  const auto every_rank = [&] {
    std::vector<torch::serialize::InputArchive> all(world);
    for (int k = 0; k < world; ++k) {
      all[k].load_from(sharded_archive_path(*g, k));
    }
    return all;
  };

  // N ranks -> 1.
  auto alone = std::make_shared<ProcessGroup>(torch::kCPU);
  torch::manual_seed(7); // other initial weights: the load replaces them
  lamp_test::SmallNet one_net;
  lamp::distributed::ShardedOptimizer one(
      one_net->parameters(), grouped_adamw(one_net->parameters()), alone);
  auto archives = every_rank();
  one.load_resharded(archives);
  expect_bit_equal(one_net->parameters(), net->parameters(), "N ranks -> 1");
  expect_same_state(gathered_state(one.optimizer(), *alone),
                    gathered_state(wide.optimizer(), *g), "N ranks -> 1");
  for (uint64_t step = 3; step < 5; ++step) {
    wide.zero_grad();
    small_net_step(net, 40 + step, [&] { wide.step(); });
    one.zero_grad();
    small_net_step(one_net, 40 + step, [&] { one.step(); });
  }
  // The same elementwise update on other shard boundaries (1e-5, as in
  // ShardedOptimizerMatchesTheReplicatedOneAndHoldsItsShare).
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    EXPECT_TRUE(
        AllClose(one_net->parameters()[i], net->parameters()[i], 1e-5, 1e-6))
        << "parameter " << i << " two steps after N ranks -> 1";
  }

  // 1 -> N ranks: every rank gives the one archive.
  torch::serialize::OutputArchive single_out;
  one.save(single_out);
  std::vector<torch::serialize::InputArchive> single(1);
  single[0] = lamp::detail::reread(single_out);
  torch::manual_seed(9);
  lamp_test::SmallNet back_net;
  lamp::distributed::ShardedOptimizer back(
      back_net->parameters(), grouped_adamw(back_net->parameters()), g);
  back.load_resharded(single);
  expect_bit_equal(back_net->parameters(), one_net->parameters(),
                   "1 -> N ranks");
  expect_same_state(gathered_state(back.optimizer(), *g),
                    gathered_state(one.optimizer(), *alone), "1 -> N ranks");

  // Refused with nothing changed on any rank: rank 0 alone given the
  // archives out of order (the others name its reason), no archives, an
  // archive of something else, and one rank's archive into load().
  const auto params_before = copies_of(back_net->parameters());
  const auto state_before = gathered_state(back.optimizer(), *g);
  if (world > 1) {
    auto reversed = every_rank();
    if (g->rank() == 0) {
      std::reverse(reversed.begin(), reversed.end());
    }
    const auto order = error_of([&] { back.load_resharded(reversed); });
    const std::string reason =
        "lamp::distributed::ShardedOptimizer::load_resharded: archive 0 of " +
        std::to_string(world) + " holds rank " + std::to_string(world - 1) +
        " of " + std::to_string(world) + "'s shard";
    EXPECT_EQ(
        order.find(g->rank() == 0 ? reason
                                  : "lamp: rank 0 failed in re-sharding the "
                                    "sharded optimizer's archives: " +
                                        reason),
        0u)
        << order;
  }
  std::vector<torch::serialize::InputArchive> none;
  const auto empty = error_of([&] { back.load_resharded(none); });
  EXPECT_NE(empty.find("load_resharded: no archives given"), std::string::npos)
      << empty;
  std::vector<torch::serialize::InputArchive> model_archive(1);
  {
    torch::serialize::OutputArchive written;
    net->save(written);
    model_archive[0] = lamp::detail::reread(written);
  }
  const auto other = error_of([&] { back.load_resharded(model_archive); });
  EXPECT_NE(other.find("archive 0 is not a sharded optimizer's"),
            std::string::npos)
      << other;
  auto single_again = lamp::detail::reread(single_out);
  const auto into_load = error_of([&] { back.load(single_again); });
  EXPECT_NE(into_load.find("sharded over 1 rank but this run has " +
                           std::to_string(world) +
                           "; resume with 1 rank, or re-shard it"),
            std::string::npos)
      << into_load;
  expect_bit_equal(back_net->parameters(), params_before, "after refusals");
  expect_same_state(gathered_state(back.optimizer(), *g), state_before,
                    "after refusals");
  g->barrier(); // every rank done with every rank's archive
  std::remove(sharded_archive_path(*g, g->rank()).c_str());
}

// A bf16 run with sharded optimizer state keeps its FP32 master weights in
// its ranks' shard files: the weights read from its checkpoint (those
// TrainerOptions::init_from starts from) are those masters put back
// together, bit for bit, and a new bf16 run takes them as its masters;
// without a shard file, the BF16 copy, with a warning that names the file.
TEST(Ranks, CheckpointWeightsGatherTheMastersOfAShardedRun) {
  auto g = any_group();
  using lamp::training::TrainerOptions;
  const auto path = ::testing::TempDir() + "lamp_zero_masters_" +
                    std::string(std::getenv("MASTER_PORT")) + ".pt";
  for (const int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    std::vector<torch::Tensor> masters;
    std::vector<std::string> names;
    std::vector<torch::Tensor> copies;
    {
      auto run = lamp_test::make_run(lamp::Precision::kBF16,
                                     TrainerOptions(lamp::Precision::kBF16)
                                         .epochs(1)
                                         .process_group(g)
                                         .zero_stage(stage)
                                         .checkpoint(path));
      run->trainer->fit();
      auto* sharding = run->trainer->train_step().optimizer_sharding();
      ASSERT_NE(sharding, nullptr);
      masters = sharding->gather_masters();
      for (const auto& p : run->model->named_parameters()) {
        names.push_back(p.key());
        copies.push_back(p.value().detach().clone());
      }
    }
    g->barrier();
    ASSERT_EQ(masters.size(), names.size());
    const auto weights = lamp::training::read_checkpoint_weights(path);
    bool finer = false; // than the BF16 copy: the masters, not the copy
    for (size_t i = 0; i < names.size(); ++i) {
      const auto* read = weights.tensors.find(names[i]);
      if (read == nullptr) { // not ASSERT: the other ranks wait below
        ADD_FAILURE() << names[i] << " is not in the checkpoint's weights";
        continue;
      }
      EXPECT_TRUE(BitEqual(*read, masters[i])) << names[i];
      finer = finer || !BitEqual(*read, copies[i].to(torch::kFloat));
    }
    EXPECT_TRUE(finer);
    // Every rank has read the shard files before rank 0 moves one away.
    g->barrier();
    if (g->rank() == 0) {
      // A new run without sharding starts from them as its masters.
      auto fresh = lamp_test::make_run(
          lamp::Precision::kBF16,
          TrainerOptions(lamp::Precision::kBF16).init_from(path));
      const auto* started = fresh->trainer->train_step().master_weights();
      ASSERT_NE(started, nullptr);
      ASSERT_EQ(started->master_params().size(), masters.size());
      for (size_t i = 0; i < masters.size(); ++i) {
        EXPECT_TRUE(BitEqual(started->master_params()[i], masters[i]))
            << names[i];
      }
      // The last rank's shard file gone: the copy, and why.
      const int world = g->world_size();
      const auto shard = lamp::training::detail::shard_path(
          path, world - 1, world,
          lamp::training::read_checkpoint_settings(path).global_step);
      ASSERT_EQ(std::rename(shard.c_str(), (shard + ".away").c_str()), 0)
          << shard;
      lamp_test::Warnings warnings;
      const auto copy = lamp::training::read_checkpoint_weights(path);
      ASSERT_EQ(std::rename((shard + ".away").c_str(), shard.c_str()), 0);
      const auto said = warnings.containing("could not be read");
      ASSERT_EQ(said.size(), 1u);
      EXPECT_NE(said[0].find(shard), std::string::npos) << said[0];
      for (size_t i = 0; i < names.size(); ++i) {
        EXPECT_TRUE(BitEqual(copy.tensors[names[i]], copies[i])) << names[i];
      }
    }
    g->barrier();
  }
  if (g->rank() == 0) {
    const auto step =
        lamp::training::read_checkpoint_settings(path).global_step;
    for (int k = 1; k < g->world_size(); ++k) {
      std::remove(
          lamp::training::detail::shard_path(path, k, g->world_size(), step)
              .c_str());
    }
    std::remove(path.c_str());
  }
}

TEST(TwoRanks, TrainersRefuseOtherSettingsDataOrCheckpoints) {
  auto g = group();
  using lamp::training::TrainerOptions;
  // Another evaluation batch size (it made rank 0 report a wrong accuracy).
  const auto eval = error_of([&] {
    lamp_test::make_run(lamp::Precision::kFP32,
                        TrainerOptions(lamp::Precision::kFP32)
                            .process_group(g)
                            .eval_batch_size(g->rank() == 0 ? 64 : 32));
  });
  EXPECT_NE(eval.find("the ranks differ in the trainer's settings: "
                      "--eval-batch-size is 64 on rank 0 and 32 on rank 1"),
            std::string::npos)
      << eval;
  // Another evaluation limit: the ranks would evaluate other subsets.
  const auto limit = error_of([&] {
    lamp_test::make_run(lamp::Precision::kFP32,
                        TrainerOptions(lamp::Precision::kFP32)
                            .process_group(g)
                            .limit_eval_batches(g->rank() == 0 ? 0 : 2));
  });
  EXPECT_NE(limit.find("the ranks differ in the trainer's settings: "
                       "--limit-eval-batches is 0 on rank 0 and 2 on rank 1"),
            std::string::npos)
      << limit;
  // Other data of the same size.
  auto data = lamp_test::image_problem(true);
  if (g->rank() == 1) {
    data.targets = (data.targets + 1) % 4;
  }
  const auto other = error_of([&] {
    lamp_test::make_run(lamp::Precision::kFP32,
                        TrainerOptions(lamp::Precision::kFP32).process_group(g),
                        0.05, 32, torch::kCPU, data);
  });
  EXPECT_NE(other.find("--train-data is 192 images 3x8x8, labels crc32 "),
            std::string::npos)
      << other;
  // Each rank's own copy of a checkpoint, one an epoch behind the other.
  const auto path =
      lamp_test::temp_path("rank" + std::to_string(g->rank()) + ".pt");
  const auto options = TrainerOptions(lamp::Precision::kFP32).epochs(3);
  {
    auto alone =
        lamp_test::make_run(lamp::Precision::kFP32,
                            TrainerOptions(options).checkpoint(path).max_steps(
                                6 * (g->rank() + 1)));
    alone->trainer->fit();
  }
  const auto resumed = error_of([&] {
    lamp_test::make_run(
        lamp::Precision::kFP32,
        TrainerOptions(options).process_group(g).checkpoint(path).resume(path));
  });
  EXPECT_NE(resumed.find("the ranks differ in the checkpoint they resume from: "
                         "the epoch it ends is 1 on rank 0 and 2 on rank 1"),
            std::string::npos)
      << resumed;
  // A library user's ranks that differ in init_from: rank 1 would keep its
  // random start while rank 0 loads the checkpoint's weights (after the
  // broadcast that made them equal), and the replicas would train apart.
  const auto init = error_of([&] {
    lamp_test::make_run(lamp::Precision::kFP32,
                        TrainerOptions(options).process_group(g).init_from(
                            g->rank() == 0 ? path : ""));
  });
  EXPECT_NE(init.find("the ranks differ in the trainer's settings: "
                      "--init-from is given on rank 0 and not given on rank 1"),
            std::string::npos)
      << init;
  // A checkpoint folder missing on one node: rank 0's, which writes the
  // checkpoint, or with ZeRO rank 1's, which writes its shard there too.
  // Every rank stops before training, the others naming it, not after the
  // first epoch's training or in the comparison of the settings.
  const auto absent = ::testing::TempDir() + "lamp_absent_folder/run.pt";
  for (const int stage : {0, 1}) {
    const int bad = stage == 0 ? 0 : 1;
    const auto refused = error_of([&] {
      lamp_test::make_run(
          lamp::Precision::kFP32,
          TrainerOptions(options).process_group(g).zero_stage(stage).checkpoint(
              g->rank() == bad ? absent : path));
    });
    const std::string reason = "lamp: checkpoint " + absent + ": the folder " +
                               ::testing::TempDir() +
                               "lamp_absent_folder does not exist";
    EXPECT_EQ(refused.find(g->rank() == bad
                               ? reason
                               : "lamp: rank " + std::to_string(bad) +
                                     " failed in checking the checkpoint's "
                                     "path: " +
                                     reason),
              0u)
        << "zero stage " << stage << ": " << refused;
  }
  // Rank 1's copy damaged (cut short on its node's disk): resumed or
  // initialised from, every rank stops at once, rank 1 with its reason and
  // rank 0 naming it, not rank 0 waiting for rank 1 in the comparison of
  // the checkpoints (or in its first collective) until the timeout.
  if (g->rank() == 1) {
    const auto bytes = lamp_test::file_bytes(path);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << bytes.substr(0, bytes.size() / 2);
  }
  // Each rank's path has its own pid: rank 0 sees rank 1's by its name.
  const std::string damaged =
      "rank1.pt is damaged or not a checkpoint written by lamp";
  for (const bool resume : {true, false}) {
    const auto start = std::chrono::steady_clock::now();
    const auto refused = error_of([&] {
      lamp_test::make_run(
          lamp::Precision::kFP32,
          resume ? TrainerOptions(options)
                       .process_group(g)
                       .checkpoint(path)
                       .resume(path)
                 : TrainerOptions(options).process_group(g).init_from(path));
    });
    EXPECT_EQ(refused.find(g->rank() == 1
                               ? "lamp: " + path
                               : "lamp: rank 1 failed in reading its copy of "
                                 "the checkpoint: lamp: "),
              0u)
        << (resume ? "resume: " : "init_from: ") << refused;
    EXPECT_NE(refused.find(damaged), std::string::npos)
        << (resume ? "resume: " : "init_from: ") << refused;
    EXPECT_LT(std::chrono::steady_clock::now() - start,
              std::chrono::seconds(30))
        << (resume ? "resume" : "init_from");
  }
  std::remove(path.c_str());
  // Copies from the same epoch at other steps (a stale copy written by
  // checkpoint_every, or another max_steps cut): the ranks would resume
  // with other weights at other positions.
  {
    auto alone =
        lamp_test::make_run(lamp::Precision::kFP32,
                            TrainerOptions(options).checkpoint(path).max_steps(
                                2 * (g->rank() + 1)));
    alone->trainer->fit();
  }
  const auto steps = error_of([&] {
    lamp_test::make_run(
        lamp::Precision::kFP32,
        TrainerOptions(options).process_group(g).checkpoint(path).resume(path));
  });
  EXPECT_NE(steps.find("the ranks differ in the checkpoint they resume from: "
                       "its step count is 2 on rank 0 and 4 on rank 1"),
            std::string::npos)
      << steps;
  std::remove(path.c_str());
}

// checkpoint_every writes inside epochs on several ranks too: a
// data-parallel run stopped (killed, preempted) inside its epoch keeps the
// last checkpoint_every checkpoint, and both ranks resume from it; a stop
// between checkpoints writes its own (the ranks stop at one step).
TEST(TwoRanks, CheckpointEveryWritesInsideEpochs) {
  auto g = group();
  using lamp::training::TrainerOptions;
  // 96 images per rank, batches of 32: 3 steps per epoch; checkpoints at
  // steps 2, 3 (the epoch's end), 4 and 6.
  const auto options = TrainerOptions(lamp::Precision::kFP32)
                           .epochs(2)
                           .process_group(g)
                           .checkpoint_every(2);
  // Both ranks asked to stop after step `stopped`: the checkpoint (one path
  // for both ranks, rank 0 writes it, unique to this run) holds `saved`.
  const auto stop_after = [&](const std::string& name, int64_t stopped,
                              int64_t saved) {
    const auto path = ::testing::TempDir() + "lamp_every_" + name + "_" +
                      std::string(std::getenv("MASTER_PORT")) + ".pt";
    {
      const lamp::training::Trainer* trainer = nullptr;
      auto run = lamp_test::make_run(
          lamp::Precision::kFP32,
          TrainerOptions(options).checkpoint(path).stop_requested([&] {
            return trainer != nullptr && trainer->global_step() == stopped;
          }));
      trainer = run->trainer.get();
      run->trainer->fit();
      const auto& stop = run->trainer->stop_point();
      EXPECT_TRUE(stop.stopped) << name;
      EXPECT_EQ(stop.global_step, stopped) << name;
      if (g->rank() == 0) {
        EXPECT_EQ(stop.checkpoint_step, saved) << name;
      }
    }
    g->barrier();
    EXPECT_TRUE(lamp_test::exists(path)) << "no checkpoint at " << path;
    if (lamp_test::exists(path)) {
      EXPECT_EQ(lamp::training::read_checkpoint_settings(path).global_step,
                saved)
          << name;
    }
    return path;
  };
  // At a checkpoint_every step: both ranks resume from it.
  const auto path = stop_after("at", 2, 2);
  auto resumed = lamp_test::make_run(
      lamp::Precision::kFP32,
      TrainerOptions(options).checkpoint(path).resume(path));
  EXPECT_EQ(resumed->trainer->global_step(), 2);
  EXPECT_EQ(resumed->trainer->start_step_in_epoch(), 2);
  g->barrier();
  // Between those points the stop writes its step: the ranks agree on it.
  const auto between = stop_after("between", 5, 5);
  g->barrier();
  if (g->rank() == 0) {
    std::remove(path.c_str());
    std::remove(between.c_str());
  }
}

// One rank asked to stop (its node preempted, a signal to its process
// alone): every rank stops at that step, says which rank asked, and the
// checkpoint holds it. Before, that rank stopped alone and left the others
// in their next collective, or in another one than its own.
TEST(TwoRanks, ARankAskedToStopStopsEveryRankAtItsStep) {
  auto g = group();
  using lamp::training::TrainerOptions;
  const auto path = ::testing::TempDir() + "lamp_asked_" +
                    std::string(std::getenv("MASTER_PORT")) + ".pt";
  const lamp::training::Trainer* trainer = nullptr;
  // 6 steps an epoch (each rank reads all 192 examples), evaluated at step
  // 3 (rank 0 evaluates the one test batch, rank 1 none, but both take
  // its turn); rank 1 alone is asked, from step 4 on; rank 0 is asked
  // nothing but how often (once before each step and at each turn of the
  // evaluation).
  int64_t asked = 0;
  auto run = lamp_test::make_run(lamp::Precision::kFP32,
                                 TrainerOptions(lamp::Precision::kFP32)
                                     .epochs(3)
                                     .eval_every(3)
                                     .process_group(g)
                                     .checkpoint(path)
                                     .stop_requested([&] {
                                       ++asked;
                                       return g->rank() == 1 &&
                                              trainer != nullptr &&
                                              trainer->global_step() >= 4;
                                     }));
  trainer = run->trainer.get();
  run->trainer->fit();
  const auto& stop = run->trainer->stop_point();
  EXPECT_TRUE(stop.stopped);
  EXPECT_EQ(stop.global_step, 4);
  EXPECT_EQ(stop.asked_by_rank, 1);
  EXPECT_FALSE(stop.in_evaluation);
  EXPECT_EQ(stop.checkpoint_step, 4);
  // Before steps 0..4, and at the evaluation's one turn.
  EXPECT_EQ(asked, 6);
  g->barrier();
  EXPECT_EQ(lamp::training::read_checkpoint_settings(path).global_step, 4);
  g->barrier();
  if (g->rank() == 0) {
    std::remove(path.c_str());
  }
}

// A rank asked to stop during an evaluation (at its 4th question: before
// steps 0, 1 and 2, then the evaluation at step 3): every rank stops in that
// evaluation, at one turn, though rank 1 has no batch of its own there, and
// the checkpoint holds step 3.
TEST(TwoRanks, ARankAskedToStopInAnEvaluationStopsEveryRankThere) {
  auto g = group();
  using lamp::training::TrainerOptions;
  const auto path = ::testing::TempDir() + "lamp_asked_in_evaluation_" +
                    std::string(std::getenv("MASTER_PORT")) + ".pt";
  int64_t asked = 0;
  auto run = lamp_test::make_run(
      lamp::Precision::kFP32,
      TrainerOptions(lamp::Precision::kFP32)
          .epochs(3)
          .eval_every(3)
          .process_group(g)
          .checkpoint(path)
          .stop_requested([&] { return ++asked == 4 && g->rank() == 1; }));
  const auto history = run->trainer->fit();
  const auto& stop = run->trainer->stop_point();
  EXPECT_TRUE(stop.stopped);
  EXPECT_TRUE(stop.in_evaluation);
  EXPECT_EQ(stop.global_step, 3);
  EXPECT_EQ(stop.asked_by_rank, 1);
  EXPECT_EQ(stop.checkpoint_step, 3);
  EXPECT_EQ(asked, 4);
  g->barrier();
  EXPECT_EQ(lamp::training::read_checkpoint_settings(path).global_step, 3);
  g->barrier();
  if (g->rank() == 0) {
    std::remove(path.c_str());
  }
}

// evaluate_unless_stopped() over two ranks (--eval-only's): rank 1 asked at
// the evaluation's one turn, though it has no batch of its own there; both
// stop, naming it. Asked nothing, both have the whole evaluation.
TEST(TwoRanks, EvaluateUnlessStoppedStopsEveryRankAtOneTurn) {
  auto g = group();
  bool ask = false;
  auto run = lamp_test::make_run(
      lamp::Precision::kFP32,
      lamp::training::TrainerOptions(lamp::Precision::kFP32)
          .process_group(g)
          .stop_requested([&] { return ask && g->rank() == 1; }));
  lamp::training::Evaluation result;
  ASSERT_TRUE(run->trainer->evaluate_unless_stopped(result));
  EXPECT_EQ(result.loss, run->trainer->evaluate_subset().loss);
  ask = true;
  EXPECT_FALSE(run->trainer->evaluate_unless_stopped(result));
  const auto& stop = run->trainer->stop_point();
  EXPECT_TRUE(stop.stopped);
  EXPECT_TRUE(stop.in_evaluation);
  EXPECT_EQ(stop.asked_by_rank, 1);
}

// An evaluation's stop checks come at the turns the ranks agree on
// (training/stop_cadence.h), not at every turn: 224 turns of a batch of one
// example each, rank 0 taking about 1 ms longer a turn than rank 1, so that
// the two propose different cadences (a rank counting down its own would
// check at turns the other does not, and the collectives would pair
// wrongly). Rank 1 is asked at one turn only, its 3rd: the ranks check at
// the first two turns, then after as many as fill 0.1 s, so the answer is
// kept until a later check (unless a turn took 0.1 s), where both ranks
// stop, after the same batches.
TEST(TwoRanks, AnEvaluationsStopChecksComeAtTurnsTheRanksAgreeOn) {
  auto g = group();
  const auto test = lamp_test::image_problem(false);
  const int64_t copies = 7; // 448 examples
  const lamp::data::Dataset many{test.inputs.repeat({copies, 1, 1, 1}),
                                 test.targets.repeat({copies})};
  torch::manual_seed(5);
  lamp_test::SmallNet model;
  int64_t asked = 0;
  lamp::training::Trainer trainer(
      model.ptr(),
      [model](const torch::Tensor& x) mutable { return model->forward(x); },
      "smallnet",
      lamp::data::DeviceLoader(lamp_test::image_problem(true), torch::kCPU,
                               lamp_test::train_loader_options(32)),
      lamp::data::DeviceLoader(many, torch::kCPU,
                               lamp::data::LoaderOptions(1).shuffle(false)),
      lamp::training::TrainerOptions(lamp::Precision::kFP32)
          .process_group(g)
          .stop_requested([&] { return ++asked == 3 && g->rank() == 1; }));
  int64_t done = 0;
  lamp::training::Evaluation result;
  const bool evaluated = trainer.evaluate_unless_stopped(
      result, /*training_data=*/false,
      [&](const lamp::training::EvalProgress& progress) {
        done = progress.batch;
        if (g->rank() == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
  EXPECT_FALSE(evaluated);
  const auto& stop = trainer.stop_point();
  EXPECT_TRUE(stop.stopped);
  EXPECT_TRUE(stop.in_evaluation);
  EXPECT_EQ(stop.asked_by_rank, 1);
  // Asked at every turn, the one it stopped at included.
  EXPECT_EQ(asked, done + 1);
  EXPECT_GE(done, 3);
  EXPECT_LT(done, many.inputs.size(0) / 2);
  // The same batches on both ranks: the largest and the smallest agree.
  auto counts = torch::tensor(
      {static_cast<double>(done), -static_cast<double>(done)}, torch::kDouble);
  g->all_reduce_(counts, lamp::distributed::ReduceOp::kMax, "the counts");
  EXPECT_EQ(counts[0].item<double>(), -counts[1].item<double>());
}

// Rank 0 writes a data-parallel run's whole checkpoint: when it cannot (a
// full disk, its folder gone), every rank stops at that step, rank 0 with
// its reason and rank 1 naming it, not rank 1 in the next step's gradient
// all-reduce (Gloo: "Connection closed by peer" once rank 0's process has
// gone; NCCL: at --dist-timeout). The checkpoint keeps its last good step.
TEST(TwoRanks, ACheckpointRankZeroCannotWriteStopsEveryRank) {
  auto g = group();
  using lamp::training::TrainerOptions;
  const auto folder = ::testing::TempDir() + "lamp_write_fails_" +
                      std::string(std::getenv("MASTER_PORT"));
  const auto away = folder + ".away";
  if (g->rank() == 0) {
    ASSERT_EQ(::mkdir(folder.c_str(), 0755), 0) << folder;
  }
  g->barrier();
  // 6 steps an epoch. The checkpoint is written at step 2
  // (checkpoint_every) and fails at step 4; the best checkpoint fails at
  // the first evaluation (step 2). The folder moved away is its node's disk
  // gone bad: the write's own messages are tested in faults.*.
  struct Case {
    std::string name;
    std::string path;
    TrainerOptions options;
    int64_t gone_after; ///< the step whose on_batch moves the folder away
    int64_t fails_at;   ///< the step whose write fails
    int64_t kept;       ///< the step the checkpoint keeps (0: none written)
  };
  const auto base =
      TrainerOptions(lamp::Precision::kFP32).epochs(2).process_group(g);
  const std::vector<Case> cases = {
      {"checkpoint", folder + "/run.pt",
       TrainerOptions(base).checkpoint(folder + "/run.pt").checkpoint_every(2),
       4, 4, 2},
      {"best checkpoint", folder + "/best.pt",
       TrainerOptions(base).eval_every(2).best_checkpoint(folder + "/best.pt"),
       1, 2, 0}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto run = lamp_test::make_run(lamp::Precision::kFP32, c.options);
    const auto on_batch = [&](const lamp::training::BatchProgress& p) {
      if (g->rank() == 0 && p.global_step == c.gone_after) {
        ASSERT_EQ(std::rename(folder.c_str(), away.c_str()), 0) << folder;
      }
    };
    const auto start = std::chrono::steady_clock::now();
    const auto refused =
        lamp_test::error_of([&] { run->trainer->fit(nullptr, on_batch); });
    EXPECT_LT(std::chrono::steady_clock::now() - start,
              std::chrono::seconds(30));
    if (g->rank() == 0) {
      EXPECT_EQ(refused.find("lamp: file " + c.path + ": the folder "), 0u)
          << refused;
      ASSERT_EQ(std::rename(away.c_str(), folder.c_str()), 0) << away;
      if (c.kept > 0) {
        EXPECT_EQ(lamp::training::read_checkpoint_settings(c.path).global_step,
                  c.kept);
      } else {
        EXPECT_FALSE(lamp_test::exists(c.path)) << c.path;
      }
    } else {
      EXPECT_EQ(refused.find("lamp: rank 0 failed in writing the " + c.name +
                             ": lamp: file " + c.path + ": the folder "),
                0u)
          << refused;
    }
    EXPECT_EQ(run->trainer->global_step(), c.fails_at);
    g->barrier();
  }
  if (g->rank() == 0) {
    std::remove((folder + "/run.pt").c_str());
    ::rmdir(folder.c_str());
  }
}

// A checkpoint inside an epoch is not written after a step whose loss was
// inf/NaN: on any rank, so that every rank decides alike whether to wait
// for rank 0's write (one rank in that agreement and the other in the next
// step's gradient all-reduce would pair collectives that do not match).
// A loss of `value` (its gradients zero: the weights stay as they are).
torch::Tensor loss_of_value(const torch::Tensor& loss, double value) {
  return loss * 0 + value;
}

// Rank 1's losses inf/NaN at two steps, rank 0's none: the epoch's loss is
// every rank's finite losses over every rank's finite steps, the same on
// both (each divided the ranks' summed losses by its own count before).
TEST(TwoRanks, AnEpochsLossIsEveryRanksFiniteLossesOverTheirSteps) {
  auto g = group();
  auto net = std::make_shared<lamp_test::SmallNet>(nullptr);
  int64_t steps = 0;
  const auto options =
      lamp::training::TrainerOptions(lamp::Precision::kFP32)
          .epochs(1)
          .process_group(g)
          .training_loss(
              [&, net](const torch::Tensor& x, const torch::Tensor& y) {
                const auto loss =
                    torch::nn::functional::cross_entropy((*net)->forward(x), y);
                ++steps;
                if (g->rank() == 0) {
                  return loss_of_value(loss, 1.0);
                }
                return loss_of_value(
                    loss, steps == 2 || steps == 3
                              ? std::numeric_limits<double>::quiet_NaN()
                              : 3.0);
              });
  auto run = lamp_test::make_run(lamp::Precision::kFP32, options);
  *net = run->model;
  const auto history = run->trainer->fit();
  ASSERT_EQ(history.size(), 1u);
  const double n = static_cast<double>(steps);
  ASSERT_GT(n, 3);
  // (n x 1 + (n - 2) x 3) / (2n - 2), to FP64's rounding of a few sums.
  const double expected = (n + 3 * (n - 2)) / (2 * n - 2);
  EXPECT_NEAR(history[0].train_loss, expected, 1e-12 * expected);
  const auto mine = torch::tensor({history[0].train_loss}, torch::kDouble);
  EXPECT_TRUE(BitEqual(mine, from_rank0(*g, mine)));
}

// Rank 0's losses 1, rank 1's 3, every step: a run stopped inside its
// epoch (after 2 of its 3 steps) and resumed reports the epoch's loss of
// the straight run, 2. The checkpoint holds each rank's sums and each rank
// resumes its own: both resumed rank 0's before, which made the epoch's
// loss rank 0's first steps and the ranks' last one, 4/3.
TEST(TwoRanks, AResumeInsideAnEpochReportsTheRanksStraightLoss) {
  auto g = group();
  using lamp::training::TrainerOptions;
  const auto path = ::testing::TempDir() + "lamp_rank_sums_" +
                    std::string(std::getenv("MASTER_PORT")) + ".pt";
  auto net = std::make_shared<lamp_test::SmallNet>(nullptr);
  int64_t steps = 0;
  const auto options = [&](TrainerOptions o) {
    return o.epochs(1).process_group(g).checkpoint(path).training_loss(
        [&, net](const torch::Tensor& x, const torch::Tensor& y) {
          const auto loss =
              torch::nn::functional::cross_entropy((*net)->forward(x), y);
          ++steps;
          return loss_of_value(loss, g->rank() == 0 ? 1.0 : 3.0);
        });
  };
  {
    auto first = lamp_test::make_run(
        lamp::Precision::kFP32,
        options(TrainerOptions(lamp::Precision::kFP32).stop_requested([&] {
          return steps == 2;
        })));
    *net = first->model;
    first->trainer->fit();
    ASSERT_TRUE(first->trainer->stop_point().stopped);
    ASSERT_EQ(first->trainer->global_step(), 2);
  }
  auto resumed = lamp_test::make_run(
      lamp::Precision::kFP32,
      options(TrainerOptions(lamp::Precision::kFP32).resume(path)));
  *net = resumed->model;
  ASSERT_EQ(resumed->trainer->start_step_in_epoch(), 2);
  const auto history = resumed->trainer->fit();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_GT(history[0].steps, 0);
  EXPECT_EQ(history[0].resumed_steps, 2);
  EXPECT_DOUBLE_EQ(history[0].train_loss, 2.0);
  g->barrier();
  if (g->rank() == 0) {
    std::remove(path.c_str());
  }
}

// Rank 1's loss inf/NaN at every step, rank 0's finite: at the end of the
// first window of divergence_patience steps both stop with the message
// (rank 0 saying it was another rank's), rather than rank 1 alone, which
// left rank 0 waiting in the next collective until the timeout.
TEST(TwoRanks, ANonFiniteWindowOnOneRankStopsEveryRank) {
  auto g = group(std::chrono::seconds(20));
  auto net = std::make_shared<lamp_test::SmallNet>(nullptr);
  const auto options =
      lamp::training::TrainerOptions(lamp::Precision::kFP32)
          .epochs(1)
          .divergence_patience(3)
          .process_group(g)
          .training_loss([&, net](const torch::Tensor& x,
                                  const torch::Tensor& y) {
            const auto loss =
                torch::nn::functional::cross_entropy((*net)->forward(x), y);
            return loss_of_value(
                loss, g->rank() == 1 ? std::numeric_limits<double>::quiet_NaN()
                                     : 1.0);
          });
  auto run = lamp_test::make_run(lamp::Precision::kFP32, options);
  *net = run->model;
  const auto message = error_of([&] { run->trainer->fit(); });
  EXPECT_NE(message.find("training diverged in epoch 1: the loss was inf/NaN "
                         "for 3 steps in a row" +
                         std::string(g->rank() == 0 ? " on another rank" : "")),
            std::string::npos)
      << message;
}

TEST(TwoRanks, ANonFiniteLossOnOneRankSkipsTheCheckpointOnEveryRank) {
  auto g = group();
  using lamp::training::TrainerOptions;
  const auto path = ::testing::TempDir() + "lamp_non_finite_" +
                    std::string(std::getenv("MASTER_PORT")) + ".pt";
  auto net = std::make_shared<lamp_test::SmallNet>(nullptr);
  int64_t steps = 0;
  const auto options =
      TrainerOptions(lamp::Precision::kFP32)
          .epochs(1)
          .process_group(g)
          .checkpoint(path)
          .checkpoint_every(2)
          // Rank 1's loss of step 4 is NaN (both ranks skip that step:
          // its gradients are all-reduced); a stop after step 5.
          .training_loss(
              [&, net](const torch::Tensor& x, const torch::Tensor& y) {
                const auto loss =
                    torch::nn::functional::cross_entropy((*net)->forward(x), y);
                return ++steps == 4 && g->rank() == 1
                           ? loss * std::numeric_limits<float>::quiet_NaN()
                           : loss;
              })
          .stop_requested([&] { return steps == 5; });
  auto run = lamp_test::make_run(lamp::Precision::kFP32, options);
  *net = run->model;
  const lamp_test::Warnings warnings;
  run->trainer->fit();
  // The stop after step 5 writes that step (its loss is finite).
  EXPECT_EQ(run->trainer->stop_point().global_step, 5);
  EXPECT_EQ(run->trainer->stop_point().checkpoint_step, 5);
  const auto warned = warnings.containing(
      "the checkpoint of step 4 was not written: that step's loss was "
      "inf/NaN");
  EXPECT_EQ(warned.size(), 1u);
  g->barrier();
  EXPECT_EQ(lamp::training::read_checkpoint_settings(path).global_step, 5);
  g->barrier();
  if (g->rank() == 0) {
    std::remove(path.c_str());
  }
}

// A rank that stops on an error of its own in Trainer::fit (here its loss
// throws) leaves its reason: rank 0, whose output the user reads, names it
// while its collective waits for that rank (its report) and when the
// collective fails as the rank exits, not only "Another rank has probably
// exited".
TEST(TwoRanks, ARankThatStopsOnItsOwnErrorIsNamedByTheOthers) {
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mutex = std::make_shared<std::mutex>();
  auto g = reporting_group(lines, mutex, std::chrono::seconds(30));
  using lamp::training::TrainerOptions;
  auto net = std::make_shared<lamp_test::SmallNet>(nullptr);
  int64_t steps = 0;
  const std::string reason = "rank 1's data reader broke at step 3";
  auto run = lamp_test::make_run(
      lamp::Precision::kFP32,
      TrainerOptions(lamp::Precision::kFP32)
          .epochs(1)
          .process_group(g)
          .training_loss([&, net](const torch::Tensor& x,
                                  const torch::Tensor& y) {
            if (++steps == 3 && g->rank() == 1) {
              throw std::runtime_error(reason);
            }
            return torch::nn::functional::cross_entropy((*net)->forward(x), y);
          }));
  *net = run->model;
  const auto start = std::chrono::steady_clock::now();
  std::string error; // rank 1's is its own std::runtime_error
  try {
    run->trainer->fit();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (g->rank() == 1) {
    // Gone after rank 0 has reported its wait (a GPU's NCCL rank 0 would
    // wait so until the timeout), as a failed process goes.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    std::_Exit(error == reason ? 0 : 1);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(error.find("; rank 1 stopped: " + reason + " (the timeout is"),
            std::string::npos)
      << error;
  const auto text = joined(*lines, *mutex);
  EXPECT_NE(text.find("for rank 1, which has not reached it; rank 1 "
                      "stopped: " +
                      reason + "; giving up after 30 s"),
            std::string::npos)
      << text;
}

// This rank's error once the other has exited: the peer may need a moment
// to be gone, so this rank keeps talking until an all-reduce fails ("" and
// a test failure where none does).
std::string error_once_the_other_is_gone(ProcessGroup& g) {
  auto t = torch::ones({4});
  try {
    for (int i = 0; i < 100; ++i) {
      g.all_reduce_(t);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "all_reduce_ kept succeeding with the other rank gone";
  return "";
}

// `message` names `rank` as gone without a word, found where `where`
// says ("its address" or "its rendezvous store at") on this machine.
// Directly, or through the words another rank's failed collective left
// ("rank 0 stopped: its collective (all_reduce_) failed: rank 2 has gone
// ...": that rank found it first).
void expect_gone_named(const std::string& message, const std::string& rank,
                       const std::string& where) {
  const auto named =
      rank + " has gone without a word (" + where + " 127.0.0.1:";
  EXPECT_TRUE(message.find("; " + named) != std::string::npos ||
              message.find(") failed: " + named) != std::string::npos)
      << message;
  EXPECT_NE(message.find(": nothing listens there (connection refused)): its "
                         "process has ended, killed"),
            std::string::npos)
      << message;
}

// A reason taken back (leave_word(""), as fit() does as it starts: the
// rank caught its error and went on) is not named when that rank later
// exits without one.
TEST(TwoRanks, AReasonTakenBackIsNotNamed) {
  auto g = group(std::chrono::seconds(10));
  if (g->rank() == 1) {
    g->leave_word("an old reason");
    g->leave_word("");
  }
  g->barrier();
  if (g->rank() == 1) {
    std::_Exit(0); // gone without a word
  }
  const auto message = error_once_the_other_is_gone(*g);
  expect_gone_named(message, "rank 1", "its address");
  EXPECT_EQ(message.find("an old reason"), std::string::npos) << message;
}

// Rank 0, which serves the rendezvous store, gone without a word (killed,
// out of memory): rank 1's failed collective says so, and that nothing
// listens at the store, rather than that some rank has probably exited.
TEST(TwoRanks, ARankZeroGoneWithoutAWordIsNamed) {
  auto g = group(std::chrono::seconds(10));
  g->barrier();
  if (g->rank() == 0) {
    std::_Exit(0); // gone without a word, its store with it
  }
  const auto start = std::chrono::steady_clock::now();
  const auto message = error_once_the_other_is_gone(*g);
  EXPECT_NE(message.find(" failed on rank 1 of 2 (gloo): "), std::string::npos)
      << message;
  expect_gone_named(message, "rank 0", "its rendezvous store at");
  EXPECT_EQ(message.find("probably exited"), std::string::npos) << message;
  // No wait for a store that is not there.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
}

// A group of three whose rank 2 ends without a word, like a crashed rank,
// once all have arrived: returned on ranks 0 and 1.
std::shared_ptr<ProcessGroup> three_ranks_then_rank_two_gone() {
  auto g = ProcessGroup::from_environment(
      torch::kCPU, ProcessGroupOptions().timeout(std::chrono::seconds(10)));
  EXPECT_EQ(g->world_size(), 3) << "run through run_ranks.sh 3";
  g->barrier();
  if (g->rank() == 2) {
    std::_Exit(0);
  }
  return g;
}

// In a group of three, a rank killed outright (a signal, the out-of-memory
// killer, a crash) leaves no reason, but its listener has closed with its
// process: the others' failed collectives name it, rather than "Another
// rank has probably exited".
TEST(ThreeRanks, ARankGoneWithoutAWordIsNamed) {
  auto g = three_ranks_then_rank_two_gone();
  const auto message = error_once_the_other_is_gone(*g);
  EXPECT_NE(message.find(" failed on rank " + std::to_string(g->rank()) +
                         " of 3 (gloo): "),
            std::string::npos)
      << message;
  expect_gone_named(message, "rank 2", "its address");
  EXPECT_EQ(message.find("rank 0 has gone"), std::string::npos) << message;
  EXPECT_EQ(message.find("rank 1 has gone"), std::string::npos) << message;
  EXPECT_EQ(message.find("Another rank"), std::string::npos) << message;
  // Rank 0 serves the store: it stays until rank 1 has failed too (within
  // milliseconds; its own collective fails as rank 2's connection closes),
  // whose message would otherwise name rank 0 as well.
  if (g->rank() == 0) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
}

// Rank 2 of 3 killed outright; rank 1's collective fails first, while
// rank 0 is busy elsewhere, and rank 1 ends. Rank 0's collective, failing
// later, finds both gone, but names rank 2 through the words rank 1 left,
// not rank 1 as gone without a word too.
TEST(ThreeRanks, ARankFailingLaterNamesTheGoneRankThroughTheFirst) {
  auto g = three_ranks_then_rank_two_gone();
  if (g->rank() == 1) {
    const auto message = error_once_the_other_is_gone(*g);
    expect_gone_named(message, "rank 2", "its address");
    EXPECT_EQ(message.find("rank 0"), std::string::npos) << message;
    // Its failure ends it, as a program's would (its checks' verdict in
    // its status, as gtest's summary is not reached).
    std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const auto message = error_once_the_other_is_gone(*g);
  EXPECT_NE(message.find("; rank 1 stopped: its collective (all_reduce_) "
                         "failed: rank 2 has gone without a word (its "
                         "address 127.0.0.1:"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("done with fewer collectives than rank 1"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("rank 1 has gone"), std::string::npos) << message;
}

// Rank 2 of 3 killed outright; rank 0's collective fails first, and rank 0
// would end at once, taking its store and the words it left with it. It
// waits (at most 2 s) until rank 1, failing a moment later, has read them
// and ended: rank 1 names rank 2 through rank 0's words, not rank 0 as
// gone without a word.
TEST(ThreeRanks, RankZeroWaitsForTheOthersToReadWhatItFound) {
  auto g = three_ranks_then_rank_two_gone();
  if (g->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const auto start = std::chrono::steady_clock::now();
  const auto message = error_once_the_other_is_gone(*g);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (g->rank() == 0) {
    expect_gone_named(message, "rank 2", "its address");
    EXPECT_LT(seconds, 5.0); // its wait ends as rank 1 does, 2 s at most
  } else {
    EXPECT_NE(message.find("; rank 0 stopped: its collective (all_reduce_) "
                           "failed: rank 2 has gone without a word (its "
                           "address 127.0.0.1:"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find("rank 0 has gone"), std::string::npos) << message;
  }
  // Both end on their failure, as a program's ranks would.
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
}

TEST(TwoRanks, ARankThatExitsMakesTheOtherFailWithinTheTimeout) {
  auto g = group(std::chrono::seconds(10));
  g->barrier();
  if (g->rank() == 1) {
    std::_Exit(0); // gone without a word, like a crashed rank
  }
  const auto start = std::chrono::steady_clock::now();
  const auto message = error_once_the_other_is_gone(*g);
  EXPECT_NE(message.find("rank 0 of 2"), std::string::npos) << message;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_LT(seconds, 30.0);
}

} // namespace
