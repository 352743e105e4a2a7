#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "lamp/amp/autocast.h"
#include "test_util.h"

namespace {

using lamp::Autocast;
using lamp_test::expect_error;

TEST(Autocast, DefaultDtypeIsBf16OnCpuAndFp16OnCuda) {
  EXPECT_EQ(Autocast::default_dtype(torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(Autocast::default_dtype(torch::kCUDA), torch::kHalf);
  Autocast guard(torch::kCPU);
  EXPECT_EQ(guard.dtype(), torch::kBFloat16);
  EXPECT_EQ(Autocast::current_dtype(torch::kCPU), torch::kBFloat16);
}

TEST(Autocast, NestsAndRestoresTheEnclosingState) {
  ASSERT_FALSE(Autocast::is_enabled(torch::kCPU));
  const bool cache_before = at::autocast::is_autocast_cache_enabled();
  {
    Autocast outer(torch::kCPU);
    EXPECT_TRUE(Autocast::is_enabled(torch::kCPU));
    EXPECT_FALSE(Autocast::is_enabled(torch::kCUDA));
    {
      Autocast off(torch::kCPU, c10::nullopt, /*enabled=*/false,
                   /*cache_enabled=*/false);
      EXPECT_FALSE(Autocast::is_enabled(torch::kCPU));
      EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
      {
        Autocast on_again(torch::kCPU);
        EXPECT_TRUE(Autocast::is_enabled(torch::kCPU));
      }
      EXPECT_FALSE(Autocast::is_enabled(torch::kCPU));
    }
    EXPECT_TRUE(Autocast::is_enabled(torch::kCPU));
    EXPECT_EQ(at::autocast::is_autocast_cache_enabled(), cache_before);
  }
  EXPECT_FALSE(Autocast::is_enabled(torch::kCPU));
  EXPECT_EQ(at::autocast::is_autocast_cache_enabled(), cache_before);
}

TEST(Autocast, RestoresStateWhenAnExceptionLeavesTheScope) {
  try {
    Autocast guard(torch::kCPU);
    ASSERT_TRUE(Autocast::is_enabled(torch::kCPU));
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(Autocast::is_enabled(torch::kCPU));
  // The nesting count came back to zero as well.
  EXPECT_EQ(at::autocast::increment_nesting(), 1);
  EXPECT_EQ(at::autocast::decrement_nesting(), 0);
}

// Autocast state is plain thread-local data, so the CUDA settings can be
// checked without a GPU.
TEST(Autocast, InheritsDtypeAndCacheFlagFromTheEnclosingGuard) {
  ASSERT_EQ(Autocast::current_dtype(torch::kCUDA), torch::kHalf);
  {
    Autocast outer(torch::kCUDA, torch::kBFloat16, true,
                   /*cache_enabled=*/false);
    {
      Autocast inner(torch::kCUDA);
      EXPECT_EQ(inner.dtype(), torch::kBFloat16);
      EXPECT_EQ(Autocast::current_dtype(torch::kCUDA), torch::kBFloat16);
      EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
      {
        Autocast fp16(torch::kCUDA, torch::kHalf, true, /*cache_enabled=*/true);
        EXPECT_EQ(Autocast::current_dtype(torch::kCUDA), torch::kHalf);
        EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
      }
      EXPECT_EQ(Autocast::current_dtype(torch::kCUDA), torch::kBFloat16);
      EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
    }
  }
  EXPECT_EQ(Autocast::current_dtype(torch::kCUDA), torch::kHalf);
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
  EXPECT_FALSE(Autocast::is_enabled(torch::kCUDA));
}

TEST(Autocast, DisabledGuardAcceptsAnyDtype) {
  for (auto dtype : {torch::kFloat, torch::kHalf, torch::kDouble}) {
    Autocast off(torch::kCPU, dtype, /*enabled=*/false);
    EXPECT_FALSE(Autocast::is_enabled(torch::kCPU));
  }
  EXPECT_EQ(Autocast::current_dtype(torch::kCPU), torch::kBFloat16);
}

TEST(Autocast, ConvRunsInBf16AndTheWeightGradientStaysFP32) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3));
  const auto x = torch::randn({2, 3, 8, 8});
  torch::Tensor y;
  {
    Autocast guard(torch::kCPU);
    y = conv(x);
  }
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  y.to(torch::kFloat).sum().backward();
  EXPECT_EQ(conv->weight.grad().scalar_type(), torch::kFloat);
  // Same math as an explicit BF16 conv, to BF16's resolution (2^-8 relative).
  const auto reference =
      torch::conv2d(x.to(torch::kBFloat16), conv->weight.to(torch::kBFloat16),
                    conv->bias.to(torch::kBFloat16));
  EXPECT_TRUE(lamp_test::AllClose(y, reference, 1e-2, 1e-2));
}

// The cast cache keeps the BF16 copy of a leaf weight until the outermost
// guard ends: inside one region an in-place weight update is not seen; a new
// region sees it.
TEST(Autocast, ClearsTheCastCacheAtTheOutermostExit) {
  const auto x = torch::ones({1, 2});
  auto w = torch::ones({2, 2}).requires_grad_();
  float stale = 0, fresh = 0;
  {
    Autocast guard(torch::kCPU);
    torch::mm(x, w);
    {
      torch::NoGradGuard no_grad;
      w.mul_(2);
    }
    {
      Autocast inner(torch::kCPU); // nested: the cache survives its end
    }
    stale = torch::mm(x, w).sum().item<float>();
  }
  {
    Autocast guard(torch::kCPU);
    fresh = torch::mm(x, w).sum().item<float>();
  }
  EXPECT_EQ(stale, 4.0f);
  EXPECT_EQ(fresh, 8.0f);
  {
    Autocast uncached(torch::kCPU, c10::nullopt, true, /*cache_enabled=*/false);
    torch::mm(x, w);
    {
      torch::NoGradGuard no_grad;
      w.mul_(2);
    }
    EXPECT_EQ(torch::mm(x, w).sum().item<float>(), 16.0f);
  }
}

TEST(Autocast, RefusesUnsupportedDtypesAndDevicesBeforeChangingState) {
  EXPECT_THROW(Autocast(torch::kCPU, torch::kFloat), c10::Error);
  EXPECT_THROW(Autocast(torch::kCUDA, torch::kDouble), c10::Error);
  EXPECT_THROW(Autocast(torch::kMeta), c10::Error);
  // A device autocast does not know is named, whatever the dtype.
  expect_error(
      [] { Autocast guard(torch::kMeta, torch::kHalf); },
      "device type meta is not supported; use torch::kCPU or torch::kCUDA");
  expect_error(
      [] { Autocast guard(torch::kMeta, torch::kBFloat16, /*enabled=*/false); },
      "device type meta is not supported");
  EXPECT_FALSE(Autocast::is_enabled(torch::kCPU));
  if (Autocast::is_supported(torch::kCPU, torch::kHalf)) {
    Autocast guard(torch::kCPU, torch::kHalf);
    EXPECT_EQ(Autocast::current_dtype(torch::kCPU), torch::kHalf);
  } else {
    try {
      Autocast guard(torch::kCPU, torch::kHalf);
      FAIL() << "FP16 CPU autocast accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("use torch::kBFloat16 on CPU"),
                std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(Autocast::is_enabled(torch::kCPU));
    EXPECT_EQ(Autocast::current_dtype(torch::kCPU), torch::kBFloat16);
  }
}

TEST(Autocast, StateIsPerThread) {
  Autocast guard(torch::kCPU);
  bool other_thread_enabled = true;
  std::thread([&] {
    other_thread_enabled = Autocast::is_enabled(torch::kCPU);
  }).join();
  EXPECT_FALSE(other_thread_enabled);
}

TEST(Autocast, MatmulRunsInFp16OnGpu_CUDA) {
  LAMP_SKIP_WITHOUT_CUDA();
  const auto a = torch::randn({8, 8}, torch::kCUDA);
  torch::Tensor y;
  {
    Autocast guard(torch::kCUDA);
    EXPECT_TRUE(Autocast::is_enabled(torch::kCUDA));
    EXPECT_FALSE(Autocast::is_enabled(torch::kCPU));
    y = torch::mm(a, a);
  }
  EXPECT_EQ(y.scalar_type(), torch::kHalf);
  EXPECT_FALSE(Autocast::is_enabled(torch::kCUDA));
  {
    Autocast guard(torch::kCUDA, torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  }
}

} // namespace
