// lamp::TrainStep with the optimizer state replicated (--zero 0), sharded
// (stage 1) or sharded with the gradients reduce-scattered (stage 2): step
// time, the bytes of the tensors each rank holds for training beyond the
// model's weights, and the process's peak RSS. One mode per run, so that
// each process's peak is its own. Run as the ranks of a group:
//
//   tests/distributed/run_ranks.sh 2 build/bench/lamp_zero_step STAGE
//       [layers width context batch steps]
//
// A byte-level GPT in bf16 (BF16 weights, FP32 master weights) with AdamW.
// Rank 0 prints the median step time over `steps` steps after 3 of warm-up
// and, after the last step: the parameters' gradients, the FP32 master
// weights and their gradients (lamp::MasterWeights replicated, the shards
// sharded) and AdamW's moments, counted from the tensors held.
// DataParallel's own buckets are not visible from here: replicated and at
// stage 1 they hold one gradient's worth in the parameters' dtype for the
// run's life; at stage 2 each exists only between its first gradient and
// its reduce-scatter.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lamp/amp/train_step.h"
#include "lamp/distributed.h"
#include "lamp/models/gpt.h"
#include "lamp/optim/adam.h"
#include "lamp/platform/backends.h"
#include "positional_args.h"

namespace {

constexpr const char* kUsage =
    "usage: lamp_zero_step STAGE [LAYERS WIDTH CONTEXT BATCH STEPS], run as "
    "the ranks of a group (tests/distributed/run_ranks.sh 2 lamp_zero_step "
    "1 4 256 128 8 10)";

struct Args {
  int stage = 0;
  int64_t layers = 4, width = 256, context = 128, batch = 8, steps = 10;
};

// Argument `i` (`what`), read strictly (positional_args.h).
int64_t arg(int argc, char** argv, int i, const char* what, int64_t lo,
            int64_t hi, int64_t fallback) {
  return lamp_bench::positional_integer(argc, argv, i, what, lo, hi, fallback,
                                        kUsage);
}

Args parse(int argc, char** argv) {
  TORCH_CHECK(argc <= 7, "too many arguments (", argc - 1, "); ", kUsage, ".");
  Args a;
  a.stage = static_cast<int>(arg(argc, argv, 1, "stage", 0, 2, a.stage));
  a.layers = arg(argc, argv, 2, "layers", 1, 1000, a.layers);
  a.width = arg(argc, argv, 3, "width", 1, 65536, a.width);
  a.context = arg(argc, argv, 4, "context", 1, 1 << 20, a.context);
  a.batch = arg(argc, argv, 5, "batch", 1, 1 << 20, a.batch);
  // At least one timed step: the median is of the steps' times.
  a.steps = arg(argc, argv, 6, "steps", 1, 1000000, a.steps);
  return a;
}

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

int run(const Args& a) {
  const int stage = a.stage;
  const int64_t layers = a.layers, width = a.width, context = a.context,
                batch = a.batch, steps = a.steps;
  auto group = lamp::distributed::ProcessGroup::from_environment(torch::kCPU);
  torch::manual_seed(0);
  lamp::models::GPT gpt(lamp::models::GPTOptions()
                            .layers(layers)
                            .heads(4)
                            .width(width)
                            .context(context)
                            .dropout(0.0));
  lamp::TrainStep step(
      gpt.ptr(),
      [](const lamp::NamedParameters& named) {
        return std::make_unique<lamp::optim::AdamW>(
            named.values(), torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
      },
      lamp::TrainStepOptions(lamp::Precision::kBF16)
          .gradient_sync(lamp::distributed::data_parallel(
              group,
              lamp::distributed::DataParallelOptions().zero_stage(stage))));
  torch::manual_seed(1 + group->rank());
  const auto tokens = torch::randint(0, 256, {batch, context + 1});
  const auto x = tokens.narrow(1, 0, context);
  const auto y = tokens.narrow(1, 1, context);
  std::vector<double> times;
  float loss = 0;
  for (int64_t i = 0; i < steps + 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const auto result = step.step([&] {
      return torch::cross_entropy_loss(
          gpt->forward(x).flatten(0, 1).to(torch::kFloat), y.flatten());
    });
    group->barrier("the benchmark's step barrier");
    loss = result.loss.item<float>();
    if (i >= 3) {
      times.push_back(std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
  }
  std::sort(times.begin(), times.end());
  int64_t parameters = 0, grads = 0, masters = 0;
  for (const auto& p : gpt->parameters()) {
    parameters += p.numel();
    grads += bytes_of(p.grad());
  }
  const auto* sharding = step.optimizer_sharding();
  const auto& fp32 =
      sharding ? sharding->shards() : step.master_weights()->master_params();
  for (const auto& m : fp32) {
    masters += bytes_of(m) + bytes_of(m.grad());
  }
  const int64_t state =
      lamp::distributed::optimizer_state_bytes(step.optimizer());
  if (group->is_main()) {
    const double p = static_cast<double>(parameters);
    std::printf(
        "zero %d, %d ranks: step %.1f ms, loss %.4f; per parameter on rank 0: "
        "gradients %.2f B, FP32 masters + gradients %.2f B, AdamW moments "
        "%.2f B, total %.2f B (%lld parameters); peak RSS %.1f MiB\n",
        stage, group->world_size(), times[times.size() / 2] * 1e3, loss,
        grads / p, masters / p, state / p, (grads + masters + state) / p,
        static_cast<long long>(parameters),
        lamp::peak_host_memory() / 1048576.0);
  }
  return 0;
}

} // namespace

// Exit statuses: 2 for a bad command line, 1 for an error while running.
int main(int argc, char** argv) {
  return lamp_bench::rank_benchmark_main("lamp_zero_step", argc, argv, parse,
                                         run);
}
