#pragma once

// TrainStep's CUDA-graph mode: one captured training step per input shape,
// replayed from static copies of the batch. TrainStep decides whether a step
// may be captured and what a step is; this unit owns the graphs, their
// shared memory pool and the warm-up/capture/replay sequence.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "lamp/amp/train_step.h"
#include "platform/cuda_graph.h"

namespace lamp {
namespace detail {

class GraphStep {
 public:
  /// The step as it runs eagerly on one batch (TrainStep::step(loss_fn)).
  using EagerStep = std::function<StepResult(const torch::Tensor& input,
                                             const torch::Tensor& target)>;

  /// Graphs on `device`; each input shape runs `warmup_steps` (>= 1) eager
  /// steps on a side stream before its capture.
  GraphStep(const torch::Device& device, int64_t warmup_steps);
  ~GraphStep();

  /// One step on a batch: an eager warm-up step, or (after the warm-up of
  /// this shape) the captured graph replayed with the batch copied into its
  /// static inputs. `before_capture` runs once before each capture (to drop
  /// gradients, so that the captured backward allocates them in the graph's
  /// pool), `before_replay` before every replay. A capture that fails is
  /// forgotten (the shape warms up again) and the error rethrown.
  StepResult step(const torch::Tensor& input, const torch::Tensor& target,
                  const EagerStep& eager,
                  const std::function<void()>& before_capture,
                  const std::function<void()>& before_replay);

  /// Whether a capture is under way: work launched now is recorded, not run.
  bool capturing() const { return capturing_; }
  /// Device memory the graphs' pool holds between replays beyond live
  /// tensors; 0 before the first capture.
  int64_t pool_bytes() const;
  /// Forgets every graph (they hold the memory of the tensors they were
  /// captured with, which a load replaces): each shape warms up again.
  void clear() { graphs_.clear(); }

 private:
  struct Graph {
    int64_t eager_steps = 0;
    torch::Tensor input, target;          // static inputs
    torch::Tensor loss, found_inf, scale; // static outputs
    std::unique_ptr<CapturedGraph> graph;
  };

  torch::Device device_;
  int64_t warmup_steps_;
  GraphPool pool_;
  std::map<std::string, Graph> graphs_;
  bool capturing_ = false;
};

} // namespace detail
} // namespace lamp
