#include "lamp/nn/checkpoint.h"

#include <ATen/Context.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/torch.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lamp/platform/parameters.h"
#include "platform/compat.h"
#include "platform/cuda_graph.h"
#include "platform/differentiable_once.h"

namespace lamp {
namespace nn {
namespace {

using Body = std::function<torch::Tensor(const torch::Tensor&)>;

// The autocast state of the CPU and of CUDA: what the second forward runs
// under.
struct AutocastState {
  static constexpr std::array<c10::DeviceType, 2> kDevices = {
      c10::DeviceType::CPU, c10::DeviceType::CUDA};
  std::array<bool, 2> enabled{};
  std::array<at::ScalarType, 2> dtype{};

  static AutocastState now() {
    AutocastState s;
    for (size_t i = 0; i < kDevices.size(); ++i) {
      s.enabled[i] = lamp::detail::autocast_enabled(kDevices[i]);
      s.dtype[i] = lamp::detail::autocast_dtype(kDevices[i]);
    }
    return s;
  }
  void set() const {
    for (size_t i = 0; i < kDevices.size(); ++i) {
      lamp::detail::set_autocast_enabled(kDevices[i], enabled[i]);
      lamp::detail::set_autocast_dtype(kDevices[i], dtype[i]);
    }
  }
};

// Sets `state` for its lifetime, then restores the one before.
class AutocastAs {
 public:
  explicit AutocastAs(const AutocastState& state)
      : before_(AutocastState::now()) {
    state.set();
  }
  ~AutocastAs() { before_.set(); }
  AutocastAs(const AutocastAs&) = delete;
  AutocastAs& operator=(const AutocastAs&) = delete;

 private:
  AutocastState before_;
};

// Turns autocast's cache of parameter casts off for its lifetime.
class NoAutocastCache {
 public:
  NoAutocastCache() : before_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~NoAutocastCache() { at::autocast::set_autocast_cache_enabled(before_); }
  NoAutocastCache(const NoAutocastCache&) = delete;
  NoAutocastCache& operator=(const NoAutocastCache&) = delete;

 private:
  bool before_;
};

// Sets a generator's `state` for its lifetime, then restores the one
// before: the recomputation draws what the forward drew, and the draws
// after the backward are those there would have been without it.
class GeneratorAs {
 public:
  GeneratorAs(at::Generator generator, const torch::Tensor& state)
      : generator_(std::move(generator)) {
    if (state.defined()) {
      before_ = generator_.get_state();
      generator_.set_state(state);
    }
  }
  ~GeneratorAs() {
    if (before_.defined()) {
      generator_.set_state(before_);
    }
  }
  GeneratorAs(const GeneratorAs&) = delete;
  GeneratorAs& operator=(const GeneratorAs&) = delete;

 private:
  at::Generator generator_;
  torch::Tensor before_;
};

// The backward of activation_checkpoint(): runs the body again with grad
// mode on and returns the gradients of the input and the parameters.
class ActivationCheckpointBackward : public torch::autograd::Node {
 public:
  ActivationCheckpointBackward(Body body, torch::Tensor input,
                               std::vector<torch::Tensor> parameters,
                               AutocastState autocast, at::Generator generator,
                               torch::Tensor rng_state)
      : body_(std::move(body)),
        input_(input.detach()),
        input_version_(input._version()),
        input_requires_grad_(input.requires_grad()),
        parameters_(std::move(parameters)),
        autocast_(autocast),
        generator_(std::move(generator)),
        rng_state_(std::move(rng_state)) {}

  std::string name() const override {
    return "lamp::nn::ActivationCheckpointBackward";
  }

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    // Higher-order gradients would reach a detached copy of the input, not
    // the input: refused rather than missing terms.
    lamp::detail::refuse_higher_order_gradients(
        "lamp::nn::activation_checkpoint",
        "Call the body without the checkpoint for them.");
    TORCH_CHECK(!released_,
                "lamp::nn::activation_checkpoint: its backward ran a second "
                "time, after the first released what it recomputes from; "
                "retain_graph is not supported: run the forward again.");
    TORCH_CHECK(input_._version() == input_version_,
                "lamp::nn::activation_checkpoint: the input was changed in "
                "place after the forward, so the backward cannot compute "
                "the same activations again; change a copy instead.");
    torch::autograd::variable_list result(1 + parameters_.size());
    if (grads.empty() || !grads[0].defined()) {
      release_variables();
      return result;
    }
    std::vector<torch::Tensor> wrt;
    std::vector<size_t> slot;
    const auto x = input_.detach().requires_grad_(input_requires_grad_);
    if (input_requires_grad_) {
      wrt.push_back(x);
      slot.push_back(0);
    }
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (parameters_[i].defined() && parameters_[i].requires_grad()) {
        wrt.push_back(parameters_[i]);
        slot.push_back(i + 1);
      }
    }
    torch::Tensor y;
    {
      NoAutocastCache no_cache; // nothing of the backward outlives it
      at::AutoGradMode grad_mode(true);
      AutocastAs autocast(autocast_);
      GeneratorAs rng(generator_, rng_state_);
      y = body_(x);
    }
    const auto computed = torch::autograd::grad(
        {y}, wrt, {grads[0]}, /*retain_graph=*/false, /*create_graph=*/false,
        /*allow_unused=*/true);
    for (size_t k = 0; k < computed.size(); ++k) {
      result[slot[k]] = computed[k];
    }
    release_variables();
    return result;
  }

  void release_variables() override {
    released_ = true;
    input_ = torch::Tensor();
    parameters_.clear();
    rng_state_ = torch::Tensor();
  }

 private:
  Body body_;
  torch::Tensor input_;
  uint32_t input_version_;
  bool input_requires_grad_;
  std::vector<torch::Tensor> parameters_;
  AutocastState autocast_;
  at::Generator generator_;
  torch::Tensor rng_state_;
  bool released_ = false;
};

} // namespace

torch::Tensor activation_checkpoint(
    const Body& body, const torch::Tensor& input,
    const std::vector<torch::Tensor>& parameters, bool preserve_rng) {
  TORCH_CHECK(body != nullptr,
              "lamp::nn::activation_checkpoint: body is empty.");
  TORCH_CHECK(input.defined(),
              "lamp::nn::activation_checkpoint: the input is undefined.");
  bool needs_grad = input.requires_grad();
  for (const auto& p : parameters) {
    needs_grad = needs_grad || (p.defined() && p.requires_grad());
  }
  if (!torch::GradMode::is_enabled() || !needs_grad) {
    return body(input);
  }
  const auto device = input.device();
  auto generator = at::globalContext().defaultGenerator(
      device.is_cuda() ? device : torch::Device(torch::kCPU));
  torch::Tensor rng_state;
  if (preserve_rng) {
    TORCH_CHECK(!lamp::detail::stream_capturing(device),
                "lamp::nn::activation_checkpoint: the random generator's "
                "state cannot be read inside a CUDA graph capture, and its "
                "recomputation needs it (a dropout draws its mask again); "
                "give no dropout (GPTOptions::dropout(0)), or train without "
                "the CUDA graph (--cuda-graph off).");
    rng_state = generator.get_state();
  }
  // Each tensor once: a module's parameters() lists a tied weight once per
  // name, and two edges to one tensor would add its gradient twice.
  std::vector<torch::Tensor> distinct;
  lamp::detail::TensorIdentitySet seen;
  for (const auto& p : parameters) {
    if (!p.defined() || seen.insert(p)) {
      distinct.push_back(p);
    }
  }
  const auto autocast = AutocastState::now();
  torch::Tensor y;
  {
    // Autocast's cache off: a parameter's 16-bit copy made here, without
    // grad mode, has no history; cached, the recomputation would take it
    // and give the parameter no gradient through it (where the backward runs
    // inside the autocast region that ran the forward).
    NoAutocastCache no_cache; // in the forward
    torch::NoGradGuard no_grad;
    y = body(input);
  }
  TORCH_CHECK(y.defined(),
              "lamp::nn::activation_checkpoint: body returned an undefined "
              "tensor.");
  // The history goes on a tensor of its own: not a view, nor the input or
  // a parameter handed back as it is (an identity body, a to() that casts
  // nothing), whose own history set_history would overwrite.
  bool own = !y.is_view() && !y.is_same(input);
  for (const auto& p : distinct) {
    own = own && !(p.defined() && y.is_same(p));
  }
  if (!own) {
    y = y.clone();
  }
  auto node = lamp::detail::make_autograd_node<ActivationCheckpointBackward>(
      body, input, distinct, autocast, generator, rng_state);
  node->set_next_edges(
      torch::autograd::collect_next_edges(input, at::TensorList(distinct)));
  torch::autograd::set_history(y, node);
  return y;
}

} // namespace nn
} // namespace lamp
