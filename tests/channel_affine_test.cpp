// The conv level's per-channel elementwise steps (src/ops/channel_affine.h):
// the ATen reference against the expressions it replaced in
// lamp::ops::folded_residual_block and folded_conv's backward, to the bit,
// on the CPU; the CUDA kernel against the reference, to the bit, on a GPU
// (the _CUDA tests).
#include "ops/channel_affine.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "graph_replay.h"
#include "kernel_checks.h"
#include "test_util.h"

namespace {

using lamp::detail::channel_affine;
using lamp::detail::channel_affine_kernel;
using lamp::detail::channel_affine_kernel_unavailable_reason;
using lamp::detail::channel_affine_reference;
using lamp::detail::ChannelAffine;
using lamp::detail::gated_sums;
using lamp::detail::gated_sums_kernel;
using lamp::detail::gated_sums_kernel_unavailable_reason;
using lamp::detail::gated_sums_reference;
using lamp::detail::GatedSums;
using lamp_test::BitEqual;
using lamp_test::SumsAgree;

torch::Tensor pc(const torch::Tensor& t) {
  return t.view({1, -1, 1, 1});
}

struct Operands {
  torch::Tensor y, x, dz, z, scale, bias, scale2, bias2, sum_grad, square_grad;
};

// NCHW values in channels_last memory, `dtype`, on `device`; per-channel
// FP32 scales near 1 and shifts near 0. z has exact zeros and negatives,
// as a ReLU's input-side values would.
Operands make(std::vector<int64_t> shape, torch::Dtype dtype,
              torch::Device device = torch::kCPU, uint64_t seed = 1) {
  torch::manual_seed(seed);
  const auto c = shape[1];
  const auto nhwc = [&](const torch::Tensor& t) {
    return t.to(device, dtype).contiguous(torch::MemoryFormat::ChannelsLast);
  };
  const auto channel = [&](double spread, double mid) {
    return (mid + spread * torch::randn({c})).to(device);
  };
  Operands o;
  o.y = nhwc(torch::randn(shape) * 3 + 0.5);
  o.x = nhwc(torch::randn(shape).relu());
  o.dz = nhwc(torch::randn(shape));
  o.z = nhwc(torch::randn(shape).relu() *
             (torch::rand(shape) > 0.2).to(torch::kFloat));
  o.scale = channel(0.3, 1.0);
  o.bias = channel(0.2, 0.0);
  o.scale2 = channel(0.3, 1.0);
  o.bias2 = channel(0.2, 0.0);
  o.sum_grad = channel(0.5, 0.0);
  o.square_grad = channel(0.05, 0.0);
  return o;
}

// The forms the conv level runs, each as the ATen expression it replaced
// (want) and as a ChannelAffine (op).
struct AffineCase {
  std::string name;
  ChannelAffine op;
  torch::Tensor like, want;
};

std::vector<AffineCase> cases(const Operands& o) {
  const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
  const auto dtype = o.y.scalar_type();
  std::vector<AffineCase> out;
  {
    // A block's end with the identity shortcut.
    AffineCase k{"block end, identity", {}, o.y, {}};
    k.op.u = o.y;
    k.op.u_scale = o.scale;
    k.op.u_shift = o.bias;
    k.op.v = o.x;
    k.op.relu = true;
    k.want = torch::relu(f(o.y) * pc(o.scale) + pc(o.bias) + f(o.x)).to(dtype);
    out.push_back(k);
  }
  {
    // A block's end with a projection shortcut's BatchNorm.
    AffineCase k{"block end, projection", {}, o.y, {}};
    k.op.u = o.y;
    k.op.u_scale = o.scale;
    k.op.u_shift = o.bias;
    k.op.v = o.x;
    k.op.v_scale = o.scale2;
    k.op.v_shift = o.bias2;
    k.op.relu = true;
    const auto residual = f(o.x) * pc(o.scale2) + pc(o.bias2);
    k.want =
        torch::relu(f(o.y) * pc(o.scale) + pc(o.bias) + residual).to(dtype);
    out.push_back(k);
  }
  for (const bool own : {true, false}) {
    // The statistics' gradients folded into the output's, with and without
    // the output's own gradient (zeros).
    AffineCase k{
        own ? "output gradient" : "output gradient from the sums alone",
        {},
        o.y,
        {}};
    if (own) {
      k.op.u = o.dz;
    }
    k.op.u_shift = o.sum_grad;
    k.op.v = o.y;
    k.op.v_scale = 2.0 * o.square_grad;
    auto g = own ? f(o.dz) : torch::zeros_like(o.y, torch::kFloat);
    g = g + pc(o.sum_grad);
    g = g + 2.0 * pc(o.square_grad) * f(o.y);
    k.want = g.to(dtype);
    out.push_back(k);
  }
  {
    // A prologue's scale on the data gradient.
    AffineCase k{"input gradient", {}, o.x, {}};
    k.op.u = o.dz;
    k.op.u_scale = o.scale;
    k.want = (f(o.dz) * pc(o.scale)).to(dtype);
    out.push_back(k);
  }
  for (const bool scaled : {true, false}) {
    // A block end's backward: the ReLU's gate, then the scale (the
    // identity shortcut's gradient: the gate alone).
    AffineCase k{
        scaled ? "block end gradient" : "shortcut gradient", {}, o.y, {}};
    k.op.u = o.dz;
    k.op.gate = o.z;
    auto g = at::threshold_backward(f(o.dz), f(o.z), 0);
    if (scaled) {
      k.op.u_scale = o.scale;
      g = g * pc(o.scale);
    }
    k.want = g.to(dtype);
    out.push_back(k);
  }
  return out;
}

TEST(ChannelAffine, ReferenceIsTheExpressionsItReplaced) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto o = make({2, 6, 3, 5}, dtype);
    for (const auto& k : cases(o)) {
      SCOPED_TRACE(k.name + std::string(", ") + c10::toString(dtype));
      const auto got = channel_affine_reference(k.op, k.like);
      EXPECT_TRUE(BitEqual(got, k.want));
      EXPECT_TRUE(got.is_contiguous(torch::MemoryFormat::ChannelsLast));
    }
  }
}

TEST(ChannelAffine, GateAndReluKeepTheirOpsMeaning) {
  // A gate of 0, -1 or NaN stops the value; a positive gate passes it. The
  // ReLU keeps a NaN, as ATen's does.
  const auto nan = std::numeric_limits<float>::quiet_NaN();
  const auto u =
      torch::tensor({1.5f, -2.0f, 3.0f, 4.0f, nan, -1.0f}).view({1, 6, 1, 1});
  const auto gate =
      torch::tensor({1.0f, 0.5f, 0.0f, -1.0f, 2.0f, nan}).view({1, 6, 1, 1});
  ChannelAffine gated;
  gated.u = u;
  gated.gate = gate;
  const auto g = channel_affine_reference(gated, u).flatten();
  const std::vector<float> want_gated = {1.5f, -2.0f, 0.0f, 0.0f, nan, 0.0f};
  for (size_t i = 0; i < want_gated.size(); ++i) {
    const float v = g[static_cast<int64_t>(i)].item<float>();
    if (std::isnan(want_gated[i])) {
      EXPECT_TRUE(std::isnan(v)) << i;
    } else {
      EXPECT_EQ(v, want_gated[i]) << i;
    }
  }
  ChannelAffine relu;
  relu.u = u;
  relu.relu = true;
  const auto r = channel_affine_reference(relu, u).flatten();
  EXPECT_EQ(r[0].item<float>(), 1.5f);
  EXPECT_EQ(r[1].item<float>(), 0.0f);
  EXPECT_TRUE(std::isnan(r[4].item<float>()));
}

TEST(ChannelAffine, OnTheCpuTheReferenceRunsAndSaysWhyNotTheKernel) {
  const auto o = make({2, 8, 2, 2}, torch::kFloat);
  const auto k = cases(o).front();
  const auto why = channel_affine_kernel_unavailable_reason(k.op, k.like);
  EXPECT_FALSE(why.empty());
  std::string said = "not set";
  const auto got = channel_affine(k.op, k.like, /*use_kernel=*/true, &said);
  EXPECT_EQ(said, why);
  EXPECT_TRUE(BitEqual(got, k.want));
  // Not wanted: no reason given.
  channel_affine(k.op, k.like, /*use_kernel=*/false, &said);
  EXPECT_EQ(said, "");
  EXPECT_THROW(channel_affine_kernel(k.op, k.like), c10::Error);
}

// The block end's sums as its backward wrote them before gated_sums():
// autograd's ReLU gate, then a sum per product.
GatedSums sums_as_written(const Operands& o, bool with_a, bool with_b) {
  const auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
  const auto g = at::threshold_backward(f(o.dz), f(o.z), 0);
  GatedSums want;
  want.g = g.sum({0, 2, 3});
  if (with_a) {
    want.ga = (g * f(o.y)).sum({0, 2, 3});
  }
  if (with_b) {
    want.gb = (g * f(o.x)).sum({0, 2, 3});
  }
  return want;
}

TEST(ChannelAffine, GatedSumsReferenceIsTheBlockEndsSums) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto o = make({3, 5, 4, 2}, dtype);
    const auto got = gated_sums_reference(o.dz, o.z, o.y, o.x);
    const auto want = sums_as_written(o, true, true);
    EXPECT_TRUE(BitEqual(got.g, want.g));
    EXPECT_TRUE(BitEqual(got.ga, want.ga));
    EXPECT_TRUE(BitEqual(got.gb, want.gb));
    const auto plain = gated_sums_reference(o.dz, o.z, {}, {});
    EXPECT_TRUE(BitEqual(plain.g, want.g));
    EXPECT_FALSE(plain.ga.defined());
    EXPECT_FALSE(plain.gb.defined());
    // Without a gate every value counts.
    const auto ungated = gated_sums_reference(o.dz, {}, {}, {});
    EXPECT_TRUE(BitEqual(ungated.g, o.dz.to(torch::kFloat).sum({0, 2, 3})));
  }
  const auto o = make({2, 4, 2, 2}, torch::kFloat);
  std::string why = "not set";
  const auto got = gated_sums(o.dz, o.z, o.y, {}, /*use_kernel=*/true, &why);
  EXPECT_EQ(why, gated_sums_kernel_unavailable_reason(o.dz, o.z, o.y, {}));
  EXPECT_FALSE(why.empty());
  EXPECT_TRUE(BitEqual(got.ga, sums_as_written(o, true, false).ga));
}

TEST(ChannelAffine, GatedSumsKernelMatchesTheReference_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  // 3 and 320 channels: a partial warp, and more channels than threads.
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const int64_t channels : {64, 3, 320}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + ", " +
                   std::to_string(channels) + " channels");
      const auto o = make({4, channels, 9, 7}, dtype, cuda, 6);
      ASSERT_EQ(gated_sums_kernel_unavailable_reason(o.dz, o.z, o.y, o.x), "");
      const auto got = gated_sums_kernel(o.dz, o.z, o.y, o.x);
      const auto want = gated_sums_reference(o.dz, o.z, o.y, o.x);
      const auto f = [](const torch::Tensor& t) {
        return t.to(torch::kFloat).abs();
      };
      const auto gabs = at::threshold_backward(f(o.dz), f(o.z), 0);
      EXPECT_TRUE(SumsAgree(got.g, want.g, gabs.sum({0, 2, 3})));
      EXPECT_TRUE(SumsAgree(got.ga, want.ga, (gabs * f(o.y)).sum({0, 2, 3})));
      EXPECT_TRUE(SumsAgree(got.gb, want.gb, (gabs * f(o.x)).sum({0, 2, 3})));
      // The same bits run to run.
      const auto again = gated_sums_kernel(o.dz, o.z, o.y, o.x);
      EXPECT_TRUE(BitEqual(again.ga, got.ga));
      // Without a and b: the plain sum only; without the gate: every value.
      const auto plain = gated_sums_kernel(o.dz, o.z, {}, {});
      EXPECT_TRUE(BitEqual(plain.g, got.g));
      EXPECT_FALSE(plain.ga.defined());
      const auto ungated = gated_sums_kernel(o.dz, {}, {}, {});
      EXPECT_TRUE(SumsAgree(ungated.g, o.dz.to(torch::kFloat).sum({0, 2, 3}),
                            f(o.dz).sum({0, 2, 3})));
    }
  }
}

TEST(ChannelAffine, KernelMatchesTheReference_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  // 64 channels: 16-byte loads in every dtype; 12: in FP32 only (4 a
  // load); 3: one value at a time. 2 x 3 x 7 x 5: an odd count of pixels.
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16}) {
    for (const int64_t channels : {64, 12, 3}) {
      const auto o = make({2, channels, 7, 5}, dtype, cuda, 3);
      for (const auto& k : cases(o)) {
        SCOPED_TRACE(k.name + ", " + c10::toString(dtype) + ", " +
                     std::to_string(channels) + " channels");
        ASSERT_EQ(channel_affine_kernel_unavailable_reason(k.op, k.like), "");
        const auto got = channel_affine_kernel(k.op, k.like);
        EXPECT_TRUE(BitEqual(got, channel_affine_reference(k.op, k.like)));
        EXPECT_TRUE(BitEqual(got, k.want));
        EXPECT_TRUE(got.is_contiguous(torch::MemoryFormat::ChannelsLast));
      }
    }
  }
}

TEST(ChannelAffine, KernelTakesMisalignedTensorsOneValueAtATime_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const auto o = make({2, 64, 4, 4}, torch::kHalf, cuda, 4);
  // The same values one element into a buffer: channels_last, 2 bytes off
  // a 16-byte boundary.
  const auto shifted = [](const torch::Tensor& t) {
    auto buffer = torch::empty({t.numel() + 1}, t.options());
    auto view = buffer.narrow(0, 1, t.numel())
                    .view({t.size(0), t.size(2), t.size(3), t.size(1)})
                    .permute({0, 3, 1, 2});
    view.copy_(t);
    return view;
  };
  for (const auto& k : cases(o)) {
    SCOPED_TRACE(k.name);
    auto op = k.op;
    for (auto* t : {&op.u, &op.gate, &op.v}) {
      if (t->defined()) {
        *t = shifted(*t);
        ASSERT_TRUE(t->is_contiguous(torch::MemoryFormat::ChannelsLast));
      }
    }
    EXPECT_TRUE(BitEqual(channel_affine_kernel(op, k.like), k.want));
  }
}

TEST(ChannelAffine, KernelRefusesWhatItCannotTake_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  const auto o = make({2, 8, 3, 3}, torch::kHalf, cuda);
  const auto k = cases(o).front();
  auto nchw = k.op;
  nchw.u = k.op.u.contiguous();
  EXPECT_NE(channel_affine_kernel_unavailable_reason(nchw, k.like)
                .find("not channels_last"),
            std::string::npos);
  auto mixed = k.op;
  mixed.v = k.op.v.to(torch::kFloat);
  EXPECT_NE(
      channel_affine_kernel_unavailable_reason(mixed, k.like).find("dtype"),
      std::string::npos);
  auto half_scale = k.op;
  half_scale.u_scale = k.op.u_scale.to(torch::kHalf);
  EXPECT_NE(
      channel_affine_kernel_unavailable_reason(half_scale, k.like).find("FP32"),
      std::string::npos);
  auto doubles = cases(make({2, 8, 3, 3}, torch::kDouble, cuda)).front();
  EXPECT_NE(channel_affine_kernel_unavailable_reason(doubles.op, doubles.like)
                .find("not Double"),
            std::string::npos);
  // channel_affine() then runs the reference, and says why.
  std::string why;
  const auto got = channel_affine(nchw, k.like, /*use_kernel=*/true, &why);
  EXPECT_FALSE(why.empty());
  EXPECT_TRUE(BitEqual(got, k.want));
}

TEST(ChannelAffine, KernelReplaysInACapturedGraph_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const torch::Device cuda(torch::kCUDA);
  auto o = make({4, 64, 8, 8}, torch::kHalf, cuda, 5);
  auto k = cases(o)[1]; // the projection's block end
  torch::Tensor out;
  GatedSums sums;
  const auto step = [&] {
    out = channel_affine_kernel(k.op, k.like);
    sums = gated_sums_kernel(o.dz, o.z, o.y, o.x);
  };
  lamp_test::capture_refill_replay(cuda, step, [&] {
    k.op.u.copy_(torch::randn_like(k.op.u));
    k.op.u_scale.copy_(torch::rand_like(k.op.u_scale));
    o.dz.copy_(torch::randn_like(o.dz));
  });
  EXPECT_TRUE(BitEqual(out, channel_affine_reference(k.op, k.like)));
  // The sums of the new gradient: the same bits as a call outside the graph.
  const auto fresh = gated_sums_kernel(o.dz, o.z, o.y, o.x);
  EXPECT_TRUE(BitEqual(sums.g, fresh.g));
  EXPECT_TRUE(BitEqual(sums.gb, fresh.gb));
}

} // namespace
