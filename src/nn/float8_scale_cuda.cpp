// The end of a step of delayed scaling on lamp's CUDA kernel: the checks and
// the current stream around src/nn/float8_scale_kernels.cu.
#include "nn/float8_scale_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <string>

#include "nn/float8_scale_kernels.h"
#include "platform/kernel_runs.h"

namespace lamp {
namespace nn {
namespace internal {

std::string fused_scale_update_unavailable_reason(
    const Float8StateImpl& state) {
  for (const auto* t :
       {&state.amax_history, &state.pending_amax, &state.scale}) {
    if (!t->is_cuda()) {
      return "the state is on " + t->device().str() + ", the kernel is CUDA's";
    }
    if (t->scalar_type() != torch::kFloat || !t->is_contiguous()) {
      return "the state's tensors are not contiguous FP32 ones";
    }
  }
  const auto longest = kernels::float8_scale_update_max_history();
  if (state.amax_history.size(1) > longest) {
    return "the kernel shifts histories of up to " + std::to_string(longest) +
           " steps, not " + std::to_string(state.amax_history.size(1));
  }
  return "";
}

void fused_update_scales(const std::vector<Float8StateImpl*>& states) {
  if (states.empty()) {
    return;
  }
  c10::cuda::CUDAGuard guard(states.front()->scale.device());
  const auto stream = at::cuda::getCurrentCUDAStream().stream();
  kernels::Float8ScaleArgs args;
  const auto launch = [&] {
    C10_CUDA_CHECK(kernels::float8_update_scales(args, stream));
    lamp::detail::note_kernel_run(lamp::detail::KernelPath::kFloat8ScaleUpdate);
    args.count = 0;
  };
  for (auto* state : states) {
    TORCH_INTERNAL_ASSERT(
        state->scale.device() == states.front()->scale.device(),
        "lamp::nn::update_float8_scales: the fused update takes the layers "
        "of one device");
    const auto& recipe = state->recipe();
    args.layers[args.count++] = kernels::scale_layer(
        state->amax_history.data_ptr<float>(),
        state->pending_amax.data_ptr<float>(), state->scale.data_ptr<float>(),
        static_cast<int>(state->amax_history.size(1)),
        recipe.amax_compute() == Float8AmaxCompute::kMax, recipe.margin());
    if (args.count == kernels::kScaleLayersPerLaunch) {
      launch();
    }
  }
  if (args.count > 0) {
    launch();
  }
}

} // namespace internal
} // namespace nn
} // namespace lamp
