// Activation-checkpoint solvers over a chain of ops: pure functions of per-op sizes and times.
//
// Cost model (the executor in core::Model allocates exactly this way). A chain of n >= 1 ops;
// op j has x_j = input_bytes (the boundary activation entering it), a_j = saved_bytes (its
// internal activations needed by its backward, its input excluded), f_j = forward_time and
// b_j = backward_time. A schedule gives each op a Keep:
//   all    x_j and a_j kept from the first forward;
//   input  only x_j kept; op j starts a recomputed segment;
//   none   nothing kept; continues the segment begun by the nearest earlier `input` op.
// A segment is a maximal run [s, e) with keep[s] == input and keep[s+1..e) == none.
//   stored         = k * (sum_{all j} (x_j + a_j) + sum_{input j} x_j), k = stored_multiplier
//   arena([s, e))  = a_s + sum_{j=s+1}^{e-1} (x_j + a_j)
//   arena          = max over segments of arena(segment)   (0 without segments; one arena is
//                    shared because segments are recomputed one at a time in backward)
//   memory         = stored + arena
//   recompute_time = sum over ops inside segments of f_j
//   time           = sum_j (f_j + b_j) + recompute_time
// The schedule space is single-level: every dropped op is recomputed once, into the one arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/checkpoint_policy.hpp"
#include "core/keep.hpp"

namespace colossal::checkpoint_sched {

// The schedule's vocabulary is core's (the model executes it): names kept here for the solvers.
using core::Keep;
using core::keep_blocks;
using core::kOpsPerBlock;

struct ChainOp {
  std::size_t input_bytes = 0;  // x_j
  std::size_t saved_bytes = 0;  // a_j
  double forward_time = 0.0;    // f_j
  double backward_time = 0.0;   // b_j
};

struct Chain {
  std::vector<ChainOp> ops;
  // Consecutive ops that make one transformer block (e.g. 2: attention, then MLP); ops.size() is
  // a multiple of it.
  int ops_per_block = 1;
  // Copies of the kept activations (a pipeline stage keeps one per micro-batch in flight); the
  // arena is one: memory = stored_multiplier * stored + arena, and Cost::stored includes it.
  int stored_multiplier = 1;
};

struct Cost {
  std::size_t stored = 0;
  std::size_t arena = 0;
  std::size_t memory = 0;  // stored + arena
  double time = 0.0;       // sum (f + b) + recompute_time
  double recompute_time = 0.0;
};

struct Schedule {
  std::vector<Keep> keep;
  Cost cost;
  // False only from rotor when the budget is below the minimum memory of any schedule; `keep` is
  // then the minimum-memory schedule.
  bool feasible = true;
};

// The cost of `keep` on `chain`. Throws std::invalid_argument naming the op index when the schedule
// is invalid (op 0 `none`, a `none` after an `all`, an unknown Keep value) or its length differs
// from the chain's.
Cost evaluate(const Chain& chain, const std::vector<Keep>& keep);

// Every op `all`: no recomputation, the most memory.
Schedule solve_none(const Chain& chain);
// Only block inputs kept: a block's first op `input`, its other ops `none` (one-block segments).
Schedule solve_full(const Chain& chain);
// Segments of k blocks: the first op of blocks 0, k, 2k, ... `input`, every other op `none`.
// k >= number of blocks gives one segment; k < 1 throws std::invalid_argument.
Schedule solve_every_k(const Chain& chain, int k);
// Chen et al. 2016: every_k with k = ceil(sqrt(number of blocks)).
Schedule solve_sqrt(const Chain& chain);

// The exact minimum-memory schedule over all valid schedules (ties: least time).
Schedule solve_min_memory(const Chain& chain);

// The least-time schedule with memory <= budget_bytes over all valid schedules at op granularity
// (a dynamic program in the spirit of Herrmann et al. 2019, "Optimal checkpointing for
// heterogeneous chains"). Memory is discretised into units of ceil(budget / memory_slots) bytes and
// every size is rounded up, so the result never exceeds the budget; with a unit of 1 byte
// (memory_slots >= budget) it is exact. Ties: less memory. When no schedule fits, returns the
// minimum-memory schedule with feasible = false. Time O(caps * n * memory_slots) with
// caps <= memory_slots + 1 candidate arena sizes; memory O(n * memory_slots).
Schedule solve_rotor(const Chain& chain, std::size_t budget_bytes, int memory_slots = 500);

// Dispatch on policy none | full | every_k | sqrt | rotor. budget_bytes is used by rotor only and
// every_k by every_k only; the fixed policies ignore the budget (compare cost.memory). selective
// and manual have no solver here (the planner builds them) -> std::invalid_argument listing the
// policies that do.
Schedule solve(core::CheckpointPolicy policy, const Chain& chain, std::size_t budget_bytes,
               int every_k, int memory_slots = 500);
// The same by name (tests, tools); any other name throws the same std::invalid_argument.
Schedule solve(std::string_view policy, const Chain& chain, std::size_t budget_bytes,
               int every_k, int memory_slots = 500);

// A compact string: per op "A" (all kept), "I" (input kept, segment recomputed) or "." (dropped),
// blocks of ops_per_block ops separated by '|', e.g. "I.|..|AA".
std::string describe(const std::vector<Keep>& keep, int ops_per_block);

}  // namespace colossal::checkpoint_sched
