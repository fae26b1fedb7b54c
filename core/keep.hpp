// What an activation-checkpoint schedule says about one op of the chain (a transformer block is
// two ops: its attention sub-layer, then its MLP sub-layer). The executor (core::Model) and the
// solvers (checkpoint_sched/solvers.hpp, which solve over these types) share it; it depends on
// nothing. It lives in core because the model needs it and core depends on no other folder.
#pragma once

#include <cstdint>
#include <vector>

namespace colossal::core {

// all:   the op's input and its saved activations are kept from the first forward.
// input: only its input is kept; a recomputed segment starts here.
// none:  nothing is kept; the segment begun by the nearest earlier `input` op continues.
// Dropped activations are rebuilt in backward by running the segment's forward again from its
// kept input, into one arena shared by every segment (they are recomputed one at a time).
enum class Keep : uint8_t { all, input, none };

// Ops of one transformer block: the attention sub-layer and the MLP sub-layer.
inline constexpr int kOpsPerBlock = 2;

// Whole-block recomputation of the listed blocks (each keeps only its input), everything else
// kept: the schedule of `checkpointing.policy: manual`.
inline std::vector<Keep> keep_blocks(int layers, const std::vector<int>& blocks) {
  std::vector<Keep> keep(std::size_t(layers) * kOpsPerBlock, Keep::all);
  for (int b : blocks) {
    if (b < 0 || b >= layers) continue;
    keep[std::size_t(b) * kOpsPerBlock] = Keep::input;
    for (int op = 1; op < kOpsPerBlock; ++op) keep[std::size_t(b) * kOpsPerBlock + op] = Keep::none;
  }
  return keep;
}

}  // namespace colossal::core
