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

// Whether backward recomputes a segment ending at op `op` of `keep` (one model's or stage's ops):
// the op keeps less than everything and the next op starts another segment, or there is none.
inline bool segment_ends_at(const std::vector<Keep>& keep, int op) {
  if (keep[std::size_t(op)] == Keep::all) return false;
  return op + 1 == int(keep.size()) || keep[std::size_t(op) + 1] != Keep::none;
}

// The first op of the recomputed segment that ends at op `last`: the one whose input is kept.
inline int segment_first(const std::vector<Keep>& keep, int last) {
  int first = last;
  while (keep[std::size_t(first)] == Keep::none) --first;
  return first;
}

// The blocks (0 .. keep.size() / kOpsPerBlock - 1) whose parameters a backward over `keep`
// gathers, in order, as core::Model runs it: from the last block down, the blocks of the segment
// recomputed for its MLP op (going up), the block, and where a segment ends at its attention op,
// that segment's blocks and the block again.
inline std::vector<int> backward_block_gathers(const std::vector<Keep>& keep) {
  std::vector<int> order;
  auto segment = [&](int last) {
    for (int b = segment_first(keep, last) / kOpsPerBlock; b <= last / kOpsPerBlock; ++b) {
      order.push_back(b);
    }
  };
  for (int i = int(keep.size()) / kOpsPerBlock - 1; i >= 0; --i) {
    if (segment_ends_at(keep, i * kOpsPerBlock + 1)) segment(i * kOpsPerBlock + 1);
    order.push_back(i);
    if (segment_ends_at(keep, i * kOpsPerBlock)) {
      segment(i * kOpsPerBlock);
      order.push_back(i);
    }
  }
  return order;
}

// Of those gathers, the ones that find another block in the one block buffer (ZeRO-3 all-gathers
// or uploads the block for each): asked again at once, a block is still there. `held`: the block
// in the buffer when backward starts (-1: another unit, e.g. the final layernorm's).
// `first_apart`: block 0 is the stage's unit 0 (a pipeline stage without the embeddings), which
// has a buffer of its own and is never kept there: each of its gathers moves it, and none of
// them takes the block buffer.
inline int backward_block_transfers(const std::vector<Keep>& keep, int held,
                                    bool first_apart = false) {
  if (first_apart && held == 0) held = -1;
  int transfers = 0;
  for (int b : backward_block_gathers(keep)) {
    if (first_apart && b == 0) {
      ++transfers;
      continue;
    }
    transfers += b != held;
    held = b;
  }
  return transfers;
}

}  // namespace colossal::core
