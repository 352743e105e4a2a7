// lamp_bench --profile's sums (bench/profile_table.h) on made-up profiled
// steps whose times are round numbers.
#include "profile_table.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lamp_bench {
namespace {

ProfiledEvent host(const std::string& name, int64_t start_us,
                   int64_t duration_us, uint64_t correlation = 0) {
  ProfiledEvent e;
  e.name = name;
  e.thread = 1;
  e.start_ns = start_us * 1000;
  e.duration_ns = duration_us * 1000;
  e.correlation = correlation;
  return e;
}

ProfiledEvent device(const std::string& name, int64_t start_us,
                     int64_t duration_us, uint64_t linked) {
  ProfiledEvent e = host(name, start_us, duration_us);
  e.device = true;
  e.thread = 7;
  e.correlation = 0;
  e.linked_correlation = linked;
  return e;
}

// `text` has `line` (a table row, or its start).
void expect_line(const std::string& text, const std::string& line) {
  EXPECT_NE(text.find(line), std::string::npos) << "'" << line << "' in\n"
                                                << text;
}

const ClassRow& row(const ProfileTable& table, KernelClass c) {
  for (const auto& r : table.rows) {
    if (r.kernel_class == c) {
      return r;
    }
  }
  throw std::runtime_error("no row");
}

// One CPU step of 100 us: forward (conv 20, BatchNorm 10, ReLU 5, mm 3),
// backward (the first layer's convolution 25), update (SGD's add_ 5, a
// master-weight copy 5), the rest outside ops.
std::vector<ProfiledEvent> cpu_step() {
  const std::vector<int64_t> input = {8, 3, 32, 32};
  std::vector<ProfiledEvent> events = {
      host(kStepScope, 0, 100),
      host(kForwardScope, 0, 40),
      host("aten::conv2d", 0, 20),
      host("aten::mkldnn_convolution", 1, 18),
      host("aten::batch_norm", 20, 10),
      host("aten::native_batch_norm", 21, 8),
      host("aten::relu_", 30, 5),
      host("aten::mm", 35, 3),
      host("autograd::engine::evaluate_function: ConvolutionBackward0", 45, 25),
      host("aten::convolution_backward", 46, 23),
      host("aten::add_", 75, 5),
      host("aten::copy_", 80, 5),
  };
  events[2].flops = 28311552;
  events[2].shapes = {input, {64, 3, 3, 3}};
  events[2].dtypes = {"float", "float"};
  events[5].shapes = {{8, 64, 32, 32}, {64}, {64}, {64}, {64}};
  events[5].dtypes = {"float", "float", "float", "float", "float"};
  events[6].shapes = {{8, 64, 32, 32}};
  events[6].dtypes = {"float"};
  events[9].shapes = {{8, 64, 32, 32}, input, {64, 3, 3, 3}};
  events[9].dtypes = {"float", "float", "float"};
  events[10].shapes = {{1000}, {1000}, {}};
  events[10].dtypes = {"float", "float", "Scalar"};
  events[11].shapes = {{1000}, {1000}, {}};
  events[11].dtypes = {"c10::BFloat16", "float", "Scalar"};
  return events;
}

TEST(ProfileSummary, CpuOpsByOutermostClassAndPhase) {
  ProfileRun run;
  run.steps = 1;
  run.seconds = 100e-6;
  run.input_shape = {8, 3, 32, 32};
  const auto table = summarize(cpu_step(), run);
  ASSERT_EQ(table.rows.size(), kernel_classes().size());
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvForward).seconds, 20e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kBatchNorm).seconds, 10e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kElementwise).seconds, 5e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvBackward).seconds, 25e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kOptimizer).seconds, 5e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kCopy).seconds, 5e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kMatmul).seconds, 3e-6);
  EXPECT_NEAR(row(table, KernelClass::kOther).seconds, 0, 1e-12);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvDgrad).seconds, 0);
  EXPECT_NEAR(table.unaccounted_seconds, 27e-6, 1e-12);

  // Forward FLOPs from the profiler, over the whole op.
  const auto& conv = row(table, KernelClass::kConvForward);
  EXPECT_DOUBLE_EQ(conv.flops, 28311552);
  EXPECT_DOUBLE_EQ(conv.rated_seconds, 20e-6);
  // The batch's convolution computes the weight gradient only.
  const auto& backward = row(table, KernelClass::kConvBackward);
  EXPECT_DOUBLE_EQ(backward.flops, 28311552);
  EXPECT_DOUBLE_EQ(backward.rated_seconds, 25e-6);
  // BatchNorm's bytes over native_batch_norm's 8 us.
  const auto& bn = row(table, KernelClass::kBatchNorm);
  EXPECT_DOUBLE_EQ(bn.bytes, 2.0 * 8 * 64 * 32 * 32 * 4 + 4 * 64 * 4);
  EXPECT_DOUBLE_EQ(bn.rated_seconds, 8e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kOptimizer).bytes, 3 * 4000);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kCopy).bytes, 2000 + 4000);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kOther).rated_seconds, 0);
  // aten::mm has no FLOP estimate here: no rate.
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kMatmul).rated_seconds, 0);
}

// A Linear layer's step on the CPU: the forward's addmm under aten::linear,
// the backward node's two products (dX and dW). The class's FLOPs are the
// products' estimates summed, each once.
TEST(ProfileSummary, CpuMatmulFlopsSumTheProducts) {
  std::vector<ProfiledEvent> events = {
      host(kStepScope, 0, 100),
      host(kForwardScope, 0, 30),
      host("aten::linear", 0, 20),
      host("aten::t", 1, 1),
      host("aten::addmm", 3, 16),
      host("aten::log_softmax", 20, 5),
      host("autograd::engine::evaluate_function: AddmmBackward0", 40, 30),
      host("aten::mm", 41, 14),
      host("aten::mm", 56, 13),
  };
  events[4].flops = 1000000;
  events[7].flops = 1000000;
  events[8].flops = 1000000;
  ProfileRun run;
  run.steps = 1;
  run.seconds = 100e-6;
  const auto table = summarize(events, run);
  const auto& matmul = row(table, KernelClass::kMatmul);
  EXPECT_DOUBLE_EQ(matmul.seconds, 50e-6);
  EXPECT_DOUBLE_EQ(matmul.flops, 3000000);
  EXPECT_DOUBLE_EQ(matmul.rated_seconds, 50e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kSoftmaxLoss).seconds, 5e-6);
  const auto text = format_table(table);
  // 3 MFLOP in 50 us: 0.06 TFLOP/s.
  expect_line(text,
              "matmul             0.050   50.0%    0.060        -   100%");
}

TEST(ProfileSummary, CpuHiddenConvolutionComputesBothGradients) {
  ProfileRun run;
  run.steps = 1;
  run.seconds = 100e-6;
  run.input_shape = {8, 1, 28, 28}; // another batch: layer 1 is hidden
  const auto table = summarize(cpu_step(), run);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvBackward).flops,
                   2.0 * 28311552);
}

TEST(ProfileSummary, CpuNestingToleratesMicrosecondRounding) {
  // LibTorch 1.13 measured aten::convolution ending 1 us after its
  // aten::conv2d: still its child. The next op starts where conv2d ends.
  std::vector<ProfiledEvent> events = {
      host(kStepScope, 0, 100), host(kForwardScope, 0, 100),
      host("aten::conv2d", 0, 50), host("aten::convolution", 7, 44),
      host("aten::relu_", 50, 10)};
  ProfileRun run;
  run.seconds = 100e-6;
  const auto table = summarize(events, run);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvForward).seconds, 50e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kElementwise).seconds, 10e-6);
}

// One CUDA step: kernels linked to the ops that launched them.
TEST(ProfileSummary, CudaKernelsByNameThenLaunchingOp) {
  std::vector<ProfiledEvent> events = {
      host(kStepScope, 0, 50, 1),
      host(kForwardScope, 0, 20, 2),
      host("aten::conv2d", 0, 10, 3),
      host("aten::cudnn_convolution", 1, 8, 4),
      host("aten::relu_", 10, 2, 5),
      host("autograd::engine::evaluate_function: ConvolutionBackward0", 20, 10,
           6),
      host("aten::convolution_backward", 21, 8, 7),
      host("aten::add_", 35, 2, 8),
  };
  events[2].flops = 4000000;
  events[4].shapes = {{1000}};
  events[4].dtypes = {"c10::BFloat16"};
  events[6].shapes = {{2, 10, 5}, {2, 10, 5}, {10, 10, 10, 10}};
  events[6].dtypes = {"float", "float", "float"};
  events[7].shapes = {{1000}, {1000}, {}};
  events[7].dtypes = {"float", "float", "Scalar"};
  events.push_back(device("sm90_xmma_fprop_implicit_gemm_x", 100, 4, 4));
  events.push_back(device("nchwToNhwcKernel", 104, 1, 4));
  events.push_back(device("vectorized_elementwise_kernel<relu>", 105, 1, 5));
  events.push_back(device("sm90_xmma_dgrad_implicit_gemm_x", 106, 3, 7));
  events.push_back(device("sm90_xmma_wgrad_implicit_gemm_x", 109, 2, 7));
  events.push_back(device("sm90_xmma_gemm_x", 111, 5, 7));
  events.push_back(device("vectorized_elementwise_kernel<add>", 116, 2, 8));
  // A replayed CUDA graph's kernel: no op.
  events.push_back(device("sm90_xmma_fprop_implicit_gemm_y", 118, 6, 0));
  // A CUDA runtime call's id is CUPTI's: it may equal an op's, and is no op.
  events.insert(events.begin(), host("cudaLaunchKernel", 35, 1, 4));
  ProfileRun run;
  run.device_kernels = true;
  run.steps = 2;
  run.seconds = 50e-6;
  const auto table = summarize(events, run);
  const auto& conv = row(table, KernelClass::kConvForward);
  EXPECT_DOUBLE_EQ(conv.seconds, 11e-6); // fprop 4 + layout 1 + graph 6
  EXPECT_DOUBLE_EQ(conv.flops, 4000000);
  EXPECT_DOUBLE_EQ(conv.rated_seconds, 5e-6);
  const double per_direction = 2.0 * 100 * 1000;
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvDgrad).seconds, 3e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvDgrad).flops, per_direction);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvWgrad).flops, per_direction);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvBackward).seconds, 5e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvBackward).rated_seconds, 0);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kElementwise).seconds, 1e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kElementwise).bytes, 4000);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kOptimizer).seconds, 2e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kOptimizer).bytes, 12000);
  EXPECT_NEAR(table.unaccounted_seconds, 50e-6 - 24e-6, 1e-12);
  // The GEMM the convolution's backward launched is the convolution's.
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kMatmul).seconds, 0);
}

// The kernels of lamp::folded_conv's graphs are the folded class whatever
// their names say; the same names outside its scopes keep theirs.
TEST(ProfileSummary, CudaFoldedConvolutionKernelsByScope) {
  std::vector<ProfiledEvent> events = {
      host(kStepScope, 0, 50, 1),
      host(kForwardScope, 0, 20, 2),
      host("lamp::folded_conv_forward", 0, 10, 3),
      host("aten::conv2d", 10, 5, 4),
      host("autograd::engine::evaluate_function: FoldedConvFunctionBackward",
           20, 10, 5),
      host("lamp::folded_conv_dgrad", 21, 4, 6),
  };
  events.push_back(device("sm90_xmma_fprop_implicit_gemm_genstats", 100, 4, 3));
  events.push_back(device("sm90_xmma_fprop_implicit_gemm_x", 104, 2, 4));
  events.push_back(device("sm90_xmma_dgrad_implicit_gemm_x", 106, 3, 6));
  ProfileRun run;
  run.device_kernels = true;
  run.steps = 1;
  run.seconds = 50e-6;
  const auto table = summarize(events, run);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvBatchNorm).seconds, 7e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvForward).seconds, 2e-6);
  EXPECT_DOUBLE_EQ(row(table, KernelClass::kConvDgrad).seconds, 0);
}

// A GEMM kernel launched by a Linear's addmm is a matmul with the op's
// FLOPs; a replayed graph's GEMM (no op) is a matmul without a rate.
TEST(ProfileSummary, CudaGemmKernelsOfLinearLayers) {
  std::vector<ProfiledEvent> events = {
      host(kStepScope, 0, 50, 1),
      host(kForwardScope, 0, 20, 2),
      host("aten::linear", 0, 10, 3),
      host("aten::addmm", 1, 8, 4),
  };
  events[3].flops = 8000000;
  events.push_back(
      device("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_NNT", 100, 4, 4));
  events.push_back(device("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 120, 6, 0));
  ProfileRun run;
  run.device_kernels = true;
  run.steps = 1;
  run.seconds = 50e-6;
  const auto table = summarize(events, run);
  const auto& matmul = row(table, KernelClass::kMatmul);
  EXPECT_DOUBLE_EQ(matmul.seconds, 10e-6);
  EXPECT_DOUBLE_EQ(matmul.flops, 8000000);
  EXPECT_DOUBLE_EQ(matmul.rated_seconds, 4e-6);
}

TEST(ProfileTopKernels, LargestFirstPerStep) {
  std::vector<ProfiledEvent> events = {
      host("aten::addmm", 0, 8, 4),   device("gemm_b", 0, 3, 4),
      device("gemm_a", 10, 3, 4),     device("layer_norm", 20, 1, 0),
      device("flash_fwd", 30, 6, 0),  device("layer_norm", 40, 1, 0),
      device("layer_norm", 50, 1, 0), device("layer_norm", 60, 1, 0),
  };
  ProfileRun run;
  run.device_kernels = true;
  run.steps = 2;
  run.seconds = 40e-6;
  const auto top = top_kernels(events, run, 3);
  ASSERT_EQ(top.size(), 3U);
  EXPECT_EQ(top[0].name, "flash_fwd");
  EXPECT_DOUBLE_EQ(top[0].seconds, 6e-6);
  EXPECT_EQ(top[1].name, "layer_norm");
  EXPECT_EQ(top[1].launches, 4);
  EXPECT_DOUBLE_EQ(top[1].seconds, 4e-6);
  EXPECT_EQ(top[2].name, "gemm_a"); // a tie with gemm_b: by name
  const auto text = format_top_kernels(top, run);
  // Per step: 3 us of 20, half a launch.
  expect_line(text, "    0.003   15.0%      0.5  flash_fwd\n");
  expect_line(text, "    0.002   10.0%      2.0  layer_norm\n");
  // The host op is no kernel; on the CPU there are none.
  run.device_kernels = false;
  EXPECT_TRUE(top_kernels(events, run, 3).empty());
  EXPECT_EQ(format_top_kernels({}, run), "");
}

TEST(ProfileTopKernels, LongNamesAreCut) {
  const std::string name(150, 'k');
  ProfileRun run;
  run.device_kernels = true;
  run.steps = 1;
  run.seconds = 1e-3;
  const auto text =
      format_top_kernels(top_kernels({device(name, 0, 10, 0)}, run, 1), run);
  expect_line(text, std::string(kTopNameChars - 3, 'k') + "...\n");
  EXPECT_EQ(text.find(std::string(kTopNameChars - 2, 'k')), std::string::npos);
}

TEST(ProfileTable, PrintsEveryRowPerStep) {
  ProfileRun run;
  run.steps = 2;
  run.seconds = 200e-6;
  run.input_shape = {8, 3, 32, 32};
  auto events = cpu_step();
  auto second = cpu_step();
  for (auto& e : second) {
    e.start_ns += 100000;
  }
  events.insert(events.end(), second.begin(), second.end());
  const auto text = format_table(summarize(events, run));
  for (const auto c : kernel_classes()) {
    EXPECT_NE(text.find("\n" + to_string(c) + " "), std::string::npos)
        << to_string(c) << " in\n"
        << text;
  }
  // Per step: conv forward 20 us of 100, 28.3 MFLOP in 20 us.
  expect_line(text,
              "conv forward       0.020   20.0%    1.416        -   100%");
  expect_line(text,
              "matmul             0.003    3.0%        -        -      -");
  expect_line(text,
              "other              0.000    0.0%        -        -      -");
  expect_line(text, "outside ops        0.027   27.0%");
  expect_line(text, "step               0.100  100.0%");
}

TEST(ProfileTable, RatesOnlyOverMostOfAClass) {
  // A fused optimizer takes TensorLists (bytes unknown); 1% of its time in
  // ops of known traffic says nothing of the rest.
  ProfileTable table;
  table.run.steps = 1;
  table.run.seconds = 1.0;
  ClassRow optimizer;
  optimizer.kernel_class = KernelClass::kOptimizer;
  optimizer.seconds = 0.5;
  optimizer.bytes = 1e9;
  optimizer.rated_seconds = 0.005;
  ClassRow copies = optimizer;
  copies.kernel_class = KernelClass::kCopy;
  copies.rated_seconds = 0.25;
  table.rows = {optimizer, copies};
  const auto text = format_table(table);
  expect_line(text,
              "optimizer        500.000   50.0%        -        -     1%");
  expect_line(text,
              "copies           500.000   50.0%        -    4.000    50%");
}

TEST(ProfileTrace, ChromeTraceEventsParse) {
  const auto events = cpu_step();
  const auto trace =
      nlohmann::json::parse(chrome_trace(events).dump()); // a round trip
  ASSERT_TRUE(trace["traceEvents"].is_array());
  ASSERT_EQ(trace["traceEvents"].size(), events.size());
  const auto& conv = trace["traceEvents"][2];
  EXPECT_EQ(conv["name"], "aten::conv2d");
  EXPECT_EQ(conv["ph"], "X");
  EXPECT_DOUBLE_EQ(conv["ts"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(conv["dur"].get<double>(), 20.0);
  EXPECT_EQ(conv["args"]["Input Dims"][1][0], 64);
  EXPECT_EQ(conv["args"]["flops"], 28311552);
}

TEST(ProfileTrace, OneFilePerConfiguration) {
  EXPECT_EQ(trace_path_for("out/step.json", "amp", false), "out/step.json");
  EXPECT_EQ(trace_path_for("out/step.json", "amp-bf16", true),
            "out/step-amp-bf16.json");
  EXPECT_EQ(trace_path_for("out.d/step.pt.trace.json", "fp32", true),
            "out.d/step-fp32.pt.trace.json");
  EXPECT_EQ(trace_path_for("step", "bf16", true), "step-bf16");
  EXPECT_EQ(trace_path_for(".trace.json", "bf16", true), ".trace-bf16.json");
}

// --profile and --json naming one file are caught however they are spelt,
// before either exists and after.
TEST(ProfileTrace, SameFileSeesThroughSpellingsAndLinks) {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() /
                   ("lamp_same_file_" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  const auto file = (dir / "out.json").string();
  EXPECT_TRUE(same_file(file, (dir / "sub" / ".." / "out.json").string()));
  EXPECT_FALSE(same_file(file, (dir / "out2.json").string()));
  { std::ofstream touch(file); }
  fs::create_symlink(file, dir / "link.json");
  EXPECT_TRUE(same_file(file, (dir / "link.json").string()));
  EXPECT_TRUE(same_file((dir / "./out.json").string(), file));
  EXPECT_FALSE(same_file(file, (dir / "sub").string()));
  fs::remove_all(dir);
}

} // namespace
} // namespace lamp_bench
