// The cost model without MPI: hardware specs (interpolation, YAML round trip, bad files), the
// roofline and alpha-beta arithmetic of op_time, the symbolic parameter count of every preset
// against a built (dry-run) model, and rotor over the whole blocks of a 2d / 3d grid against brute
// force.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/layers.hpp"
#include "core/model.hpp"
#include "core/optimizer.hpp"
#include "planner/cost_model.hpp"
#include "planner/hardware.hpp"
#include "planner/layout_plan.hpp"

namespace colossal {
namespace {

TEST(Hardware, GemmRateInterpolatesLogLogAndClamps) {
  planner::HardwareSpec h;
  h.fp32_flops = 100e9;
  h.bf16_flops = 400e9;
  h.gemm_curve = {{1e6, 10e9}, {1e8, 40e9}};
  EXPECT_DOUBLE_EQ(h.gemm_rate(1e6), 10e9);
  EXPECT_DOUBLE_EQ(h.gemm_rate(1e3), 10e9) << "clamped below";
  EXPECT_DOUBLE_EQ(h.gemm_rate(1e12), 40e9) << "clamped above";
  // Halfway in log(FLOPs) is the geometric mean of the rates.
  EXPECT_NEAR(h.gemm_rate(1e7), 20e9, 1e-3);
  EXPECT_NEAR(h.gemm_rate(1e7, /*bf16=*/true), 80e9, 1e-3) << "scaled by the bf16/fp32 peaks";
  h.gemm_curve.clear();
  h.gemm_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(h.gemm_rate(1e7), 50e9);
}

// A CUDA build's default preset comes from the GPU's name.
TEST(Hardware, PresetForGpuName) {
  EXPECT_EQ(planner::preset_for_gpu("NVIDIA H200"), "h200");
  EXPECT_EQ(planner::preset_for_gpu("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(planner::preset_for_gpu("NVIDIA H100 PCIe"), "h100");
  EXPECT_EQ(planner::preset_for_gpu("NVIDIA A100-SXM4-80GB"), "a100-80g");
  EXPECT_EQ(planner::preset_for_gpu("NVIDIA A100-SXM4-40GB"), "a100-40g");
  EXPECT_EQ(planner::preset_for_gpu("Tesla V100-SXM2-32GB"), "v100");
  EXPECT_EQ(planner::preset_for_gpu("NVIDIA GH200 480GB"), "");  // its memory is neither's
  EXPECT_EQ(planner::preset_for_gpu("NVIDIA L40S"), "");
  EXPECT_EQ(planner::preset_for_gpu(""), "");
  for (const char* name : {"NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"}) {
    EXPECT_NO_THROW(planner::hardware_preset(planner::preset_for_gpu(name))) << name;
  }
}

// MFU's peak follows the precision: a GPU preset's bf16 tensor-core peak for bf16 runs.
TEST(Hardware, PeakFlopsInTheRunsPrecision) {
  const planner::HardwareSpec h100 = planner::hardware_preset("h100");
  EXPECT_EQ(h100.peak_flops(false), 494e12);
  EXPECT_EQ(h100.peak_flops(true), 989e12);
  const planner::HardwareSpec host = planner::hardware_preset("host");
  EXPECT_EQ(host.peak_flops(true), host.peak_flops(false));  // no bf16 figure: fp32's
}

TEST(Hardware, YamlRoundTripsAndBadFilesNameTheKey) {
  const planner::HardwareSpec h = planner::hardware_preset("a100-80g");
  const auto path = std::filesystem::temp_directory_path() / "colossal_hw.yaml";
  std::ofstream(path) << planner::hardware_yaml(h);
  const planner::HardwareSpec back = planner::read_hardware(path.string());
  EXPECT_EQ(back.name, h.name);
  EXPECT_NEAR(back.bf16_flops, h.bf16_flops, 1e-5 * h.bf16_flops);
  EXPECT_NEAR(back.memory_bandwidth, h.memory_bandwidth, 1e-5 * h.memory_bandwidth);
  EXPECT_NEAR(back.inter_node.bandwidth_Bps, h.inter_node.bandwidth_Bps, 1e-5 * h.inter_node.bandwidth_Bps);
  EXPECT_EQ(back.devices_per_node, 8);
  EXPECT_EQ(back.comm_overlap, 0.5);  // NCCL moves started collectives beside the kernels
  EXPECT_EQ(back.host_memory_bytes, 2048.0 * 1024 * 1024 * 1024) << "a DGX A100 80GB's 2 TB";
  EXPECT_NEAR(back.fused_attention_bf16_flops, 0.3 * 312e12, 1e-5 * 312e12)
      << "the tensor cores' fused attention at 30% of the bf16 peak";
  EXPECT_NEAR(back.fused_attention_flops, 0.25 * 19.5e12, 1e-5 * 19.5e12)
      << "the team kernels at 25% of the CUDA cores' fp32 peak, not the TF32 one";
  const planner::HardwareSpec host = planner::hardware_preset("host");
  std::ofstream(path) << planner::hardware_yaml(host);
  EXPECT_EQ(planner::read_hardware(path.string()).gemm_curve.size(), host.gemm_curve.size());
  EXPECT_EQ(planner::read_hardware(path.string()).comm_overlap, 0.0);
  std::string overlapped = planner::hardware_yaml(h);
  overlapped.replace(overlapped.find("comm_overlap: 0.5"), 17, "comm_overlap: 1.5");
  std::ofstream(path) << overlapped;
  EXPECT_THROW(planner::read_hardware(path.string()), std::runtime_error);
  // The bf16 fused attention's rate may be absent (an older file: the fp32 rate), not bad.
  std::string text = planner::hardware_yaml(h);
  const std::size_t key = text.find("fused_attention_bf16_gflops: ");
  ASSERT_NE(key, std::string::npos);
  const std::size_t eol = text.find('\n', key);
  std::ofstream(path) << text.substr(0, key) + "fused_attention_bf16_gflops: fast" +
                             text.substr(eol);
  try {
    planner::read_hardware(path.string());
    FAIL() << "a bad fused_attention_bf16_gflops must be rejected";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fused_attention_bf16_gflops must be a number"),
              std::string::npos)
        << e.what();
  }
  std::ofstream(path) << text.substr(0, key) + text.substr(eol + 1);
  EXPECT_EQ(planner::read_hardware(path.string()).fused_attention_bf16_flops, 0.0);

  std::ofstream(path) << "name: x\nfp32_tflops: 1\n";
  try {
    planner::read_hardware(path.string());
    FAIL() << "a file without bf16_tflops must be rejected";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16_tflops is missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(planner::read_hardware("/nonexistent/hw.yaml"), std::runtime_error);
  EXPECT_THROW(planner::hardware_preset("tpu"), std::invalid_argument);
  std::filesystem::remove(path);
}

// A calibrated host's attention curve: 2 lengths x 2 head widths, the rate rising with both.
planner::HardwareSpec attention_grid() {
  planner::HardwareSpec h;
  h.fp32_flops = 1e12;
  h.attention_flops = 7e10;  // the scalar rate: used where there is no curve only
  h.fused_attention_flops = 5e10;
  h.attention_curve = {{128, 32, 1e10}, {128, 128, 4e10}, {2048, 32, 9e10}, {2048, 128, 16e10}};
  h.fused_attention_curve = {{128, 32, 2e10}, {128, 128, 2e10}, {2048, 32, 2e10},
                             {2048, 128, 2e10}};
  return h;
}

TEST(Hardware, AttentionRateInterpolatesTheCalibratedGrid) {
  planner::HardwareSpec h = attention_grid();
  using planner::AttentionForm;
  // Measured points exactly; the corners are not blended with their neighbours.
  EXPECT_NEAR(h.attention_rate(AttentionForm::dense, 128, 32), 1e10, 1.0);
  EXPECT_NEAR(h.attention_rate(AttentionForm::dense, 2048, 128), 16e10, 1.0);
  // Halfway in log T (512 between 128 and 2048) at one width: the geometric mean.
  EXPECT_NEAR(h.attention_rate(AttentionForm::dense, 512, 32), 3e10, 1.0);
  // Halfway in both: the geometric mean of the four corners (1, 4, 9 and 16 x 10^10).
  EXPECT_NEAR(h.attention_rate(AttentionForm::dense, 512, 64), std::sqrt(std::sqrt(576.0)) * 1e10,
              1e-3 * 1e10);
  // Clamped beyond the grid, in each direction.
  EXPECT_NEAR(h.attention_rate(AttentionForm::dense, 64, 16), 1e10, 1.0);
  EXPECT_NEAR(h.attention_rate(AttentionForm::dense, 8192, 256), 16e10, 1.0);
  EXPECT_NEAR(h.attention_rate(AttentionForm::dense, 8192, 32), 9e10, 1.0);
  EXPECT_NEAR(h.attention_rate(AttentionForm::fused, 700, 80), 2e10, 1.0);
  // No bf16 rate of its own: the fp32 fused one; a scalar one without a curve.
  EXPECT_NEAR(h.attention_rate(AttentionForm::fused_bf16, 700, 80), 2e10, 1.0);
  h.fused_attention_bf16_flops = 3e11;
  EXPECT_EQ(h.attention_rate(AttentionForm::fused_bf16, 700, 80), 3e11);
  // Without curves (the GPU presets), the scalar rates for every shape.
  h.attention_curve.clear();
  EXPECT_EQ(h.attention_rate(AttentionForm::dense, 128, 32), 7e10);
  EXPECT_EQ(h.attention_rate(AttentionForm::dense, 4096, 128), 7e10);
  // Threads scale the curves as they scale every compute rate.
  const planner::HardwareSpec two = [] {
    planner::HardwareSpec g = attention_grid();
    g.threads = 2;
    return g;
  }();
  EXPECT_NEAR(planner::scaled_to_threads(two, 4).attention_rate(AttentionForm::dense, 128, 32),
              2e10, 1.0);
}

TEST(Hardware, AttentionCurvesRoundTripAndMustBeFullGrids) {
  const auto path = std::filesystem::temp_directory_path() / "colossal_hw_attention.yaml";
  planner::HardwareSpec h = attention_grid();
  h.name = "grid";
  h.memory_bandwidth = 1e10;
  h.optimizer_bandwidth = 1e10;
  h.bf16_flops = 1e12;
  h.fused_attention_bf16_curve = {{256, 64, 3e10}};  // one point: a 1 x 1 grid
  const std::string text = planner::hardware_yaml(h);
  std::ofstream(path) << text;
  const planner::HardwareSpec back = planner::read_hardware(path.string());
  ASSERT_EQ(back.attention_curve.size(), 4u);
  ASSERT_EQ(back.fused_attention_curve.size(), 4u);
  ASSERT_EQ(back.fused_attention_bf16_curve.size(), 1u);
  EXPECT_NEAR(back.attention_rate(planner::AttentionForm::dense, 512, 64),
              h.attention_rate(planner::AttentionForm::dense, 512, 64), 1e-4 * 1e10);
  EXPECT_NEAR(back.attention_rate(planner::AttentionForm::fused_bf16, 4096, 128), 3e10, 1e3);
  // Files without curves (older ones, the presets) read as before.
  EXPECT_TRUE(planner::read_hardware([&] {
                const auto p = std::filesystem::temp_directory_path() / "colossal_hw_plain.yaml";
                std::ofstream(p) << planner::hardware_yaml(planner::hardware_preset("h100"));
                return p.string();
              }()).attention_curve.empty());
  auto expect_error = [&](const std::string& yaml, const std::string& message) {
    std::ofstream(path) << yaml;
    try {
      planner::read_hardware(path.string());
      ADD_FAILURE() << "accepted: " << message;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  const std::size_t at = text.find("  - [2048, 128, 160]");
  ASSERT_NE(at, std::string::npos) << text;
  const std::size_t eol = text.find('\n', at);
  // A missing corner: the grid is 2 x 2 with 3 points.
  expect_error(text.substr(0, at) + text.substr(eol + 1),
               "attention_curve must measure every sequence length with every head width (2 x 2 "
               "points, 3 given)");
  expect_error(text.substr(0, at) + "  - [2048, 32, 5]\n" + text.substr(eol + 1),
               "attention_curve[3] repeats sequence length 2048 and head width 32");
  expect_error(text.substr(0, at) + "  - [2048, 128]\n" + text.substr(eol + 1),
               "attention_curve[3] must be [sequence length, head width, gflops]");
  expect_error(text.substr(0, at) + "  - [2048, 0, 5]\n" + text.substr(eol + 1),
               "attention_curve[3] must be > 0");
  std::filesystem::remove(path);
}

// The attention op is priced at its own shape's rate: this rank's block length (a ring's local
// block) and the head width.
TEST(CostModel, AttentionIsPricedAtItsShapesCalibratedRate) {
  planner::HardwareSpec hw = attention_grid();
  hw.memory_bandwidth = 1e15;  // its bytes bound nothing here
  planner::RankLayout l;
  planner::Op core{"core", "attention", 1e9, 2e9, 1e3, 0.0};
  core.seq = 128;
  core.head_dim = 32;
  EXPECT_NEAR(planner::op_time(core, l, hw, false).forward, 1e9 / 1e10, 1e-12);
  EXPECT_NEAR(planner::op_time(core, l, hw, false).backward, 2e9 / 1e10, 1e-12);
  EXPECT_NEAR(planner::op_time(core, l, hw, true).forward, 1e9 / 2e10, 1e-12);
  core.seq = 2048;
  EXPECT_NEAR(planner::op_time(core, l, hw, false).forward, 1e9 / 9e10, 1e-12);
  // The step graph gives the op its shape: gpt2's head width 64 at T = 256; under sequence
  // parallelism (a ring of 2) the local block of 128.
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  planner::Layout layout;
  layout.micro_batch = 1;
  layout.seq_len = 256;
  auto attention_op = [&](const planner::Layout& g) {
    for (const planner::Op& op : planner::build_step_graph(spec, g).ops) {
      if (std::string_view(op.kind) == "attention") return op;
    }
    return planner::Op{};
  };
  EXPECT_EQ(attention_op(layout).seq, 256);
  EXPECT_EQ(attention_op(layout).head_dim, 64);
  layout.sequence = 2;
  EXPECT_EQ(attention_op(layout).seq, 128);
  EXPECT_EQ(attention_op(layout).head_dim, 64);
}

// model.fused_attention on the grid models: the attention priced at the fused rate (fp32: their
// q/k/v stay fp32), each block keeping its rows' log-sum-exp instead of the probabilities, the
// fused tiles' work instead of a sequence's score gradients, and selective recomputing nothing.
TEST(CostModel, GridFusedAttentionIsPricedAtTheFusedRateAndKeepsNoProbabilities) {
  using core::MemCategory;
  planner::HardwareSpec hw = attention_grid();
  hw.memory_bandwidth = 1e12;
  for (core::TensorMode mode : {core::TensorMode::d2, core::TensorMode::d3}) {
    const bool cube = mode == core::TensorMode::d3;
    core::ModelSpec spec = *core::find_preset("gpt2-124m");
    planner::RankLayout g;
    g.seq_len = 2048;
    g.micro_batch = 8;
    g.micro_batches = 2;
    g.tensor_mode = mode;
    g.tensor = cube ? 8 : 4;  // q = 2
    const double q = 2, ranks = cube ? 8 : 4, T = g.seq_len, L = spec.layers;
    const double tokens = double(g.micro_batch) * T;
    const planner::TimePrediction dense = planner::predict_time(spec, g, hw);
    const planner::MemoryPrediction dense_memory = planner::predict_memory(spec, g);
    spec.fused_attention = true;
    const planner::TimePrediction fused = planner::predict_time(spec, g, hw);
    const planner::MemoryPrediction fused_memory = planner::predict_memory(spec, g);
    const double attention = 12.0 * L * T * spec.hidden * tokens / ranks;
    const double head = double(spec.hidden) / spec.heads;
    const double expected =
        g.micro_batches * attention *
        (1.0 / hw.attention_rate(planner::AttentionForm::fused, T, head) -
         1.0 / hw.attention_rate(planner::AttentionForm::dense, T, head));
    EXPECT_NEAR(fused.compute - dense.compute, expected, 1e-9 * dense.compute);
    const double sequences = g.micro_batch / (cube ? q * q : q), heads = spec.heads / q;
    EXPECT_EQ(dense_memory[MemCategory::activations] - fused_memory[MemCategory::activations],
              4.0 * L * sequences * heads * T * (T - 1));
    EXPECT_EQ(dense_memory[MemCategory::temporaries] - fused_memory[MemCategory::temporaries],
              4.0 * (heads * T * T - double(core::fused_attention_work_floats())));
    // selective: nothing to drop, nothing run again.
    g.selective = true;
    EXPECT_EQ(planner::predict_time(spec, g, hw).step, fused.step);
    EXPECT_EQ(planner::predict_memory(spec, g).bytes, fused_memory.bytes);
  }
}

// The compute split by op kind (what --profile-steps prints beside its measurements) adds up to
// the compute, recomputation included, and each kind is its ops' time over the micro-batches.
TEST(CostModel, ComputeByKindAddsUpToTheCompute) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  const planner::HardwareSpec hw = planner::hardware_preset("h100");
  planner::RankLayout l;
  l.seq_len = 512;
  l.micro_batch = 2;
  l.micro_batches = 3;
  l.keep.assign(2 * spec.layers, core::Keep::none);  // full recomputation
  const planner::TimePrediction t = planner::predict_time(spec, l, hw);
  ASSERT_GT(t.recompute, 0.0);
  double sum = 0.0, attention = 0.0;
  for (const auto& [kind, seconds] : t.kind_compute) sum += seconds;
  for (const planner::Op& op : planner::build_step_graph(spec, l.graph_layout(l.chunks[0])).ops) {
    if (std::string_view(op.kind) != "attention") continue;
    const planner::OpTime o = planner::op_time(op, l, hw, false);
    attention += 3 * (o.forward + o.backward + o.recompute);
  }
  EXPECT_NEAR(sum, t.compute, 1e-12 * t.compute);
  EXPECT_NEAR(t.kind_compute.at("attention"), attention, 1e-12 * attention);
  for (const char* kind : {"gemm", "attention", "layernorm", "activation", "embedding", "loss"}) {
    EXPECT_GT(t.kind_compute.count(kind), 0u) << kind;
  }
}

// colossal_train's train.precision: bf16 (RankLayout::bf16_products) prices the matrix products
// at the bf16 rate, 1d and grids alike: on an H200 preset (no curve: the peaks) at half the TF32
// peak's time, the other kinds of work unchanged. (They were priced at fp32's rate before: a
// bf16 gpt2-124m step on a calibrated oneDNN host was predicted 76% slow, now 5%.)
TEST(CostModel, Bf16ProductsRunAtTheBf16Rate) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  const planner::HardwareSpec hw = planner::hardware_preset("h200");
  const double ratio = hw.gemm_rate(1e12, false) / hw.gemm_rate(1e12, true);
  ASSERT_NEAR(ratio, 494.0 / 989.0, 1e-9);
  planner::RankLayout l;
  l.seq_len = 1024;
  l.micro_batch = 16;
  l.bf16_operands = true;
  const planner::TimePrediction fp32 = planner::predict_time(spec, l, hw);
  l.bf16_products = true;
  const planner::TimePrediction bf16 = planner::predict_time(spec, l, hw);
  EXPECT_NEAR(bf16.kind_compute.at("gemm") / fp32.kind_compute.at("gemm"), ratio, 0.02);
  for (const auto& [kind, seconds] : fp32.kind_compute) {
    if (kind != "gemm") {
      EXPECT_EQ(bf16.kind_compute.at(kind), seconds) << kind;
    }
  }
  // A 2d grid: the closed form's compute falls too.
  planner::RankLayout g;
  g.seq_len = 1024;
  g.micro_batch = 4;
  g.tensor_mode = core::TensorMode::d2;
  g.tensor = 4;
  const double grid_fp32 = planner::predict_time(spec, g, hw).compute;
  g.bf16_products = true;
  EXPECT_LT(planner::predict_time(spec, g, hw).compute, 0.8 * grid_fp32);
}

// Megatron's sequence parallelism as core::Model runs it (tests/test_tensor_parallel.cpp counts
// the same calls): per micro-batch 4L + 2 reduce-scatters of an (N, C) tensor (each block's two
// row-parallel outputs in forward and two column-parallel input gradients in backward, the
// embedding's and the LM head's) and 6L + 2 all-gathers (each block's two layernorm outputs in
// forward and again in backward for the weight gradients, its two output gradients, the
// embedding's gradient, ln_f), plus the cross-entropy's all-reduces of 3N floats. The layer
// collectives' time is exactly those on a link without latency.
TEST(CostModel, SequenceSplitPricesEveryCollectiveTheModelRuns) {
  const int L = 3, C = 256;
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, L, C, 4, 4 * C, 1000, 256);
  planner::HardwareSpec hw = planner::hardware_preset("h100");
  hw.intra_node = {0.0, 1e11};
  planner::RankLayout l;
  l.seq_len = 256;
  l.micro_batch = 2;
  l.micro_batches = 3;
  l.tensor = 2;
  l.sequence_split = true;
  const double N = 2.0 * 256, NC = 4.0 * N * C;
  const double gather = NC / 2 / 1e11;               // ring over 2 ranks: half the payload
  const double cross_entropy = 2 * (4.0 * 3 * N / 2) / 1e11;  // an all-reduce of 3N floats
  const planner::TimePrediction t = planner::predict_time(spec, l, hw);
  EXPECT_NEAR(t.tensor_comm, 3 * ((4 * L + 2 + 6 * L + 2) * gather + cross_entropy),
              1e-9 * t.tensor_comm);
}

TEST(CostModel, OpTimeIsRooflinePlusAlphaBeta) {
  planner::HardwareSpec hw;
  hw.fp32_flops = 1e12;
  hw.gemm_efficiency = 0.5;
  hw.attention_flops = 1e11;
  hw.fused_attention_flops = 2e10;
  hw.memory_bandwidth = 1e10;
  hw.devices_per_node = 8;
  hw.intra_node = {1e-5, 1e9};
  planner::RankLayout l;
  l.tensor = 4;
  // A compute-bound GEMM: 2e9 FLOPs forward at 0.5 TFLOP/s; backward twice that.
  planner::Op gemm{"fc", "gemm", 2e9, 4e9, 1e6, 0.0, "all_reduce(tp)", 4e6};
  planner::OpTime t = planner::op_time(gemm, l, hw, false);
  EXPECT_DOUBLE_EQ(t.forward, 4e-3);
  EXPECT_DOUBLE_EQ(t.backward, 8e-3);
  EXPECT_EQ(t.recompute, 0.0);
  // Ring all-reduce of 4 MB over 4 ranks: 2 * 3 steps of (alpha + 1 MB / beta).
  EXPECT_NEAR(t.communication, 6 * (1e-5 + 1e6 / 1e9), 1e-12);
  // A memory-bound GEMM is limited by its bytes instead.
  planner::Op thin{"thin", "gemm", 2e3, 4e3, 1e8, 0.0};
  EXPECT_DOUBLE_EQ(planner::op_time(thin, l, hw, false).forward, 1e-2);
  // Layernorm: bytes over bandwidth, backward twice; recomputed ops pay their forward again.
  planner::Op ln{"ln", "layernorm", 0, 0, 1e7, 0.0};
  ln.recomputed = true;
  t = planner::op_time(ln, l, hw, false);
  EXPECT_DOUBLE_EQ(t.forward, 1e-3);
  EXPECT_DOUBLE_EQ(t.backward, 2e-3);
  EXPECT_DOUBLE_EQ(t.recompute, 1e-3);
  // Attention at the fused or dense rate.
  planner::Op core{"core", "attention", 1e9, 2e9, 1e3, 0.0};
  EXPECT_DOUBLE_EQ(planner::op_time(core, l, hw, false).forward, 1e-2);
  EXPECT_DOUBLE_EQ(planner::op_time(core, l, hw, true).forward, 5e-2);
  // bf16 q/k/v take the fused core's bf16 rate where the hardware has one (a GPU's tensor
  // cores), else the fp32 one; the dense core keeps its single rate.
  l.bf16 = true;
  EXPECT_DOUBLE_EQ(planner::op_time(core, l, hw, true).forward, 5e-2);
  hw.fused_attention_bf16_flops = 4e11;
  EXPECT_DOUBLE_EQ(planner::op_time(core, l, hw, true).forward, 2.5e-3);
  EXPECT_DOUBLE_EQ(planner::op_time(core, l, hw, false).forward, 1e-2);
  l.bf16 = false;
  l.bf16_operands = true;  // a host's bf16 storage: q/k/v in bf16 too
  EXPECT_DOUBLE_EQ(planner::op_time(core, l, hw, true).forward, 2.5e-3);
  l.bf16_operands = false;
  EXPECT_DOUBLE_EQ(planner::op_time(core, l, hw, true).backward, 1e-1);
}

// Stage 0's gradient all-reduce: the buffer's bytes once, plus one ring latency per extra bucket
// (parallel.bucket_mb); an infinite bucket is one call, as Megatron-LM (2021) made it.
TEST(CostModel, GradientBucketsPayOneRingLatencyEach) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  planner::HardwareSpec hw = planner::hardware_preset("a100-80g");
  planner::RankLayout l;
  l.seq_len = 1024;
  l.data = 16;  // two nodes: the inter-node link
  l.bucket_mb = std::numeric_limits<double>::infinity();
  const double whole = planner::predict_time(spec, l, hw).data_comm;
  const double P = 4.0 * double(core::parameter_count(spec));  // fp32 gradients
  // One ring all-reduce: 2(D-1) steps of (alpha + bytes / D / beta); bytes ~ P (units padded).
  const double padded_P = (whole / (2.0 * 15) - hw.inter_node.latency_s) * 16 * hw.inter_node.bandwidth_Bps;
  EXPECT_NEAR(padded_P / P, 1.0, 0.01);
  for (const double mb : {25.0, 4.0}) {
    l.bucket_mb = mb;
    const double buckets = std::ceil(padded_P / (mb * 1024 * 1024));
    const double expected = whole + (buckets - 1) * 2 * 15 * hw.inter_node.latency_s;
    EXPECT_NEAR(planner::predict_time(spec, l, hw).data_comm, expected, 1e-9 * expected) << mb;
  }
  // parallel.grad_reduce: bf16: half the bytes, the same buckets (cut in fp32 floats).
  l.bf16_reduce = true;
  const double buckets = std::ceil(padded_P / (4.0 * 1024 * 1024));
  const double halved = 2.0 * 15 * (hw.inter_node.latency_s +
                                    padded_P / 2 / 16 / hw.inter_node.bandwidth_Bps) +
                        (buckets - 1) * 2 * 15 * hw.inter_node.latency_s;
  EXPECT_NEAR(planner::predict_time(spec, l, hw).data_comm, halved, 1e-9 * halved);
  // Its memory: a bf16 copy of the flat buffer at stage 0; at stage 2 one block work buffer
  // fewer, 2-byte copies of unit 0's and one block's instead.
  planner::RankLayout fp32 = l;
  fp32.bf16_reduce = false;
  using core::MemCategory;
  EXPECT_NEAR(planner::predict_memory(spec, l)[MemCategory::gradients] -
                  planner::predict_memory(spec, fp32)[MemCategory::gradients],
              padded_P / 2, 1.0);
  l.zero_stage = fp32.zero_stage = 2;
  const double saved = planner::predict_memory(spec, fp32)[MemCategory::gradients] -
                       planner::predict_memory(spec, l)[MemCategory::gradients];
  const double block = 12.0 * 768 * 768 + 13 * 768;  // a gpt2-124m block's parameters
  const double embeddings = (50257.0 + 1024) * 768;  // unit 0: token and position embeddings
  EXPECT_NEAR(saved, 4 * block - 2 * (block + embeddings), 0.01 * 4 * block);
}

// Overlap (HardwareSpec::comm_overlap): a GPU preset hides the started reductions under
// backward, never more than the window, never the bucket backward finishes last nor the
// all-gather after the update; the host (MPI progressed only when polled) hides nothing.
TEST(CostModel, StartedReductionsHideUnderComputeWhereTheTransportMovesThem) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  planner::HardwareSpec hw = planner::hardware_preset("h200");
  planner::RankLayout l;
  l.seq_len = 1024;
  l.micro_batch = 4;
  l.micro_batches = 4;
  l.data = 16;  // two nodes: the inter-node link
  l.bucket_mb = 25;
  for (const int stage : {0, 1, 2, 3}) {
    l.zero_stage = stage;
    const planner::TimePrediction t = planner::predict_time(spec, l, hw);
    double forward = 0, backward = 0;
    for (double f : t.micro_forward) forward += f;
    for (double b : t.micro_backward) backward += b;
    EXPECT_GT(t.hidden_comm, 0.0) << stage;
    EXPECT_LT(t.hidden_comm, t.data_comm) << stage;
    const double window = stage < 2 ? backward : stage == 2 ? 4 * backward : 4 * (forward + backward);
    EXPECT_LE(t.hidden_comm, window * (1 + 1e-12)) << stage;
    EXPECT_NEAR(t.step, t.compute + t.tensor_comm + t.data_comm - t.hidden_comm + t.optimizer,
                1e-12) << stage;
    planner::HardwareSpec polled = hw;
    polled.comm_overlap = 0.0;
    const planner::TimePrediction p = planner::predict_time(spec, l, polled);
    EXPECT_EQ(p.hidden_comm, 0.0);
    EXPECT_NEAR(p.step - t.step, t.hidden_comm, 1e-12) << stage;
  }
  // A 2D grid's reduction over its data ranks hides the same way.
  planner::RankLayout grid = l;
  grid.tensor_mode = core::TensorMode::d2;
  grid.tensor = 4;
  grid.zero_stage = 2;
  const planner::TimePrediction g = planner::predict_time(spec, grid, hw);
  EXPECT_GT(g.hidden_comm, 0.0);
  EXPECT_LT(g.hidden_comm, g.data_comm);
  EXPECT_NEAR(g.step, g.compute + g.tensor_comm + g.data_comm - g.hidden_comm + g.optimizer,
              1e-12);
  l.zero_stage = 0;
  l.bucket_mb = std::numeric_limits<double>::infinity();  // one bucket: nothing starts early
  EXPECT_EQ(planner::predict_time(spec, l, hw).hidden_comm, 0.0);
  l.bucket_mb = 25;
  EXPECT_EQ(planner::predict_time(spec, l, planner::hardware_preset("host")).hidden_comm, 0.0);
}

// A share of the optimizer state offloaded (offload.optimizer_fraction): the moments split
// between the device and the host by core::offloaded_states, the host also holding those states'
// gradients and parameters; on a GPU the device's update runs beside the host share's copies
// down, its update and the copies back up; where the device is the host, in turn.
TEST(CostModel, PartialOffloadSplitsTheMomentsAndRunsBothUpdates) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  const planner::HardwareSpec hw = planner::hardware_preset("h200");
  ASSERT_GT(hw.host_link_bandwidth, 0.0);
  for (const int stage : {1, 2, 3}) {
    for (const bool grid : {false, true}) {
      if (grid && stage == 3) continue;  // the grids run ZeRO 0-2
      planner::RankLayout l;
      l.seq_len = 1024;
      l.micro_batch = 4;
      l.data = 2;
      l.zero_stage = stage;
      if (grid) {
        l.tensor_mode = core::TensorMode::d2;
        l.tensor = 4;
      }
      const planner::MemoryPrediction kept = planner::predict_memory(spec, l);
      const double S = kept[core::MemCategory::optimizer] / 8;  // the shard's states
      l.offload_optimizer = true;
      const planner::MemoryPrediction all = planner::predict_memory(spec, l);
      l.offload_fraction = 0.3;
      const planner::MemoryPrediction some = planner::predict_memory(spec, l);
      const double H = double(core::offloaded_states(std::size_t(S), 0.3));
      ASSERT_GT(H, 0.29 * S);
      ASSERT_LT(H, 0.31 * S);
      EXPECT_EQ(all[core::MemCategory::offloaded], 16 * S) << stage << grid;
      EXPECT_EQ(all[core::MemCategory::optimizer], 0.0);
      EXPECT_EQ(some[core::MemCategory::optimizer], 8 * (S - H)) << stage << grid;
      EXPECT_EQ(some[core::MemCategory::offloaded], 16 * H) << stage << grid;
      EXPECT_EQ(some.device(), kept.device() - 8 * H);
      // Time, as zero::ShardedAdamW::step runs it: the device's update, and beside it the host
      // share's gradients and parameters down, their update on the host and the parameters up.
      // At stages 2-3 (1d) the gradients went down during the last micro-batch's backward: only
      // what that backward did not cover is left, and the units still reducing when it ended
      // (the embeddings' unit 0 and the first block, first in the shard: `late` states) come
      // down in the step.
      double window = 0.0, late = 0.0;
      if (stage >= 2 && !grid) {
        for (double b : planner::predict_time(spec, l, hw).micro_backward) window += b;
        ASSERT_GT(window, 0.0);
        const auto units = core::parameter_units(core::parameter_table(spec, 2 * 16), 2 * 16);
        late = double(units[0].size() + units[1].size()) / 2;
      }
      auto gradients_down = [&](double states) {
        const double after = std::max(0.0, late - (S - states));
        const double hidden = std::min(window, (states - after) * 4 / hw.host_link_bandwidth);
        return states * 4 / hw.host_link_bandwidth - hidden;
      };
      // Beside AdamW the norm and the zeroing of the gradients the rank holds, on the device:
      // the whole buffer (2S on 2 data ranks) at ZeRO 1, the shard at 2-3, 8 bytes each.
      auto housekeeping = [&](const planner::HardwareSpec& h) {
        return 8 * (stage <= 1 ? 2 * S : S) / h.optimizer_bandwidth;
      };
      // Of it the norm's read, which the trainer's profile times with the reduction.
      EXPECT_NEAR(planner::predict_time(spec, l, hw).gradient_norm, housekeeping(hw) / 2,
                  1e-12);
      const double device = (S - 0.3 * S) * 28 / hw.optimizer_bandwidth;
      const double host = 0.3 * S * 28 / hw.host_optimizer_bandwidth;
      const double link = 0.3 * S * 4 / hw.host_link_bandwidth;
      EXPECT_NEAR(planner::predict_time(spec, l, hw).optimizer,
                  std::max(device, gradients_down(0.3 * S) + link + host + link) + housekeeping(hw),
                  1e-9)
          << stage << grid;
      l.offload_fraction = 1.0;
      EXPECT_NEAR(planner::predict_time(spec, l, hw).optimizer,
                  S * 28 / hw.host_optimizer_bandwidth + gradients_down(S) +
                      2 * S * 4 / hw.host_link_bandwidth + housekeeping(hw),
                  1e-9);
      if (stage >= 2 && !grid) {  // a micro-batch 8 times larger: its backward covers them,
                                  // but for the late units
        planner::RankLayout more = l;
        more.micro_batch = 32;
        double longer = 0.0;
        for (double b : planner::predict_time(spec, more, hw).micro_backward) longer += b;
        ASSERT_GT(longer, S * 4 / hw.host_link_bandwidth);
        ASSERT_GT(late, 0.0);
        EXPECT_NEAR(planner::predict_time(spec, more, hw).optimizer,
                    S * 28 / hw.host_optimizer_bandwidth + late * 4 / hw.host_link_bandwidth +
                        2 * S * 4 / hw.host_link_bandwidth + housekeeping(hw),
                    1e-9);
      }
      if (stage == 3 && !grid) {  // the parameter shard on the host: only the gradients move
        const planner::TimePrediction on_device = planner::predict_time(spec, l, hw);
        l.offload_params = true;
        const planner::TimePrediction whole = planner::predict_time(spec, l, hw);
        EXPECT_NEAR(whole.optimizer,
                    S * 28 / hw.host_optimizer_bandwidth + gradients_down(S) + housekeeping(hw),
                    1e-9);
        // Every gather uploads this rank's slice first: twice per micro-batch, but the
        // embeddings' unit 0 only before forward.
        const double m = l.micro_batches;
        const double U0 =
            double(core::parameter_units(core::parameter_table(spec, 2 * 16), 2 * 16)[0].size()) /
            2;
        // And for backward's first unit, the final layernorm's, kept in its buffer since forward.
        const double L =
            double(core::parameter_units(core::parameter_table(spec, 2 * 16), 2 * 16).back().size()) /
            2;
        EXPECT_NEAR(whole.data_comm - on_device.data_comm,
                    m * (2 * S - U0 - L) * 4 / hw.host_link_bandwidth, 1e-9);
        const planner::MemoryPrediction home = planner::predict_memory(spec, l);
        // A share of the shard on the host (offload.params_fraction): the host holds the whole
        // shard still (the rest: the optimizer's copy), the device keeps the rest, which goes
        // down and back up around the host's update, and gathers upload only the host's part.
        l.offload_params_fraction = 0.3;
        const double HP = double(core::offloaded_states(std::size_t(S), 0.3));
        const planner::MemoryPrediction part = planner::predict_memory(spec, l);
        EXPECT_EQ(part[core::MemCategory::offloaded], home[core::MemCategory::offloaded]);
        EXPECT_EQ(part[core::MemCategory::offloaded], 16 * S);
        EXPECT_EQ(part[core::MemCategory::parameters],
                  home[core::MemCategory::parameters] + 4 * (S - HP));
        const planner::TimePrediction t = planner::predict_time(spec, l, hw);
        EXPECT_NEAR(t.optimizer,
                    S * 28 / hw.host_optimizer_bandwidth + gradients_down(S) +
                        2 * (S - HP) * 4 / hw.host_link_bandwidth + housekeeping(hw),
                    1e-9);
        EXPECT_NEAR(t.data_comm - on_device.data_comm,
                    m * (2 * HP - L) * 4 / hw.host_link_bandwidth, 1e-9);
        l.offload_params = false;
        l.offload_params_fraction = 1.0;
      }
      // One memory (the host preset, no link and the same AdamW rate): both parts on the same
      // threads in turn, as without offload.
      const planner::HardwareSpec cpu = planner::hardware_preset("host");
      ASSERT_EQ(cpu.host_link_bandwidth, 0.0);
      l.offload_fraction = 0.3;
      EXPECT_NEAR(planner::predict_time(spec, l, cpu).optimizer,
                  S * 28 / cpu.optimizer_bandwidth + housekeeping(cpu), 1e-9);
    }
  }
}

// ZeRO-3 under recomputed segments: a segment of k blocks is gathered going up for its recompute,
// then going down for its backward, the top one still in its buffer: k - 1 gathers more per
// segment and micro-batch (core::backward_block_transfers, which tests/test_data_parallel.cpp
// checks against the store's own count). Whole-block recomputation gathers nothing more.
TEST(CostModel, RecomputedSegmentsGatherTheirBlocksAgain) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 4, 1024, 8000, 1024);
  const planner::HardwareSpec hw = planner::hardware_preset("h200");
  using core::Keep;
  const std::vector<Keep> every2{Keep::input, Keep::none, Keep::none, Keep::none,
                                 Keep::input, Keep::none, Keep::none, Keep::none};
  EXPECT_EQ(core::backward_block_gathers(every2), (std::vector<int>{2, 3, 3, 2, 0, 1, 1, 0}));
  EXPECT_EQ(core::backward_block_transfers(every2, -1), 6);
  const std::vector<Keep> full = core::keep_blocks(4, {0, 1, 2, 3});
  EXPECT_EQ(core::backward_block_gathers(full), (std::vector<int>{3, 3, 2, 2, 1, 1, 0, 0}));
  EXPECT_EQ(core::backward_block_transfers(full, -1), 4);
  EXPECT_EQ(core::backward_block_transfers({}, -1), 0);
  // A later pipeline stage's first block is its unit 0, in a buffer of its own: both of its
  // gathers move it, and they leave the block buffer as it was.
  EXPECT_EQ(core::backward_block_transfers(full, -1, /*first_apart=*/true), 5);
  EXPECT_EQ(core::backward_block_transfers(every2, 3, true), 6);
  EXPECT_EQ(core::backward_block_transfers(core::keep_blocks(1, {0}), 0, true), 2);
  for (const int micro_batches : {1, 3}) {
    planner::RankLayout l;
    l.seq_len = 1024;
    l.micro_batch = 2;
    l.micro_batches = micro_batches;
    l.data = 2;
    l.zero_stage = 3;
    const double kept = planner::predict_time(spec, l, hw).data_comm;
    l.keep = full;
    EXPECT_DOUBLE_EQ(planner::predict_time(spec, l, hw).data_comm, kept);
    l.keep = every2;
    const auto units = core::parameter_units(core::parameter_table(spec, 2 * 16), 2 * 16);
    const double block_bytes = double(units[1].size()) * 4;
    const planner::LinkSpec& link = hw.intra_node;
    const double two_more = micro_batches * 2 * (link.latency_s + block_bytes / 2 / link.bandwidth_Bps);
    EXPECT_NEAR(planner::predict_time(spec, l, hw).data_comm - kept, two_more, 1e-12 + 1e-9 * kept)
        << micro_batches;
  }
}

// ZeRO-3 on a pipeline stage finds the unit a pass ended on in its buffer at each turn of the
// stage's schedule (tests/test_pipeline.cpp checks the store's count): GPipe's stage 0 of 4
// micro-batches turns once (F F F F B B B B), 1F1B's three times F B and twice B F, so 1F1B
// gathers four block units fewer a step, and with parameter offload uploads them fewer too.
TEST(CostModel, ZeroThreeReusePerPipelineTurn) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 4, 1024, 8000, 512);
  const planner::HardwareSpec hw = planner::hardware_preset("h200");
  planner::RunLayout run;
  run.global_batch = 16;
  run.micro_batch = 2;
  run.seq_len = 512;
  run.data = 2;
  run.pipeline = 2;
  run.zero_stage = 3;
  run.layers = {2, 2};
  run.schedule = parallel::PipelineSchedule::gpipe;
  const planner::RankLayout gpipe = planner::rank_layout(run, 0);
  run.schedule = parallel::PipelineSchedule::one_f_one_b;
  const planner::RankLayout one_f_one_b = planner::rank_layout(run, 0);
  planner::RankLayout gpipe_offloaded = gpipe, one_f_one_b_offloaded = one_f_one_b;
  ASSERT_EQ(gpipe.micro_batches, 4);
  EXPECT_EQ(gpipe.chunks.front().forward_turns, 1);
  EXPECT_EQ(gpipe.chunks.front().backward_turns, 0);
  EXPECT_EQ(one_f_one_b.chunks.front().forward_turns, 3);
  EXPECT_EQ(one_f_one_b.chunks.front().backward_turns, 2);
  const auto units = core::parameter_units(
      core::parameter_table(spec, 2 * 16, {}, core::StageRange{0, 2, true, false}), 2 * 16);
  const double block_bytes = double(units[1].size()) * 4;
  const planner::LinkSpec& link = hw.intra_node;
  const double gathers = 4 * (link.latency_s + block_bytes / 2 / link.bandwidth_Bps);
  EXPECT_NEAR(planner::predict_time(spec, gpipe, hw).data_comm -
                  planner::predict_time(spec, one_f_one_b, hw).data_comm,
              gathers, 1e-12);
  // With the parameter shards on the host, those four blocks' slices are not uploaded either.
  for (planner::RankLayout* l : {&gpipe_offloaded, &one_f_one_b_offloaded}) {
    l->offload_optimizer = l->offload_params = true;
  }
  EXPECT_NEAR(planner::predict_time(spec, gpipe_offloaded, hw).data_comm -
                  planner::predict_time(spec, one_f_one_b_offloaded, hw).data_comm,
              gathers + 4 * (block_bytes / 2) / hw.host_link_bandwidth, 1e-12);
}

// On a GPU node each pipeline message crosses the host link twice (under NCCL the pipeline group
// is staged MPI); priced as direct sends (Megatron-LM's NCCL point-to-point) without that.
// pp2, 1F1B, 4 micro-batches: stage 0 sends 4 activations, stage 1 sends 4 gradients.
TEST(CostModel, StagedPipelineMessagesCrossTheHostLinkTwice) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 4, 1024, 8000, 512);
  planner::HardwareSpec hw = planner::hardware_preset("h200");
  planner::RunLayout run;
  run.global_batch = 8;
  run.micro_batch = 2;
  run.seq_len = 512;
  run.pipeline = 2;
  run.layers = {2, 2};
  run.schedule = parallel::PipelineSchedule::one_f_one_b;
  const double bytes = 2.0 * 512 * 256 * 4;  // one micro-batch's boundary, fp32
  for (int stage = 0; stage < 2; ++stage) {
    const planner::RankLayout layout = planner::rank_layout(run, stage);
    ASSERT_EQ(layout.micro_batches, 4);
    hw.pipeline_staged = true;
    const double staged = planner::predict_time(spec, layout, hw).pipeline_comm;
    hw.pipeline_staged = false;
    const double direct = planner::predict_time(spec, layout, hw).pipeline_comm;
    EXPECT_GT(direct, 0.0);
    EXPECT_NEAR(staged - direct, 4 * 2 * bytes / hw.host_link_bandwidth, 1e-12) << stage;
  }
  // A CPU rank has no host link: nothing to stage.
  planner::HardwareSpec host = planner::hardware_preset("host");
  const planner::RankLayout layout = planner::rank_layout(run, 0);
  host.pipeline_staged = true;
  const double a = planner::predict_time(spec, layout, host).pipeline_comm;
  host.pipeline_staged = false;
  EXPECT_EQ(a, planner::predict_time(spec, layout, host).pipeline_comm);
}
// Parameter offload's uploads follow the store's gathers: each unit's host part before its forward
// and again before its backward, but the embeddings' second only where backward needs no
// parameters (tensor 1: the tied LM head ran its backward in forward); at tensor 2 the tied
// head's backward gathers them again, so every unit uploads twice.

TEST(CostModel, ParameterOffloadUploadsFollowTheGathers) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  const planner::HardwareSpec hw = planner::hardware_preset("h200");
  for (const int tensor : {1, 2}) {
    for (const int micro_batches : {1, 3}) {
      planner::RankLayout l;
      l.seq_len = 1024;
      l.micro_batch = 4;
      l.micro_batches = micro_batches;
      l.data = 2;
      l.tensor = tensor;
      l.zero_stage = 3;
      const double S = planner::predict_memory(spec, l)[core::MemCategory::optimizer] / 8;
      l.offload_optimizer = true;
      const double before = planner::predict_time(spec, l, hw).data_comm;
      const double hidden_before = planner::predict_time(spec, l, hw).hidden_comm;
      l.offload_params = true;
      const planner::TimePrediction t = planner::predict_time(spec, l, hw);
      const double uploads = t.data_comm - before;
      const auto units = core::parameter_units(
          core::parameter_table(spec, 2 * 16, core::TensorSplit{tensor, 0}), 2 * 16);
      const double U0 = double(units[0].size()) / 2, B = double(units[1].size()) / 2,
                   L = double(units.back().size()) / 2;
      const double m = micro_batches, link = 4 / hw.host_link_bandwidth;
      // Every unit twice per micro-batch, but backward's first (the last unit, kept in its
      // buffer since forward), a later micro-batch's first block (kept since the backward
      // before) and, at tensor 1, the embeddings in backward (the LM head ran its backward in
      // forward); at tensor 2 the tied head's backward gathers them again.
      const double kept = m * L + (m - 1) * B;
      EXPECT_NEAR(uploads, (m * (2 * S - (tensor == 1 ? U0 : 0.0)) - kept) * link, 1e-9)
          << tensor << " " << micro_batches;
      // The store uploads the unit expected next beside the compute of the one in use: hidden
      // but for the uploads that start a pass, unit 0 (before forward; at tensor 2 again
      // before backward) and the first micro-batch's first block, and at most the
      // micro-batches' compute less what the gathers hide.
      const double starts = m * (tensor == 1 ? 1 : 2) * U0 + B;
      double compute = 0.0;
      for (double f : t.micro_forward) compute += f;
      for (double b : t.micro_backward) compute += b;
      const double rest = uploads - starts * link;
      ASSERT_GT(rest, 0.0);
      EXPECT_NEAR(t.hidden_comm - hidden_before,
                  std::min(m * compute - hidden_before, rest), 1e-9)
          << tensor << " " << micro_batches;
      EXPECT_LT(t.hidden_comm - hidden_before, uploads);
    }
  }
}

// Ranks taking turns on fewer cores than their threads: the step is at least the node's busy
// thread-seconds over its cores (a rank waiting in the bubble polls, so it counts); applying it
// again changes nothing.
TEST(CostModel, SharedCoresBoundTheStepByTheNodesWork) {
  planner::TimePrediction t;
  t.compute = 0.7;
  t.bubble = 0.2;
  t.optimizer = 0.1;
  t.step = 1.0;
  EXPECT_DOUBLE_EQ(planner::busy_seconds(t), 1.0);
  planner::TimePrediction shared = t;
  planner::share_cores(shared, 8 * 1.0, 2);  // 8 such ranks, one thread each, on 2 cores
  EXPECT_DOUBLE_EQ(shared.step, 4.0);
  EXPECT_DOUBLE_EQ(shared.shared_cores, 3.0);
  EXPECT_DOUBLE_EQ(planner::busy_seconds(shared), 1.0);
  planner::share_cores(shared, 8 * 1.0, 2);
  EXPECT_DOUBLE_EQ(shared.step, 4.0);
  planner::TimePrediction roomy = t;
  planner::share_cores(roomy, 2 * 1.0, 2);  // a core per rank: the rank's own step decides
  EXPECT_DOUBLE_EQ(roomy.step, 1.0);
  EXPECT_EQ(roomy.shared_cores, 0.0);
  planner::share_cores(roomy, 100.0, 0);  // cores unknown (GPUs): unchanged
  EXPECT_DOUBLE_EQ(roomy.step, 1.0);
}

// Ranks pinned round-robin to shared cores: the step simulated piece by piece. Every stage's
// micro-batch takes 1 s forward and 2 s backward; the expected makespans were worked out by hand
// (the first ones) and by an independent event simulation, tests/reference/pinned_cores.py.
TEST(CostModel, PinnedRanksTakeTheirCoresPieceByPiece) {
  const auto step = [](int data, int tensor, int pipeline, int micro_batches, int cores,
                       double tail = 0.0, const std::string& schedule = "1f1b", int chunks = 1,
                       int ranks_per_node = 0) {
    planner::TimePrediction stage;
    stage.micro_forward.assign(std::size_t(chunks), 1.0);
    stage.micro_backward.assign(std::size_t(chunks), 2.0);
    stage.optimizer = tail;
    const planner::SharedCoresLayout l{data,          tensor,   1,     pipeline,      chunks,
                                       micro_batches, *parallel::parse_pipeline_schedule(schedule),
                                       cores,         ranks_per_node};
    return planner::pinned_step(l, std::vector<planner::TimePrediction>(std::size_t(pipeline), stage));
  };
  // A core each: 1F1B's (m + p - 1)(f + b).
  EXPECT_DOUBLE_EQ(step(1, 1, 2, 2, 2), 9.0);
  EXPECT_DOUBLE_EQ(step(1, 1, 4, 4, 4), 21.0);
  // Four data replicas on two cores: two replicas' work on each, one after the other.
  EXPECT_DOUBLE_EQ(step(4, 1, 1, 1, 2), 6.0);
  EXPECT_DOUBLE_EQ(step(4, 1, 1, 1, 2, 0.5), 7.0);  // and both replicas' optimizer after
  // A tensor group of 4 on 2 cores: two members per core run one after the other.
  EXPECT_DOUBLE_EQ(step(1, 4, 1, 1, 2), 6.0);
  // Pipelines sharing cores: stages 0 and 2 on core 0, 1 and 3 on core 1.
  EXPECT_DOUBLE_EQ(step(1, 1, 4, 4, 2), 29.0);
  EXPECT_DOUBLE_EQ(step(1, 1, 4, 8, 2), 53.0);
  EXPECT_DOUBLE_EQ(step(2, 1, 2, 2, 2), 12.0);  // two 2-stage pipelines: no idle core
  EXPECT_DOUBLE_EQ(step(1, 2, 2, 4, 2), 24.0);  // tensor pairs hold both cores
  // Two nodes of 2 cores, 4 ranks each: each stage's four replicas share one node's two cores,
  // slower than the same 8 ranks on one node of 4 cores.
  EXPECT_DOUBLE_EQ(step(4, 1, 2, 2, 2, 0.0, "1f1b", 1, 4), 15.0);
  EXPECT_DOUBLE_EQ(step(4, 1, 2, 2, 4), 12.0);
  // Never below the work over the cores, nor below the pipeline with a core per rank; the
  // interleaved schedule completes too.
  for (const auto& [schedule, chunks] : std::vector<std::pair<std::string, int>>{
           {"gpipe", 1}, {"1f1b", 1}, {"interleaved", 2}}) {
    const double s = step(2, 1, 4, 8, 2, 0.0, schedule, chunks);
    EXPECT_GE(s, 2 * 4 * 8 * 3.0 / 2 - 1e-9) << schedule;
    EXPECT_GE(s, step(1, 1, 4, 8, 4, 0.0, schedule, chunks) - 1e-9) << schedule;
  }
  // The prediction's wait for cores: what the simulation adds to the rank's own step.
  planner::TimePrediction t;
  t.compute = 2.0;
  t.step = 2.0;
  planner::stretch_step(t, 5.0);
  EXPECT_DOUBLE_EQ(t.step, 5.0);
  EXPECT_DOUBLE_EQ(t.shared_cores, 3.0);
  planner::stretch_step(t, 1.0);  // never below the rank's own step
  EXPECT_DOUBLE_EQ(t.step, 2.0);
  EXPECT_EQ(t.shared_cores, 0.0);
  EXPECT_THROW(step(1, 1, 2, 2, 0), std::invalid_argument);
  planner::TimePrediction no_chunks;  // a stage without its pieces is refused, not priced at 0
  EXPECT_THROW(planner::pinned_step(planner::SharedCoresLayout{}, {no_chunks}),
               std::invalid_argument);
  // The one rule: pinned ranks get the simulated step, others every rank's work over the cores.
  planner::TimePrediction stage;
  stage.micro_forward = {1.0};
  stage.micro_backward = {2.0};
  stage.step = 3.0;
  planner::SharedCoresLayout four{4, 1, 1, 1, 1, 1, parallel::PipelineSchedule::one_f_one_b, 2};
  planner::TimePrediction own = stage;
  planner::share_node_cores(own, four, {stage});
  EXPECT_DOUBLE_EQ(own.step, 4 * 3.0 / 2);
  four.pinned = true;
  own = stage;
  planner::share_node_cores(own, four, {stage});
  EXPECT_DOUBLE_EQ(own.step, step(4, 1, 1, 1, 2));
  four = planner::SharedCoresLayout{1, 1, 1, 4, 1, 4, parallel::PipelineSchedule::one_f_one_b,
                                    2};  // a 4-stage pipeline
  own = stage;
  planner::share_node_cores(own, four, std::vector<planner::TimePrediction>(4, stage));
  EXPECT_DOUBLE_EQ(own.step, 4 * 3.0 / 2);  // its bubble unseen by the bound
  four.pinned = true;
  own = stage;
  planner::share_node_cores(own, four, std::vector<planner::TimePrediction>(4, stage));
  EXPECT_DOUBLE_EQ(own.step, 29.0);
}

TEST(CostModel, SymbolicParameterCountEqualsTheBuiltModelForEveryPreset) {
  for (const std::string& name : core::preset_names()) {
    SCOPED_TRACE(name);
    const core::ModelSpec spec = *core::find_preset(name);
    core::MemoryTracker tracker;
    tracker.set_dry_run(true);  // counts every buffer, allocates none (OPT-175B included)
    auto gemm = core::make_host_gemm();
    core::Model model(spec, 1, std::min(spec.max_seq, 128), tracker, *gemm);
    EXPECT_EQ(core::parameter_count(spec), model.num_parameters());
    planner::RankLayout l;
    l.seq_len = std::min(spec.max_seq, 128);
    const planner::MemoryPrediction m = planner::predict_memory(spec, l);
    EXPECT_EQ(m[core::MemCategory::parameters], double(tracker.current(core::MemCategory::parameters)));
    EXPECT_EQ(m[core::MemCategory::activations], double(tracker.current(core::MemCategory::activations)));
    EXPECT_EQ(m[core::MemCategory::temporaries], double(tracker.current(core::MemCategory::temporaries)));
  }
}

TEST(CostModel, Opt175bStepGraphAndPredictionAreFast) {
  const core::ModelSpec spec = *core::find_preset("opt-175b");
  planner::RankLayout l;
  l.seq_len = 2048;
  l.tensor = 8;
  l.pipeline = 8;
  l.micro_batches = 16;
  l.chunks[0].stage = core::StageRange{0, 12, true, false};
  l.chunks[0].slots = 8;
  const auto start = std::chrono::steady_clock::now();
  const planner::HardwareSpec hw = planner::hardware_preset("a100-80g");
  const planner::TimePrediction t = planner::predict_time(spec, l, hw);
  const planner::MemoryPrediction m = planner::predict_memory(spec, l);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("OPT-175B stage of 12 blocks at tp8 x pp8: predicted %.2f s per step, %s; %.2f ms\n",
              t.step, m.format().c_str(), ms);
  EXPECT_GT(t.step, 0.0);
  EXPECT_GT(m.total(), 0.0);
}

// rotor on a 2d / 3d grid (planner::plan_grid_checkpointing, one op a block): under every budget
// from the least memory any schedule needs to keeping everything, its schedule fits the budget in
// the models' own bytes (predict_memory with the schedule, which test_tensor_md checks against the
// tracker) and recomputes as few blocks as the best of every valid whole-block schedule does
// (brute force over 3^6 block schedules; the blocks are equal, so time is the dropped count).
TEST(CostModel, GridRotorRecomputesTheFewestBlocksThatFit) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 6, 32, 4, 64, 201, 16);
  const planner::HardwareSpec hw = planner::hardware_preset("a100-80g");
  using core::Keep;
  for (core::TensorMode mode : {core::TensorMode::d2, core::TensorMode::d3}) {
    planner::RankLayout l;
    l.tensor_mode = mode;
    l.tensor = mode == core::TensorMode::d3 ? 8 : 4;  // q = 2
    l.micro_batch = 4;
    l.micro_batches = 2;
    l.seq_len = 16;
    // Every valid whole-block schedule: its memory and its dropped blocks.
    std::vector<std::pair<double, int>> all;
    std::vector<int> code(std::size_t(spec.layers), 0);  // 0 all, 1 input, 2 none
    for (int n = 0; n < 729; ++n) {
      int v = n;
      bool valid = true;
      std::vector<Keep> keep;
      int dropped = 0;
      for (int b = 0; b < spec.layers; ++b, v /= 3) {
        code[std::size_t(b)] = v % 3;
        const int prev = b == 0 ? 0 : code[std::size_t(b) - 1];
        if (code[std::size_t(b)] == 2 && prev == 0) valid = false;
        keep.push_back(code[std::size_t(b)] == 0 ? Keep::all
                       : code[std::size_t(b)] == 1 ? Keep::input : Keep::none);
        keep.push_back(code[std::size_t(b)] == 0 ? Keep::all : Keep::none);
        dropped += code[std::size_t(b)] != 0;
      }
      if (!valid) continue;
      planner::RankLayout k = l;
      k.keep = keep;
      all.emplace_back(planner::predict_memory(spec, k).total(), dropped);
    }
    double least = all.front().first, most = least;
    for (const auto& [memory, dropped] : all) {
      least = std::min(least, memory);
      most = std::max(most, memory);
    }
    for (int step = 0; step <= 40; ++step) {
      const double budget = least + (most - least) * step / 40.0;
      int fewest = spec.layers + 1;
      for (const auto& [memory, dropped] : all) {
        if (memory <= budget) fewest = std::min(fewest, dropped);
      }
      const planner::CheckpointPlan plan = planner::plan_grid_checkpointing(
          spec, l, hw, core::CheckpointPolicy::rotor, budget, 0, {}, int(budget) + 1);
      ASSERT_TRUE(plan.feasible) << budget;
      planner::RankLayout k = l;
      k.keep = plan.keep;
      EXPECT_LE(planner::predict_memory(spec, k).total(), budget) << plan.description;
      int dropped = 0;
      for (int b = 0; b < spec.layers; ++b) dropped += plan.keep[std::size_t(b) * 2] != Keep::all;
      EXPECT_EQ(dropped, fewest) << core::tensor_mode_name(mode) << " budget " << budget << ": "
                                 << plan.description;
    }
    // Below the least: infeasible, with the least as the minimum.
    const planner::CheckpointPlan tight = planner::plan_grid_checkpointing(
        spec, l, hw, core::CheckpointPolicy::rotor, least - 1, 0, {}, int(least));
    EXPECT_FALSE(tight.feasible);
    EXPECT_EQ(tight.minimum_bytes, least);
    // full and sqrt: the 1d schedules, two ops a block.
    const planner::CheckpointPlan full =
        planner::plan_grid_checkpointing(spec, l, hw, core::CheckpointPolicy::full, 0, 0, {});
    EXPECT_EQ(full.description, "full: I.|I.|I.|I.|I.|I.");
    const planner::CheckpointPlan sqrt =
        planner::plan_grid_checkpointing(spec, l, hw, core::CheckpointPolicy::sqrt, 0, 0, {});
    EXPECT_EQ(sqrt.description, "sqrt: I.|..|..|I.|..|..");
    // Recomputing a block costs time.
    planner::RankLayout k = l;
    k.keep = full.keep;
    EXPECT_GT(planner::predict_time(spec, k, hw).step, planner::predict_time(spec, l, hw).step);
  }
}

// ZeRO 2 on a 2d grid x data ranks (the closed forms test_tensor_md checks against the tracker):
// each rank keeps its 1/data of the gradients plus the buffers backward fills before their
// reduce-scatter (unit 0: the embeddings and replicated vectors; two blocks), so on gpt2-124m the
// gradients shrink below ZeRO 1's whole buffer, more with more data ranks.
// RankLayout::bf16_weight_copy (a GEMM that keeps bf16 weights): 2 bytes per float of what the
// rank holds at once, in the temporaries and nowhere else: its whole flat buffer (1d ZeRO 0-2),
// under ZeRO-3 the LM head on the stage that runs it chunked (tensor 1), else nothing; nothing in
// the grids (2d, 2.5d, 3d), whose products take every weight block from a work buffer.
TEST(CostModel, Bf16WeightCopyIsTwoBytesPerFloatHeld) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  const double head = double(core::padded_vocab(spec, 1)) * spec.hidden;
  struct Case {
    const char* name;
    int stage, tensor;
    core::TensorMode mode;
    bool first_of_two_stages;
    double held;  // floats; < 0: the whole flat buffer (parameters / 4)
  };
  const Case cases[] = {
      {"1d zero 0", 0, 1, core::TensorMode::d1, false, -1},
      {"1d zero 2", 2, 1, core::TensorMode::d1, false, -1},
      {"1d tensor 2", 1, 2, core::TensorMode::d1, false, -1},
      {"1d zero 3", 3, 1, core::TensorMode::d1, false, head},
      {"1d zero 3, first of two stages", 3, 1, core::TensorMode::d1, true, 0},
      {"1d zero 3, tensor 2", 3, 2, core::TensorMode::d1, false, 0},
      {"2d zero 1", 1, 4, core::TensorMode::d2, false, 0},
      {"2.5d (depth 2)", 0, 8, core::TensorMode::d2_5, false, 0},
      {"3d", 0, 8, core::TensorMode::d3, false, 0},
  };
  using core::MemCategory;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    planner::RankLayout l;
    l.seq_len = 1024;
    l.micro_batch = 4;
    l.data = 2;
    l.zero_stage = c.stage;
    l.tensor = c.tensor;
    l.tensor_mode = c.mode;
    if (c.mode == core::TensorMode::d2_5) l.depth = 2;
    if (c.first_of_two_stages) {
      l.pipeline = 2;
      l.chunks[0].stage = core::StageRange{.layer_begin = 0, .layer_end = 6, .head = false};
    }
    const planner::MemoryPrediction without = planner::predict_memory(spec, l);
    l.bf16_weight_copy = true;
    const planner::MemoryPrediction with = planner::predict_memory(spec, l);
    const double held = c.held < 0 ? without[MemCategory::parameters] / 4 : c.held;
    for (int k = 0; k < int(MemCategory::count); ++k) {
      const auto category = MemCategory(k);
      EXPECT_EQ(with[category] - without[category],
                category == MemCategory::temporaries ? 2.0 * held : 0.0)
          << core::category_name(category);
    }
  }
}

// A GPU rank's LM head runs 2048 rows of logits a chunk, the host's 256 (core::Model picks by
// where its memory is): the plan prices the rank's chunk, where the head runs in forward.
TEST(CostModel, DeviceRanksPriceTheDevicesLogitsChunk) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  const double row = 50304.0 * 4;  // bytes of one row of logits (the padded vocabulary)
  struct Case {
    const char* name;
    int micro_batch, tensor;
    bool head;
    double extra_rows;  // rows of logits the device's chunk holds beyond the host's
  };
  const Case cases[] = {
      {"4 x 1024 rows", 4, 1, true, 2048 - 256},
      {"1 x 1024 rows: fewer than a device chunk", 1, 1, true, 1024 - 256},
      {"tensor 2: the head after forward, no chunk", 4, 2, true, 0},
      {"a stage without the head", 4, 1, false, 0},
  };
  using core::MemCategory;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    planner::RankLayout l;
    l.seq_len = 1024;
    l.micro_batch = c.micro_batch;
    l.tensor = c.tensor;
    if (!c.head) {
      l.pipeline = 2;
      l.chunks[0].stage = core::StageRange{.layer_begin = 0, .layer_end = 6, .head = false};
    }
    const planner::MemoryPrediction host = planner::predict_memory(spec, l);
    l.device = true;
    const planner::MemoryPrediction device = planner::predict_memory(spec, l);
    for (int k = 0; k < int(MemCategory::count); ++k) {
      const auto category = MemCategory(k);
      EXPECT_EQ(device[category] - host[category],
                category == MemCategory::temporaries ? c.extra_rows * row : 0.0)
          << core::category_name(category);
    }
  }
  // colossal_plan for a GPU's hardware (a host link) plans the device's chunk.
  planner::RunLayout run;
  run.global_batch = 8;
  run.micro_batch = 4;
  run.layers = {spec.layers};
  run.device = true;
  EXPECT_TRUE(planner::rank_layout(run, 0).device);
}

TEST(CostModel, GridZero2KeepsAShardOfTheGradients) {
  const core::ModelSpec spec = *core::find_preset("gpt2-124m");
  double previous = 0.0;
  for (int data : {2, 4, 8}) {
    planner::RankLayout l;
    l.tensor_mode = core::TensorMode::d2;
    l.tensor = 4;
    l.data = data;
    l.micro_batch = 4;
    l.seq_len = 1024;
    l.zero_stage = 1;
    const planner::MemoryPrediction one = planner::predict_memory(spec, l);
    l.zero_stage = 2;
    const planner::MemoryPrediction two = planner::predict_memory(spec, l);
    using core::MemCategory;
    std::printf("gpt2-124m 2d q=2 x data %d: gradients %.1f MiB (ZeRO 1) -> %.1f MiB (ZeRO 2)\n",
                data, one[MemCategory::gradients] / 1048576.0,
                two[MemCategory::gradients] / 1048576.0);
    EXPECT_EQ(two[MemCategory::parameters], one[MemCategory::parameters]);
    EXPECT_EQ(two[MemCategory::optimizer], one[MemCategory::optimizer]);
    // The embedding unit (a third of gpt2-124m) stays whole while backward fills it, and two
    // block buffers (one reducing while the next fills), so 2 data ranks save 7%, 8 ranks 44%
    // (110.7, 81.0, 66.1 of 118.8 MiB).
    EXPECT_LT(two[MemCategory::gradients], one[MemCategory::gradients]) << data;
    if (data == 8) {
      EXPECT_LT(two[MemCategory::gradients], 0.6 * one[MemCategory::gradients]);
    }
    if (previous > 0) {
      EXPECT_LT(two[MemCategory::gradients], previous);
    }
    previous = two[MemCategory::gradients];
  }
}

}  // namespace
}  // namespace colossal
