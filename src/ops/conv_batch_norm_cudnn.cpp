// Built only when the LibTorch found has CUDA and cudnn-frontend's and
// cuDNN's headers were found (CMakeLists.txt): the graph-API patterns behind
// lamp::ops::folded_conv(), built with cudnn-frontend (header-only).
//
// cudnn-frontend loads cuDNN dynamically here: its handle is the libcudnn
// LibTorch loaded (platform/loaded_library.h), so lamp links and loads
// nothing of cuDNN, as src/ops/cudnn_batch_norm.cpp. The graphs run on
// ATen's cuDNN handle (one per device and thread) and current stream, with
// workspaces from ATen's caching allocator: they order with the ops around
// them and CUDA graphs capture them like ATen's own convolutions.
//
// The patterns are the ones cuDNN's runtime fusion engines document for
// ResNet training (cudnn-frontend's samples name them):
//  - forward: scale-bias-ReLU prologue, convolution, statistics epilogue
//    ("SBRCS"; without the prologue for a block's first convolution);
//  - data gradient: dgrad, the ReLU's mask of the recomputed prologue and
//    the BatchNorm weight-gradient sums ("Dgrad Drelu DBNweight");
//  - weight gradient with the prologue recomputed ("scale-bias-relu-wgrad").
// Each shape's graph is built once (validate, heuristics A then fallback,
// support check, plans) and cached; a graph cuDNN refuses is remembered as
// refused, with its reason, so that layer runs the ATen reference from then
// on without asking again; so is a graph that fails to run. Under
// torch.backends.cudnn.deterministic or use_deterministic_algorithms the
// plans keep only engines without cuDNN's NONDETERMINISTIC note (a shape
// with none left runs the ATen reference, which honours them too).
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <ATen/record_function.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ops/conv_batch_norm_cudnn.h"
#include "platform/loaded_library.h"

// cudnn-frontend's dynamic loading reads the library handle from here.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
} // namespace cudnn_frontend

namespace lamp {
namespace detail {
namespace {

namespace fe = cudnn_frontend;

constexpr const char* kFoldedConvWho = "lamp::ops::folded_conv";
// The oldest cuDNN with every pattern used here (dgrad + dReLU + dBN weight
// came in 9.8).
constexpr int64_t kMinimumCudnn = 90800;

// The tensors' uids in the graphs' variant packs.
enum Uid : int64_t {
  kX = 1,
  kW,
  kScale,
  kBias,
  kY,
  kSum,
  kSumOfSquares,
  kDy,
  kDz,
  kMean,
  kInvVariance,
  kDScale,
  kDBias,
  kEqScaleDy,
  kEqScaleX,
  kEqBias,
  kDw,
};

// Loads cuDNN for cudnn-frontend once; "" or why it cannot be used.
const std::string& load_reason() {
  static const std::string reason = []() -> std::string {
    const std::string soname = "libcudnn.so." + std::to_string(CUDNN_MAJOR);
    void* library = loaded_library(soname);
    if (library == nullptr) {
      return not_loaded_reason(soname, "cuDNN", CUDNN_MAJOR) + ".";
    }
    fe::cudnn_dlhandle = library;
    try {
      const int64_t version = fe::detail::get_backend_version();
      if (version < kMinimumCudnn) {
        return "the loaded cuDNN is version " + std::to_string(version) +
               "; the fused convolution-BatchNorm graphs need 9.8 or newer.";
      }
    } catch (const std::exception& e) {
      return std::string("cuDNN's version could not be read: ") + e.what();
    }
    return "";
  }();
  return reason;
}

fe::DataType_t data_type(c10::ScalarType type) {
  switch (type) {
    case c10::kHalf:
      return fe::DataType_t::HALF;
    case c10::kBFloat16:
      return fe::DataType_t::BFLOAT16;
    case c10::kFloat:
      return fe::DataType_t::FLOAT;
    default:
      TORCH_CHECK(false, kFoldedConvWho, ": no cuDNN data type for ", type,
                  ".");
  }
}

// NCHW dimensions with NHWC strides, as cuDNN's graphs describe
// channels_last tensors.
std::vector<int64_t> nhwc_strides(const std::vector<int64_t>& d) {
  return {d[1] * d[2] * d[3], 1, d[1] * d[3], d[1]};
}

std::shared_ptr<fe::graph::Tensor_attributes> nhwc_tensor(
    fe::graph::Graph& graph, const char* name, Uid uid,
    const std::vector<int64_t>& dims) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(dims)
                          .set_stride(nhwc_strides(dims)));
}

std::shared_ptr<fe::graph::Tensor_attributes> channel_tensor(
    fe::graph::Graph& graph, const char* name, Uid uid, int64_t channels,
    fe::DataType_t type) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({1, channels, 1, 1})
                          .set_stride({channels, 1, channels, channels})
                          .set_data_type(type));
}

void mark_channel_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t,
                         Uid uid, int64_t channels) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim({1, channels, 1, 1})
      .set_stride({channels, 1, channels, channels})
      .set_data_type(fe::DataType_t::FLOAT);
}

std::shared_ptr<fe::graph::Tensor_attributes> pointwise(
    fe::graph::Graph& graph, std::shared_ptr<fe::graph::Tensor_attributes> a,
    std::shared_ptr<fe::graph::Tensor_attributes> b, fe::PointwiseMode_t mode) {
  return graph.pointwise(a, b,
                         fe::graph::Pointwise_attributes().set_mode(mode));
}

// relu(scale x + bias) as three pointwise nodes.
std::shared_ptr<fe::graph::Tensor_attributes> scale_bias_relu(
    fe::graph::Graph& graph, std::shared_ptr<fe::graph::Tensor_attributes> x,
    int64_t channels, fe::DataType_t scale_type) {
  auto scale = channel_tensor(graph, "scale", kScale, channels, scale_type);
  auto bias = channel_tensor(graph, "bias", kBias, channels, scale_type);
  auto scaled = pointwise(graph, x, scale, fe::PointwiseMode_t::MUL);
  auto shifted = pointwise(graph, scaled, bias, fe::PointwiseMode_t::ADD);
  return graph.pointwise(shifted, fe::graph::Pointwise_attributes().set_mode(
                                      fe::PointwiseMode_t::RELU_FWD));
}

// What one graph needs to know of the convolution.
struct Shape {
  std::vector<int64_t> x; // N, C, H, W
  std::vector<int64_t> w; // K, C, R, S
  std::vector<int64_t> y; // N, K, P, Q
  int64_t stride = 1;
  int64_t padding = 0;
  c10::ScalarType dtype = c10::kHalf;
  bool prologue = false;
  // Only engines without cuDNN's NONDETERMINISTIC note, as ATen's own
  // convolutions under torch.backends.cudnn.deterministic or
  // use_deterministic_algorithms.
  bool deterministic = false;
};

Shape shape_of(const torch::Tensor& x, const torch::Tensor& weight,
               int64_t stride, int64_t padding, bool prologue) {
  Shape s;
  s.x = x.sizes().vec();
  s.w = weight.sizes().vec();
  const auto out = [&](int64_t in, int64_t k) {
    return (in + 2 * padding - k) / stride + 1;
  };
  s.y = {s.x[0], s.w[0], out(s.x[2], s.w[2]), out(s.x[3], s.w[3])};
  s.stride = stride;
  s.padding = padding;
  s.dtype = x.scalar_type();
  s.prologue = prologue;
  const auto& context = at::globalContext();
  s.deterministic =
      context.deterministicCuDNN() || context.deterministicAlgorithms();
  return s;
}

// The cache's key, which cudnn_graph_descriptions() shows: "forward cuda:0
// Half x 32x64x16x16 w 128x64x3x3 stride 1 padding 1, prologue".
std::string key_of(const char* kind, const Shape& s, int device) {
  std::ostringstream key;
  key << kind << " cuda:" << device << ' ' << c10::toString(s.dtype);
  const char* names[] = {" x ", " w "};
  const std::vector<int64_t>* dims[] = {&s.x, &s.w};
  for (int i = 0; i < 2; ++i) {
    key << names[i];
    for (size_t d = 0; d < dims[i]->size(); ++d) {
      key << (d == 0 ? "" : "x") << (*dims[i])[d];
    }
  }
  key << " stride " << s.stride << " padding " << s.padding;
  if (s.prologue) {
    key << ", prologue";
  }
  if (s.deterministic) {
    key << ", deterministic";
  }
  return key.str();
}

// One cached graph: built, or refused with cuDNN's reason.
struct Entry {
  std::string key;
  // The key in the cache: `key` and the thread that built it.
  std::string cache_key;
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  // The prologue's scale and bias in the activations' dtype rather than
  // FP32 (the second variant tried, as cuDNN's own samples have them).
  bool io_scale = false;
  // cuDNN's name of the plan taken (its engine and knobs).
  std::string plan;
  std::string refused;
};

using Builder = std::function<std::shared_ptr<fe::graph::Graph>(
    const Shape&, fe::DataType_t scale_type)>;

// Validates, plans and builds `graph` (with only deterministic engines where
// `deterministic`); "" or cuDNN's reason.
std::string finish(fe::graph::Graph& graph, cudnnHandle_t handle,
                   bool deterministic) {
  const auto step = [](fe::error_t status, const char* what) -> std::string {
    if (status.is_good()) {
      return "";
    }
    auto message = status.get_message();
    return std::string(what) + ": " +
           (message.empty() ? std::string("refused") : message);
  };
  std::string why = step(graph.validate(), "validate");
  if (why.empty()) {
    why = step(graph.build_operation_graph(handle), "operation graph");
  }
  if (why.empty()) {
    why = step(graph.create_execution_plans(
                   {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
               "execution plans");
  }
  if (why.empty() && deterministic) {
    graph.deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
  }
  if (why.empty()) {
    why = step(graph.check_support(),
               deterministic ? "support (deterministic engines)" : "support");
  }
  if (why.empty()) {
    why = step(graph.build_plans(), "plans");
  }
  return why;
}

// The graph cache and its lock. Kept for the process and never destroyed,
// as PyTorch keeps its cuDNN handles and plans: at exit the CUDA context
// may be gone before static destructors run, and a plan destroyed then
// calls into a torn-down driver.
std::mutex& cache_mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

std::unordered_map<std::string, std::shared_ptr<Entry>>& graph_cache() {
  static auto* entries =
      new std::unordered_map<std::string, std::shared_ptr<Entry>>();
  return *entries;
}

// The cached entry of `key`, built on first use: variants in order (FP32
// scale and bias first, then the activations' dtype where `variants` is 2).
// Each thread builds and runs its own plans, as ATen keeps its cuDNN plan
// cache per thread (a plan is not run from two threads at once, and is
// built with the handle of the thread that runs it). A trainer's forward
// and its backward (autograd's device thread) use keys of their own anyway.
std::shared_ptr<Entry> entry(const std::string& key, const Shape& shape,
                             const Builder& build, int variants,
                             cudnnHandle_t handle) {
  std::ostringstream thread;
  thread << key << " thread " << std::this_thread::get_id();
  const auto cache_key = thread.str();
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& cache = graph_cache();
  auto found = cache.find(cache_key);
  if (found != cache.end()) {
    return found->second;
  }
  auto result = std::make_shared<Entry>();
  result->key = key;
  result->cache_key = cache_key;
  std::string reasons;
  for (int variant = 0; variant < variants; ++variant) {
    const auto scale_type =
        variant == 0 ? fe::DataType_t::FLOAT : data_type(shape.dtype);
    std::string why;
    try {
      auto graph = build(shape, scale_type);
      why = finish(*graph, handle, shape.deterministic);
      if (why.empty()) {
        int64_t workspace = 0;
        const auto status = graph->get_workspace_size(workspace);
        if (status.is_good()) {
          result->graph = graph;
          result->workspace = workspace;
          result->io_scale = variant == 1;
          if (!graph->get_plan_name(result->plan).is_good()) {
            result->plan = "unnamed";
          }
          break;
        }
        why = "workspace size unknown";
      }
    } catch (const std::exception& e) {
      why = e.what();
    }
    reasons += (reasons.empty() ? "" : "; ") + why;
  }
  if (!result->graph) {
    result->refused = "cuDNN refused the graph: " + reasons;
  }
  cache.emplace(cache_key, result);
  return result;
}

cudnnHandle_t current_handle() {
  auto handle = at::native::getCudnnHandle();
  const auto status =
      fe::detail::set_stream(handle, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status == CUDNN_STATUS_SUCCESS, kFoldedConvWho,
              ": cudnnSetStream failed (status ", static_cast<int>(status),
              ").");
  return handle;
}

// Runs `e` inside a profiler scope named `scope` ("lamp::folded_conv_*":
// lamp_bench --profile counts its kernels as the folded class); "" or why
// it failed. A graph that fails to run is refused from then on (the cache
// holds a refused entry for its key), so its layer runs the ATen reference.
std::string execute(const char* scope, const Entry& e, cudnnHandle_t handle,
                    std::unordered_map<int64_t, void*>& pack,
                    const torch::Tensor& like) {
  RECORD_FUNCTION(scope, std::vector<c10::IValue>());
  auto workspace = at::empty({std::max<int64_t>(e.workspace, 1)},
                             like.options().dtype(torch::kByte));
  auto status = e.graph->execute(handle, pack, workspace.data_ptr());
  if (status.is_good()) {
    return "";
  }
  const auto message = status.get_message();
  auto refused = std::make_shared<Entry>();
  refused->key = e.key;
  refused->cache_key = e.cache_key;
  refused->refused = "cuDNN's graph failed to run: " +
                     (message.empty() ? std::string("no message") : message);
  std::lock_guard<std::mutex> lock(cache_mutex());
  graph_cache()[e.cache_key] = refused;
  return refused->refused;
}

torch::Tensor channels_last(const torch::Tensor& t) {
  return t.contiguous(torch::MemoryFormat::ChannelsLast);
}

// The prologue's scale and bias as the graph takes them.
torch::Tensor scale_operand(const torch::Tensor& t, const Entry& e,
                            c10::ScalarType dtype) {
  return (e.io_scale ? t.to(dtype) : t.to(torch::kFloat)).contiguous();
}

std::shared_ptr<fe::graph::Graph> new_graph(const Shape& s,
                                            fe::DataType_t intermediate) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(data_type(s.dtype))
      .set_intermediate_data_type(intermediate)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const Shape& s,
                                                fe::DataType_t scale_type) {
  auto graph = new_graph(s, fe::DataType_t::FLOAT);
  auto x = nhwc_tensor(*graph, "x", kX, s.x);
  auto w = nhwc_tensor(*graph, "w", kW, s.w);
  auto in = s.prologue ? scale_bias_relu(*graph, x, s.x[1], scale_type) : x;
  auto y = graph->conv_fprop(in, w,
                             fe::graph::Conv_fprop_attributes()
                                 .set_padding({s.padding, s.padding})
                                 .set_stride({s.stride, s.stride})
                                 .set_dilation({1, 1}));
  y->set_output(true).set_uid(kY).set_dim(s.y).set_stride(nhwc_strides(s.y));
  auto stats = graph->genstats(y, fe::graph::Genstats_attributes());
  mark_channel_output(stats[0], kSum, s.y[1]);
  mark_channel_output(stats[1], kSumOfSquares, s.y[1]);
  return graph;
}

std::shared_ptr<fe::graph::Graph> dgrad_graph(const Shape& s,
                                              fe::DataType_t /*scale_type*/) {
  auto graph = new_graph(s, fe::DataType_t::FLOAT);
  auto dy = nhwc_tensor(*graph, "dy", kDy, s.y);
  auto w = nhwc_tensor(*graph, "w", kW, s.w);
  auto dgrad = graph->conv_dgrad(dy, w,
                                 fe::graph::Conv_dgrad_attributes()
                                     .set_padding({s.padding, s.padding})
                                     .set_stride({s.stride, s.stride})
                                     .set_dilation({1, 1}));
  dgrad->set_dim(s.x).set_stride(nhwc_strides(s.x));
  const int64_t c = s.x[1];
  const auto fp32 = fe::DataType_t::FLOAT;
  auto x = nhwc_tensor(*graph, "x", kX, s.x);
  auto mean = channel_tensor(*graph, "mean", kMean, c, fp32);
  auto inv_variance =
      channel_tensor(*graph, "inv_variance", kInvVariance, c, fp32);
  auto scale = channel_tensor(*graph, "scale", kScale, c, fp32);
  auto bias = channel_tensor(*graph, "bias", kBias, c, fp32);
  // The prologue's pre-activation, as dbn_weight's pattern writes it:
  // scale (x - mean) inv_variance + bias, with mean 0 and inv_variance 1.
  auto centred = pointwise(*graph, x, mean, fe::PointwiseMode_t::SUB);
  auto normed =
      pointwise(*graph, centred, inv_variance, fe::PointwiseMode_t::MUL);
  auto scaled = pointwise(*graph, normed, scale, fe::PointwiseMode_t::MUL);
  auto pre = pointwise(*graph, scaled, bias, fe::PointwiseMode_t::ADD);
  auto dz = pointwise(*graph, dgrad, pre, fe::PointwiseMode_t::RELU_BWD);
  dz->set_output(true).set_uid(kDz).set_dim(s.x).set_stride(nhwc_strides(s.x));
  auto sums = graph->dbn_weight(dz, x, mean, inv_variance, scale,
                                fe::graph::DBN_weight_attributes());
  mark_channel_output(sums[0], kDScale, c);
  mark_channel_output(sums[1], kDBias, c);
  mark_channel_output(sums[2], kEqScaleDy, c);
  mark_channel_output(sums[3], kEqScaleX, c);
  mark_channel_output(sums[4], kEqBias, c);
  return graph;
}

std::shared_ptr<fe::graph::Graph> wgrad_graph(const Shape& s,
                                              fe::DataType_t scale_type) {
  // cuDNN's own sample of this pattern keeps the intermediates in the
  // activations' dtype; the FP32 variant is tried first.
  auto graph =
      new_graph(s, scale_type == fe::DataType_t::FLOAT ? fe::DataType_t::FLOAT
                                                       : data_type(s.dtype));
  auto x = nhwc_tensor(*graph, "x", kX, s.x);
  auto a = scale_bias_relu(*graph, x, s.x[1], scale_type);
  auto dy = nhwc_tensor(*graph, "dy", kDy, s.y);
  auto dw = graph->conv_wgrad(dy, a,
                              fe::graph::Conv_wgrad_attributes()
                                  .set_padding({s.padding, s.padding})
                                  .set_stride({s.stride, s.stride})
                                  .set_dilation({1, 1}));
  dw->set_output(true).set_uid(kDw).set_dim(s.w).set_stride(nhwc_strides(s.w));
  return graph;
}

// The graph of `kind` for this call and `handle` set to ATen's cuDNN handle
// on the current stream, or nullptr with `why` set. cuDNN is found first:
// the handle's stream is set through it.
std::shared_ptr<Entry> graph_for(const char* kind, const Builder& build,
                                 int variants, const Shape& shape,
                                 const torch::Tensor& like,
                                 cudnnHandle_t& handle, std::string& why) {
  const auto& load = load_reason();
  if (!load.empty()) {
    why = load;
    return nullptr;
  }
  handle = current_handle();
  auto e = entry(key_of(kind, shape, like.get_device()), shape, build, variants,
                 handle);
  if (!e->graph) {
    why = e->refused;
    return nullptr;
  }
  return e;
}

} // namespace

std::string cudnn_graph_unavailable_reason() {
  return load_reason();
}

std::vector<std::string> cudnn_graph_descriptions() {
  std::vector<std::string> lines;
  std::lock_guard<std::mutex> lock(cache_mutex());
  for (const auto& item : graph_cache()) {
    const auto& e = item.second;
    lines.push_back(
        e->key + ": " +
        (e->graph ? "plan " + e->plan + ", scale and bias in " +
                        (e->io_scale ? "the activations' dtype" : "FP32") +
                        ", workspace " + std::to_string(e->workspace) + " bytes"
                  : e->refused));
  }
  std::sort(lines.begin(), lines.end());
  // One line per graph where threads built the same.
  lines.erase(std::unique(lines.begin(), lines.end()), lines.end());
  return lines;
}

bool cudnn_conv_genstats(const torch::Tensor& x_in,
                         const torch::Tensor& weight_in, int64_t stride,
                         int64_t padding, const torch::Tensor& scale,
                         const torch::Tensor& bias, torch::Tensor& y,
                         torch::Tensor& sum, torch::Tensor& sum_of_squares,
                         std::string& why) {
  c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = channels_last(x_in);
  const auto weight = channels_last(weight_in.to(x.scalar_type()));
  const Shape shape = shape_of(x, weight, stride, padding, scale.defined());
  cudnnHandle_t handle = nullptr;
  auto e = graph_for("forward", forward_graph, shape.prologue ? 2 : 1, shape, x,
                     handle, why);
  if (!e) {
    return false;
  }
  y = at::empty(shape.y, x.options(), torch::MemoryFormat::ChannelsLast);
  sum = at::empty({shape.y[1]}, x.options().dtype(torch::kFloat));
  sum_of_squares = at::empty_like(sum);
  std::unordered_map<int64_t, void*> pack = {
      {kX, x.data_ptr()},
      {kW, weight.data_ptr()},
      {kY, y.data_ptr()},
      {kSum, sum.data_ptr()},
      {kSumOfSquares, sum_of_squares.data_ptr()}};
  torch::Tensor s, b;
  if (shape.prologue) {
    s = scale_operand(scale, *e, x.scalar_type());
    b = scale_operand(bias, *e, x.scalar_type());
    pack[kScale] = s.data_ptr();
    pack[kBias] = b.data_ptr();
  }
  why = execute("lamp::folded_conv_forward", *e, handle, pack, x);
  return why.empty();
}

bool cudnn_dgrad_drelu_dscale(const torch::Tensor& dy_in,
                              const torch::Tensor& weight_in,
                              const torch::Tensor& x_in, int64_t stride,
                              int64_t padding, const torch::Tensor& scale,
                              const torch::Tensor& bias, torch::Tensor& dz,
                              torch::Tensor& d_scale, torch::Tensor& d_bias,
                              std::string& why) {
  c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = channels_last(x_in);
  const auto dy = channels_last(dy_in.to(x.scalar_type()));
  const auto weight = channels_last(weight_in.to(x.scalar_type()));
  const Shape shape = shape_of(x, weight, stride, padding, true);
  cudnnHandle_t handle = nullptr;
  auto e = graph_for("dgrad", dgrad_graph, 1, shape, x, handle, why);
  if (!e) {
    return false;
  }
  const int64_t c = shape.x[1];
  const auto fp32 = x.options().dtype(torch::kFloat);
  const auto mean = at::zeros({c}, fp32);
  const auto inv_variance = at::ones({c}, fp32);
  const auto s = scale.to(torch::kFloat).contiguous();
  const auto b = bias.to(torch::kFloat).contiguous();
  dz = at::empty(shape.x, x.options(), torch::MemoryFormat::ChannelsLast);
  d_scale = at::empty({c}, fp32);
  d_bias = at::empty({c}, fp32);
  // dbn_weight's equivalent scales and bias (of a BatchNorm with mean 0 and
  // inverse variance 1): outputs of the pattern, unused here. Each row
  // starts on 16 bytes, as cuDNN takes its tensors (rows of 4-float
  // multiples; the allocator's blocks start on 512).
  const int64_t row = (c + 3) / 4 * 4;
  auto spare = at::empty({3, row}, fp32);
  std::unordered_map<int64_t, void*> pack = {
      {kDy, dy.data_ptr()},
      {kW, weight.data_ptr()},
      {kX, x.data_ptr()},
      {kMean, mean.data_ptr()},
      {kInvVariance, inv_variance.data_ptr()},
      {kScale, s.data_ptr()},
      {kBias, b.data_ptr()},
      {kDz, dz.data_ptr()},
      {kDScale, d_scale.data_ptr()},
      {kDBias, d_bias.data_ptr()},
      {kEqScaleDy, spare[0].data_ptr()},
      {kEqScaleX, spare[1].data_ptr()},
      {kEqBias, spare[2].data_ptr()}};
  why = execute("lamp::folded_conv_dgrad", *e, handle, pack, x);
  return why.empty();
}

bool cudnn_wgrad_prologue(const torch::Tensor& dy_in, const torch::Tensor& x_in,
                          const torch::Tensor& weight, int64_t stride,
                          int64_t padding, const torch::Tensor& scale,
                          const torch::Tensor& bias, torch::Tensor& dw,
                          std::string& why) {
  c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = channels_last(x_in);
  const auto dy = channels_last(dy_in.to(x.scalar_type()));
  const Shape shape = shape_of(x, weight, stride, padding, true);
  cudnnHandle_t handle = nullptr;
  auto e = graph_for("wgrad", wgrad_graph, 2, shape, x, handle, why);
  if (!e) {
    return false;
  }
  dw = at::empty(shape.w, x.options(), torch::MemoryFormat::ChannelsLast);
  const auto s = scale_operand(scale, *e, x.scalar_type());
  const auto b = scale_operand(bias, *e, x.scalar_type());
  std::unordered_map<int64_t, void*> pack = {{kX, x.data_ptr()},
                                             {kScale, s.data_ptr()},
                                             {kBias, b.data_ptr()},
                                             {kDy, dy.data_ptr()},
                                             {kDw, dw.data_ptr()}};
  why = execute("lamp::folded_conv_wgrad", *e, handle, pack, x);
  return why.empty();
}

} // namespace detail
} // namespace lamp
