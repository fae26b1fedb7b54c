// 1D (Megatron) tensor parallelism (with and without sequence_split) and ring self-attention
// sequence parallelism, alone, together and with data parallelism and ZeRO, train the single-rank
// model: per-step losses and final logical weights against a single-process run, plus the bytes
// the tensor and sequence groups move and the activation memory per rank against closed forms.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "apps/trainer.hpp"
#include "io/config.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train_parity.hpp"

using namespace colossal;

namespace {

std::string shared_data(parallel::Communicator& world) {
  return test::shared_training_text(world, "colossal_tp_data.txt", 54321);
}

struct Layout {
  std::string arch;
  int tensor, data = 1, stage = 0;
  int vocab = 200;          // padded to a multiple of tensor * 16: padding is exercised
  int vocab_multiple = 16;
  bool split = false;       // parallel.tensor.sequence_split
  int sequence = 1;         // parallel.sequence (ring self-attention)
  bool bf16 = false;        // train.precision: bf16 (emulated here), bf16-saved operands
  bool offload = false;     // parallel.zero.offload.optimizer (ZeRO >= 1)
};

io::Config config(const std::string& data, const Layout& l, int tensor, int dp, int sequence,
                  const std::string& run) {
  const std::string text =
      "model: {arch: " + l.arch + (l.arch == "llama" ? ", kv_heads: 2" : "") +
      ", layers: 2, hidden: 32, heads: 4, ffn_hidden: 64, vocab: " +
      std::to_string(l.vocab) + ", max_seq: 16, vocab_multiple: " +
      std::to_string(l.vocab_multiple) + "}\n"
      "data: {path: " + data + "}\n"
      "train: {steps: 10, seq_len: 16, global_batch: 8, micro_batch: 2, precision: " +
      (l.bf16 ? "bf16" : "fp32") + ",\n"
      "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n"
      "parallel: {data: " + std::to_string(dp) + ", tensor: {size: " + std::to_string(tensor) +
      ", sequence_split: " + (l.split && tensor > 1 ? "true" : "false") + "}, sequence: " +
      std::to_string(sequence) + ", zero: {stage: " +
      std::to_string(tensor > 1 || dp > 1 || sequence > 1 ? l.stage : 0) +
      (l.offload && (tensor > 1 || dp > 1 || sequence > 1) ? ", offload: {optimizer: true}"
                                                           : "") +
      "}, bucket_mb: 0.01}\n"
      "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " +
      (std::filesystem::temp_directory_path() / ("colossal_" + run)).string() + "}\n";
  return io::parse_config(text, "test");
}

class TensorParallel : public ::testing::TestWithParam<Layout> {};

TEST_P(TensorParallel, TrainsTheSingleRankModel) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const Layout layout = GetParam();
  const int ranks = layout.tensor * layout.data * layout.sequence;
  if (world.size() != ranks) GTEST_SKIP() << "layout needs " << ranks << " ranks";
  const std::string data = shared_data(world);

  apps::Trainer reference(config(data, layout, 1, 1, 1, "tp_ref" + std::to_string(world.rank())),
                          nullptr);
  const apps::TrainSummary expected = reference.train();

  apps::Trainer trainer(config(data, layout, layout.tensor, layout.data, layout.sequence, "tp"),
                        nullptr, &world);
  EXPECT_NE(trainer.plan().find("tensor: " + std::to_string(layout.tensor) + ", sequence: " +
                                std::to_string(layout.sequence)),
            std::string::npos)
      << trainer.plan();
  parallel::Communicator& tp = trainer.tensor_parallel();
  parallel::Communicator& sp = trainer.sequence_parallel();
  ASSERT_EQ(tp.size(), layout.tensor);
  ASSERT_EQ(sp.size(), layout.sequence);
  EXPECT_EQ(trainer.data_parallel().size(), layout.data);
  EXPECT_EQ(trainer.gradient_group().size(), layout.data * layout.sequence);
  EXPECT_EQ(tp.rank(), world.rank() % layout.tensor) << "tensor ranks are adjacent";
  EXPECT_EQ(sp.rank(), world.rank() / layout.tensor % layout.sequence) << "then sequence ranks";
  tp.reset_stats();
  sp.reset_stats();
  const apps::TrainSummary got = trainer.train();

  // bf16: the parallel layout sums in another order, and a sum that differs in its last bit can
  // round to another bf16 value in the next product: measured within 1.9e-5 relative over 10
  // steps (2 and 4 ranks), bounded here at 1e-4.
  test::expect_same_losses(got, expected, layout.bf16 ? 1e-4 : 1e-5);

  // Bytes the tensor group moved during train(), per micro-batch of N = micro_batch * T tokens.
  // Without sequence_split: forward all-reduces the embedding and two (N, C) activations per
  // block, the cross-entropy N maxima then 2N sums; backward the LM head's input gradient and two
  // (N, C) per block. With it, each of those (N, C) all-reduces is a reduce-scatter to the rows,
  // and (N, C) all-gathers bring the rows back before every column-parallel layer: in forward
  // ln1 and ln2 per block and ln_f, in backward the output gradient twice and the saved ln2 and
  // ln1 per block, and the gradient for the embedding. Per step the norm adds one scalar (and,
  // with sequence_split, one all-reduce of every layernorm gradient); saving the model gathers
  // every rank's parameters once.
  // Tokens per micro-batch on this rank: N = micro_batch * (T / sequence).
  const uint64_t steps = 10, L = 2, C = 32, Tl = 16 / layout.sequence, N = 2 * Tl;
  const uint64_t micro = 8 / (2 * uint64_t(layout.data));
  const uint64_t NC = 4 * N * C;  // bytes of one (N, C) tensor
  const auto& stats = tp.stats();
  const double ring = double(layout.tensor - 1) / layout.tensor;
  if (layout.tensor == 1) {
    EXPECT_EQ(stats.total_calls(), 0u) << "no tensor group, no tensor traffic";
  } else if (!layout.split) {
    EXPECT_EQ(stats.all_reduce.payload_bytes,
              steps * (micro * ((4 * L + 2) * NC + 4 * 3 * N) + 8));
    EXPECT_EQ(stats.all_reduce.calls, steps * (micro * (4 * L + 4) + 1));
    EXPECT_EQ(stats.reduce_scatter.calls, 0u);
    EXPECT_EQ(stats.all_gather.calls, 1u);
  } else {
    // The layernorm gradients: all of them, or (ZeRO 2-3) those in this rank's shard.
    // llama: RMSNorm weights only, no biases.
    const uint64_t layernorm_bytes = 4 * (layout.arch == "llama" ? 2 * L + 1 : 4 * L + 2) * C;
    if (layout.stage < 2 || layout.data * layout.sequence == 1) {
      EXPECT_EQ(stats.all_reduce.payload_bytes,
                steps * (micro * 4 * 3 * N + layernorm_bytes + 8));
    }
    EXPECT_EQ(stats.all_reduce.calls, steps * (micro * 2 + 2));
    EXPECT_EQ(stats.reduce_scatter.payload_bytes, steps * micro * (4 * L + 2) * NC);
    EXPECT_EQ(stats.reduce_scatter.calls, steps * micro * (4 * L + 2));
    EXPECT_NEAR(stats.reduce_scatter.wire_bytes, ring * double(stats.reduce_scatter.payload_bytes),
                1.0);
    EXPECT_EQ(stats.all_gather.calls, steps * micro * (6 * L + 2) + 1);
  }
  if (layout.tensor > 1) {
    EXPECT_NEAR(stats.all_reduce.wire_bytes,
                2.0 * ring * double(stats.all_reduce.payload_bytes), 1.0);
    EXPECT_EQ(stats.all_gather.payload_bytes,
              (layout.split ? steps * micro * (6 * L + 2) * NC : 0) +
                  4 * uint64_t(layout.tensor) * trainer.model().flat_size());
  }
  // The sequence group: per block, forward passes the key then the value blocks (S-1 shifts
  // each) and backward the value then the key blocks, each a (B, T/S, C/t) block; backward then
  // reduce-scatters every rank's dK/dV parts (2 * B * T * C/t floats).
  const uint64_t S = layout.sequence, Cl = C / layout.tensor;
  const auto& ring_stats = sp.stats();
  if (S == 1) {
    EXPECT_EQ(ring_stats.total_calls(), 0u);
  } else {
    const uint64_t shifts = steps * micro * L * 4 * (S - 1);
    EXPECT_EQ(ring_stats.send.calls, shifts);
    EXPECT_EQ(ring_stats.send.payload_bytes, shifts * 4 * N * Cl);
    EXPECT_EQ(ring_stats.recv.payload_bytes, shifts * 4 * N * Cl);
    EXPECT_EQ(ring_stats.reduce_scatter.calls, steps * micro * L);
    EXPECT_EQ(ring_stats.reduce_scatter.payload_bytes, steps * micro * L * 4 * 2 * S * N * Cl);
    EXPECT_EQ(ring_stats.all_reduce.calls + ring_stats.all_gather.calls, 0u);
  }

  // Final weights: the logical tensors (padding rows dropped) against the single-rank model.
  if (!layout.bf16) test::expect_same_weights(trainer, reference);
  if (layout.offload) {
    // Under sequence_split reduce() still sums the layernorms' partial gradients after backward,
    // so no offloaded gradient goes down during backward: all of them in the step. Without it,
    // all but the units still reducing when backward ended (the embeddings and the first block).
    const auto& off = trainer.optimizer().offload_stats();
    const uint64_t gradients = off.to_host_bytes / 2;  // the other half: parameters
    EXPECT_GT(gradients, 0u);
    if (layout.split) {
      EXPECT_EQ(off.early_to_host_bytes, 0u);
    } else {
      EXPECT_GT(off.early_to_host_bytes, 0u);
      EXPECT_LT(off.early_to_host_bytes, gradients);
    }
  }

  // Activation memory per rank: with t tensor ranks, per block 3 (B,T,C) tensors (ln1, mid, ln2)
  // and 4 per-token statistics stay whole, divided by t only under sequence_split (s = t then,
  // else 1: `rows` below), while the q/k/v and attention outputs (4 (B,T,C)), the probabilities (B,H,T,T) and
  // the MLP hidden (B,T,F) are divided by t; plus L+1 residuals (/s), the final layernorm output
  // (whole: the LM head needs every row) with its statistics (/s) and per-token losses, and the
  // logits (B,T,V_padded/t). In Korthikanti et al.'s terms (fp32, no dropout, GELU recomputed):
  // 4 * (3sbh/s + 4sbh/t + 4sb/s + a*s^2*b/t + 4sbh/t) bytes per layer with F = 4h.
  // Ring attention divides every token count by S (BT below is this rank's tokens) and keeps the
  // probabilities of its T/S query rows against all T keys: memory per rank falls as 1/S.
  const uint64_t t = layout.tensor, B = 2, T = 16, H = 4, F = 64, BT = B * Tl;
  const uint64_t rows = layout.split ? t : 1;
  const uint64_t pad = t * layout.vocab_multiple;  // one tensor rank never pads
  const uint64_t vocab_padded =
      t == 1 ? uint64_t(layout.vocab) : (uint64_t(layout.vocab) + pad - 1) / pad * pad;
  // llama: RMSNorm saves one statistic per token (no mean), and the SwiGLU's gate and up.
  const bool llama = layout.arch == "llama";
  const uint64_t stats_per_norm = llama ? 1 : 2, mlp_hidden = llama ? 2 * F : F;
  // bf16 saves ln1, ln2 and ln_f in half (not under sequence_split), q/k/v and the attention
  // output and the probabilities in half (not under a ring): core/activation_sizes.hpp. Without
  // tensor parallelism the LM head runs its backward in forward, chunk by chunk, and keeps the
  // gradient of its input (B,T,C) instead of the logits.
  const uint64_t norm_div = layout.bf16 && !layout.split ? 2 : 1;
  const uint64_t qkv_div = layout.bf16 && layout.sequence == 1 ? 2 : 1;
  const uint64_t per_block = BT * C / rows + 2 * BT * C / rows / norm_div +
                             4 * BT * C / t / qkv_div + 2 * stats_per_norm * BT / rows +
                             B * H / t * Tl * T / qkv_div + BT * mlp_hidden / t;
  const uint64_t floats = BT * C / rows * (L + 1) + L * per_block + BT * C / norm_div +
                          stats_per_norm * BT / rows + BT +
                          (t == 1 ? BT * C : BT * vocab_padded / t);
  EXPECT_EQ(trainer.memory().current(core::MemCategory::activations), 4 * floats);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TensorParallel,
    ::testing::Values(Layout{"gpt2", 2}, Layout{"opt", 2}, Layout{"gpt2", 4}, Layout{"opt", 4},
                      Layout{"gpt2", 2, 2, 0}, Layout{"opt", 2, 2, 1}, Layout{"gpt2", 2, 2, 2},
                      Layout{"opt", 2, 2, 3},
                      // GPT-2's real vocabulary, padded to tensor * 128 rows.
                      Layout{"gpt2", 2, 1, 0, 50257, 128}, Layout{"gpt2", 4, 1, 0, 50257, 128},
                      // Megatron sequence parallelism inside the tensor group.
                      Layout{"gpt2", 2, 1, 0, 200, 16, true}, Layout{"opt", 2, 1, 0, 200, 16, true},
                      Layout{"opt", 4, 1, 0, 200, 16, true}, Layout{"gpt2", 2, 2, 1, 200, 16, true},
                      // Ring self-attention, alone and with data and tensor parallelism.
                      Layout{"gpt2", 1, 1, 0, 200, 16, false, 2},
                      Layout{"opt", 1, 1, 0, 200, 16, false, 2},
                      Layout{"gpt2", 1, 1, 0, 200, 16, false, 4},
                      Layout{"opt", 1, 2, 2, 200, 16, false, 2},
                      Layout{"gpt2", 1, 2, 3, 200, 16, false, 2},
                      Layout{"gpt2", 2, 1, 1, 200, 16, false, 2},
                      Layout{"opt", 2, 1, 0, 200, 16, true, 2},
                      // Every axis at once on 8 ranks.
                      Layout{"gpt2", 2, 2, 1, 200, 16, false, 2},
                      Layout{"opt", 2, 2, 3, 200, 16, true, 2},
                      // LLaMA (2 kv heads for 4 query heads, one group per tensor rank).
                      Layout{"llama", 2}, Layout{"llama", 2, 2, 3},
                      Layout{"llama", 2, 1, 0, 200, 16, true},
                      Layout{"llama", 1, 1, 0, 200, 16, false, 2},
                      Layout{"llama", 2, 1, 0, 200, 16, true, 2},
                      // bf16 (products of rounded operands, operands saved in bf16).
                      Layout{"gpt2", 2, 1, 0, 200, 16, false, 1, true},
                      Layout{"opt", 2, 1, 0, 200, 16, true, 1, true},
                      Layout{"llama", 1, 1, 0, 200, 16, false, 2, true},
                      Layout{"gpt2", 2, 2, 2, 200, 16, false, 1, true},
                      // ZeRO-2 with the optimizer offloaded: the gradients' copies wait for
                      // the sequence-split sums, or go down during backward without them.
                      Layout{"gpt2", 2, 2, 2, 200, 16, true, 1, false, true},
                      Layout{"opt", 2, 2, 2, 200, 16, false, 1, false, true}),
    [](const auto& info) {
      const Layout& l = info.param;
      return l.arch + "_tp" + std::to_string(l.tensor) + "_sp" + std::to_string(l.sequence) +
             (l.data > 1 ? "_dp" + std::to_string(l.data) + "_zero" + std::to_string(l.stage)
                         : std::string()) +
             (l.vocab == 50257 ? "_vocab50257" : "") + (l.split ? "_sequence_split" : "") +
             (l.bf16 ? "_bf16" : "") + (l.offload ? "_offload" : "");
    });

}  // namespace
