// cuDNN's graph-API patterns for a lamp built without them: a LibTorch
// without CUDA, or cudnn-frontend's headers not found at configure time
// (CMakeLists.txt). lamp::ops::folded_conv() then always runs its ATen
// reference; these say why.
#include "ops/conv_batch_norm_cudnn.h"

namespace lamp {
namespace detail {

std::string cudnn_graph_unavailable_reason() {
#if LAMP_WITH_CUDA
  return "this lamp was built without cudnn-frontend: cudnn_frontend.h was "
         "not found at configure time. Install the nvidia-cudnn-frontend "
         "wheel beside torch (pip install nvidia-cudnn-frontend) or set "
         "-DLAMP_CUDNN_FRONTEND_INCLUDE_DIR=<folder of cudnn_frontend.h>, "
         "and reconfigure.";
#else
  return "this lamp was built against a LibTorch without CUDA.";
#endif
}

std::vector<std::string> cudnn_graph_descriptions() {
  return {};
}

bool cudnn_conv_genstats(const torch::Tensor&, const torch::Tensor&, int64_t,
                         int64_t, const torch::Tensor&, const torch::Tensor&,
                         torch::Tensor&, torch::Tensor&, torch::Tensor&,
                         std::string& why) {
  why = cudnn_graph_unavailable_reason();
  return false;
}

bool cudnn_dgrad_drelu_dscale(const torch::Tensor&, const torch::Tensor&,
                              const torch::Tensor&, int64_t, int64_t,
                              const torch::Tensor&, const torch::Tensor&,
                              torch::Tensor&, torch::Tensor&, torch::Tensor&,
                              std::string& why) {
  why = cudnn_graph_unavailable_reason();
  return false;
}

bool cudnn_wgrad_prologue(const torch::Tensor&, const torch::Tensor&,
                          const torch::Tensor&, int64_t, int64_t,
                          const torch::Tensor&, const torch::Tensor&,
                          torch::Tensor&, std::string& why) {
  why = cudnn_graph_unavailable_reason();
  return false;
}

} // namespace detail
} // namespace lamp
