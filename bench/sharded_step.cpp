// Step time and per-rank optimizer memory of data-parallel training with
// the optimizer replicated (every rank steps every parameter) and sharded
// (lamp::distributed::ShardedOptimizer, ZeRO stage 1), one after the other
// in one process group, on a byte-level GPT with AdamW, its weights in BF16
// (FP32 master weights: lamp::MasterWeights when replicated) or in FP32.
// Run as the ranks of a group (torchrun, or
// tests/distributed/run_ranks.sh N):
//
//   tests/distributed/run_ranks.sh 2 build/bench/lamp_sharded_step
//       [bf16|fp32 layers width context batch steps rounds]
//
// Rank 0 prints one line per round and mode: the median step time over
// `steps` steps after 3 of warm-up, and the bytes this rank holds for the
// optimizer: FP32 master weights and their gradients (BF16 replicated, and
// sharded), and AdamW's two moments.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "lamp/amp/master_weights.h"
#include "lamp/distributed.h"
#include "lamp/models/gpt.h"
#include "positional_args.h"

namespace {

using lamp::distributed::ProcessGroup;

constexpr const char* kUsage =
    "usage: lamp_sharded_step [bf16|fp32 LAYERS WIDTH CONTEXT BATCH STEPS "
    "ROUNDS], run as the ranks of a group (tests/distributed/run_ranks.sh 2 "
    "lamp_sharded_step bf16 4 256 128 8 10 3)";

struct Args {
  bool bf16 = true;
  int64_t layers = 4, width = 256, context = 128, batch = 8, steps = 10,
          rounds = 2;
};

// Argument `i` (`what`), read strictly (positional_args.h).
int64_t arg(int argc, char** argv, int i, const char* what, int64_t lo,
            int64_t hi, int64_t fallback) {
  return lamp_bench::positional_integer(argc, argv, i, what, lo, hi, fallback,
                                        kUsage);
}

Args parse(int argc, char** argv) {
  TORCH_CHECK(argc <= 8, "too many arguments (", argc - 1, "); ", kUsage, ".");
  Args a;
  if (argc > 1) {
    const std::string weights = argv[1];
    TORCH_CHECK(weights == "bf16" || weights == "fp32",
                "argument 1 (the weights) is '", weights,
                "', not bf16 or fp32; ", kUsage, ".");
    a.bf16 = weights == "bf16";
  }
  a.layers = arg(argc, argv, 2, "layers", 1, 1000, a.layers);
  a.width = arg(argc, argv, 3, "width", 1, 65536, a.width);
  a.context = arg(argc, argv, 4, "context", 1, 1 << 20, a.context);
  a.batch = arg(argc, argv, 5, "batch", 1, 1 << 20, a.batch);
  // At least one timed step: the median is of the steps' times.
  a.steps = arg(argc, argv, 6, "steps", 1, 1000000, a.steps);
  a.rounds = arg(argc, argv, 7, "rounds", 1, 1000, a.rounds);
  return a;
}

std::unique_ptr<torch::optim::Optimizer> adamw(
    std::vector<torch::Tensor> params) {
  return std::make_unique<torch::optim::AdamW>(
      std::move(params), torch::optim::AdamWOptions(3e-4).weight_decay(0.1));
}

int64_t adam_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& entry : optimizer.state()) {
    const auto& s =
        static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    total += (s.exp_avg().numel() + s.exp_avg_sq().numel()) * 4;
  }
  return total;
}

int run(const Args& a) {
  const bool bf16 = a.bf16;
  const int64_t layers = a.layers, width = a.width, context = a.context,
                batch = a.batch, steps = a.steps, rounds = a.rounds;
  auto group = ProcessGroup::from_environment(torch::kCPU);
  const bool main_rank = group->is_main();
  if (main_rank) {
    std::printf(
        "GPT %lldx%lld, context %lld, batch %lld per rank, %d ranks, "
        "%d threads, AdamW, %s weights\n",
        static_cast<long long>(layers), static_cast<long long>(width),
        static_cast<long long>(context), static_cast<long long>(batch),
        group->world_size(), at::get_num_threads(), bf16 ? "BF16" : "FP32");
  }
  for (int64_t round = 0; round < rounds; ++round) {
    for (const bool sharded : {false, true}) {
      torch::manual_seed(0);
      lamp::models::GPT gpt(lamp::models::GPTOptions()
                                .layers(layers)
                                .heads(4)
                                .width(width)
                                .context(context)
                                .dropout(0.0));
      if (bf16) {
        gpt->to(torch::kBFloat16);
      }
      lamp::distributed::DataParallel dp(gpt.ptr(), group);
      std::unique_ptr<torch::optim::Optimizer> whole;
      std::unique_ptr<lamp::MasterWeights> masters;
      std::unique_ptr<lamp::distributed::ShardedOptimizer> shard;
      if (sharded) {
        shard = std::make_unique<lamp::distributed::ShardedOptimizer>(
            gpt->parameters(), adamw, group);
      } else if (bf16) {
        masters = std::make_unique<lamp::MasterWeights>(gpt->parameters());
        whole = adamw(masters->master_params());
      } else {
        whole = adamw(gpt->parameters());
      }
      torch::manual_seed(1 + group->rank());
      const auto tokens = torch::randint(0, 256, {batch, context + 1});
      const auto x = tokens.narrow(1, 0, context);
      const auto y = tokens.narrow(1, 1, context);
      std::vector<double> times;
      for (int64_t step = 0; step < steps + 3; ++step) {
        const auto start = std::chrono::steady_clock::now();
        if (sharded) {
          shard->zero_grad();
        } else {
          whole->zero_grad();
          for (auto& p : gpt->parameters()) {
            p.mutable_grad() = torch::Tensor();
          }
        }
        dp.before_forward();
        torch::cross_entropy_loss(
            gpt->forward(x).flatten(0, 1).to(torch::kFloat), y.flatten())
            .backward();
        dp.finish_gradient_sync();
        if (sharded) {
          shard->step();
        } else if (masters) {
          masters->model_grads_to_master_grads();
          whole->step();
          masters->master_params_to_model_params();
        } else {
          whole->step();
        }
        group->barrier("the benchmark's step barrier");
        if (step >= 3) {
          times.push_back(std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start)
                              .count());
        }
      }
      std::sort(times.begin(), times.end());
      int64_t parameters = 0;
      for (const auto& p : gpt->parameters()) {
        parameters += p.numel();
      }
      // Replicated: AdamW's moments, and in BF16 the FP32 masters and their
      // gradients.
      const int64_t bytes =
          sharded ? shard->state_bytes()
                  : adam_state_bytes(*whole) + (masters ? parameters * 8 : 0);
      if (main_rank) {
        std::printf(
            "round %lld %-10s step %.1f ms  optimizer bytes on rank 0 "
            "%lld (%.2f per parameter, %lld parameters)\n",
            static_cast<long long>(round + 1),
            sharded ? "sharded" : "replicated", times[times.size() / 2] * 1e3,
            static_cast<long long>(bytes),
            static_cast<double>(bytes) / parameters,
            static_cast<long long>(parameters));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

} // namespace

// Exit statuses: 2 for a bad command line, 1 for an error while running.
int main(int argc, char** argv) {
  return lamp_bench::rank_benchmark_main("lamp_sharded_step", argc, argv, parse,
                                         run);
}
