// The pipeline partition: which contiguous blocks each (virtual) stage runs. One partitioner for
// the trainer's default split (apps/layout.cpp pipeline_layers) and the planner's search, so the
// layout colossal_plan predicts is the layout colossal_train runs.
#pragma once

#include <vector>

#include "core/model_spec.hpp"

namespace colossal::parallel {

// Blocks per stage minimising the slowest stage: a dynamic program over contiguous partitions of
// `layer_cost` (one entry per block) into `stages` non-empty stages, the first stage also paying
// `first_extra` (embeddings) and the last `last_extra` (final layernorm, LM head, loss). Among
// equally slow partitions, the one with the fewest blocks on the earliest stages (the first stage
// holds the most micro-batches under 1F1B). Throws std::invalid_argument if stages < 1 or there
// are fewer blocks than stages.
std::vector<int> partition_stages(const std::vector<double>& layer_cost, int stages,
                                  double first_extra, double last_extra);

// partition_stages over a model's blocks by forward FLOPs per token (core::block_forward_flops
// each, core::head_forward_flops on the last stage, nothing to speak of for the embedding).
std::vector<int> balanced_stage_layers(const core::ModelSpec& spec, int seq_len, int stages);

}  // namespace colossal::parallel
