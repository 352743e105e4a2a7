#pragma once

// TrainStep's CUDA-graph mode: one captured training step per input shape,
// replayed from static copies of the batch. TrainStep decides whether a step
// may be captured, what a step is and when the graphs are stale (its
// CaptureSignature); this unit owns the graphs, their shared memory pool and
// the warm-up/capture/replay sequence.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lamp/amp/train_step.h"
#include "platform/cuda_graph.h"

namespace lamp {
namespace detail {

class GraphStep {
 public:
  /// The step as it runs eagerly on one batch (TrainStep::step(loss_fn)).
  using EagerStep = std::function<StepResult(const torch::Tensor& input,
                                             const torch::Tensor& target)>;

  /// What TrainStep plugs into step().
  struct Hooks {
    /// The eager step: warm-up steps run it, the capture records it.
    EagerStep eager;
    /// Runs once before each capture: drops the gradients, so that the
    /// captured backward allocates them in the graphs' pool, and records what
    /// the capture bakes in.
    std::function<void()> before_capture;
    /// Runs before every replay (copies the learning rates to the device).
    std::function<void()> before_replay;
  };

  /// Graphs on `device`; each input shape runs `warmup_steps` (>= 1) eager
  /// steps on a side stream before its capture.
  GraphStep(const torch::Device& device, int64_t warmup_steps);
  ~GraphStep();

  /// One step on a batch: an eager warm-up step, or (after the warm-up of
  /// this shape) the captured graph replayed with the batch copied into its
  /// static inputs. A capture that fails is forgotten (the shape warms up
  /// again) and the error rethrown. After a capture, the allocator's unused
  /// blocks go back to the device (release_cached_device_memory: the warm-up's
  /// eager blocks, and the pools of graphs forgotten before).
  /// `grad_owners` are the tensors whose `.grad` the step writes (the
  /// model's parameters and the masters): each graph holds the gradients its
  /// capture left there and puts them back after its replay, since another
  /// shape's capture leaves those of its own graph.
  StepResult step(const torch::Tensor& input, const torch::Tensor& target,
                  const Hooks& hooks,
                  const std::vector<torch::Tensor>& grad_owners);

  /// Whether a capture is under way: work launched now is recorded, not run.
  bool capturing() const { return capturing_; }
  /// Whether a graph exists (one shape at least has been captured).
  bool captured() const;
  /// Graphs captured so far, forgotten ones included.
  int64_t captures() const { return captures_; }
  /// The memory of the graphs' pool; zeros before the first capture.
  GraphPoolMemory pool_memory() const;
  /// Forgets every graph (after a load, whose tensors replace those they were
  /// captured with, or a change of what they baked in): each shape warms up
  /// and is captured again, in a new pool. Waits for the device first, so
  /// that no replay still runs.
  void clear();

 private:
  struct Graph {
    int64_t eager_steps = 0;
    torch::Tensor input, target;                     // static inputs
    torch::Tensor loss, found_inf, scale, grad_norm; // static outputs
    std::vector<torch::Tensor> grads; // grad_owners' after the capture
    std::unique_ptr<CapturedGraph> graph;
  };

  torch::Device device_;
  int64_t warmup_steps_;
  GraphPool pool_;
  std::map<std::string, Graph> graphs_;
  int64_t captures_ = 0;
  bool capturing_ = false;
};

} // namespace detail
} // namespace lamp
