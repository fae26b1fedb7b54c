// The symbolic graph of one training micro-batch: every op of forward and backward with its FLOPs,
// the bytes it moves, the activation bytes it keeps for backward and the collective its sharding
// implies, computed from the model spec and the layout alone (nothing is allocated, no kernel
// runs). The first piece of the symbolic cost pass: its saved and temporary bytes come from the
// activation table core::Model allocates from (core/activation_sizes.hpp; the ops' shares add up
// to what the model allocates, tests/test_step_graph.cpp), and its matmul FLOPs add up to the
// 6N + 12LTd per token of core::flops_per_token.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/keep.hpp"
#include "core/model_spec.hpp"

namespace colossal::planner {

// One rank's view of the layout.
struct Layout {
  int micro_batch = 1;
  int seq_len = 1024;            // the whole sequence
  int tensor = 1;                // 1D tensor parallelism
  bool sequence_split = false;   // Megatron sequence parallelism inside the tensor group
  int sequence = 1;              // ring self-attention
  core::StageRange stage{};      // pipeline stage (the whole model by default)
  // Activation checkpointing, as core::ModelOptions: per op of the whole model (two per block),
  // empty keeps everything; selective drops the attention probabilities of kept blocks.
  std::vector<core::Keep> keep{};
  bool selective = false;
  bool bf16 = false;             // activations and their collectives in 2 bytes (mixed precision)
  bool bf16_operands = false;  // colossal_train's host bf16 storage (core::ActivationShape's two)
  // A GPU rank: the LM head's logits chunk holds core::kDeviceLogitsChunkFloats, not the host's
  // kLogitsChunkFloats (core::Model picks by where its memory is).
  bool device = false;
};

struct Op {
  std::string name;                // e.g. "h.3.mlp.fc"
  const char* kind = "";           // embedding | layernorm | gemm | attention | activation | loss
  double forward_flops = 0.0;
  double backward_flops = 0.0;
  double bytes = 0.0;              // forward: bytes read and written (fp32)
  double saved_bytes = 0.0;        // activations kept for backward
  const char* collective = "";     // what the sharding implies, per micro-batch (forward+backward)
  double collective_bytes = 0.0;   // payload of those collectives
  double recompute_flops = 0.0;    // its forward run again in backward (activation checkpointing)
  bool recomputed = false;         // in a dropped segment: its whole forward runs again
  // Share of the collective that forward runs (and recomputation runs again): 1 for row-parallel
  // outputs, the embedding and sequence_split's gathers, 0.5 for a reduce-scatter forward +
  // all-gather backward pair, 0 for column-parallel inputs (their all-reduce is in backward).
  double forward_collective = 0.0;
  // The attention core's shape, for its rate (HardwareSpec::attention_rate): the length of the
  // query and key blocks its products multiply (this rank's T; a ring's local block) and the
  // head width. 0 for other ops.
  double seq = 0.0;
  double head_dim = 0.0;
};

struct StepGraph {
  std::vector<Op> ops;
  // Activation checkpointing's temporaries: the recompute arena (the largest dropped segment)
  // and, under selective recompute, one block's attention probabilities.
  double arena_bytes = 0.0;
  double selective_bytes = 0.0;
  // The temporaries every block's backward shares (core::ActivationSizes::scratch).
  double scratch_bytes = 0.0;
  // The chunk's checkpoint schedule as core::Model runs it (core::stage_activations' keep: its
  // blocks' ops, the first keeping its input).
  std::vector<core::Keep> keep;
  double recompute_flops() const;
  double forward_flops() const;
  double backward_flops() const;
  double saved_bytes() const;
  double collective_bytes() const;
};

StepGraph build_step_graph(const core::ModelSpec& spec, const Layout& layout);

}  // namespace colossal::planner
