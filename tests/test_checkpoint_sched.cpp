// Activation-checkpoint solvers: the cost model by hand, the fixed patterns, and rotor's
// optimality against brute force over every valid schedule.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint_sched/solvers.hpp"

namespace cs = colossal::checkpoint_sched;
using cs::Keep;

namespace {

cs::ChainOp op(std::size_t x, std::size_t a, double f, double b) { return {x, a, f, b}; }

// Times are compared up to summation-order rounding.
bool same_time(double a, double b) { return std::abs(a - b) <= 1e-9 * (1.0 + std::abs(b)); }

cs::Chain random_chain(std::mt19937& rng, std::size_t n, std::size_t max_bytes) {
  std::uniform_int_distribution<std::size_t> bytes(1, max_bytes);
  std::uniform_real_distribution<double> time(0.1, 5.0);
  cs::Chain chain;
  for (std::size_t j = 0; j < n; ++j) {
    chain.ops.push_back(op(bytes(rng), bytes(rng), time(rng), time(rng)));
  }
  // Pipeline stages keep 1..3 copies of the stored activations and one arena.
  chain.stored_multiplier = 1 + int(n % 3);
  return chain;
}

// Every valid schedule (op 0 not `none`; `none` only after `input` or `none`).
template <class Visit>
void for_each_schedule(std::size_t n, Visit visit) {
  std::vector<Keep> keep(n);
  auto rec = [&](auto&& self, std::size_t j, bool open) -> void {
    if (j == n) {
      visit(keep);
      return;
    }
    keep[j] = Keep::all;
    self(self, j + 1, false);
    keep[j] = Keep::input;
    self(self, j + 1, true);
    if (open) {
      keep[j] = Keep::none;
      self(self, j + 1, true);
    }
  };
  rec(rec, 0, false);
}

struct Brute {
  std::size_t min_memory = std::numeric_limits<std::size_t>::max();
  double min_memory_time = 0;  // least time among minimum-memory schedules
};

Brute brute_min_memory(const cs::Chain& chain) {
  Brute r;
  for_each_schedule(chain.ops.size(), [&](const std::vector<Keep>& keep) {
    const cs::Cost c = cs::evaluate(chain, keep);
    if (c.memory < r.min_memory || (c.memory == r.min_memory && c.time < r.min_memory_time)) {
      r.min_memory = c.memory;
      r.min_memory_time = c.time;
    }
  });
  return r;
}

// Least time with memory <= budget, and the least memory among schedules of that time.
struct BruteBudget {
  double time = std::numeric_limits<double>::infinity();
  std::size_t memory = 0;
};

BruteBudget brute_budget(const cs::Chain& chain, std::size_t budget) {
  std::vector<cs::Cost> fit;
  BruteBudget r;
  for_each_schedule(chain.ops.size(), [&](const std::vector<Keep>& keep) {
    const cs::Cost c = cs::evaluate(chain, keep);
    if (c.memory > budget) return;
    fit.push_back(c);
    r.time = std::min(r.time, c.time);
  });
  r.memory = std::numeric_limits<std::size_t>::max();
  for (const cs::Cost& c : fit) {
    if (same_time(c.time, r.time)) r.memory = std::min(r.memory, c.memory);
  }
  return r;
}

// A transformer chain: per block an attention op then an MLP op (fp32 activations).
cs::Chain transformer_chain(int layers, std::size_t B, std::size_t T, std::size_t C,
                            std::size_t H) {
  const std::size_t btc = B * T * C * 4;
  const double flop_rate = 1e14;  // seconds = flops / rate; only ratios matter here
  const double bt = double(B * T), c = double(C);
  const double f_att = (2.0 * bt * 4 * c * c + 4.0 * bt * double(T) * c) / flop_rate;
  const double f_mlp = (2.0 * bt * 8 * c * c) / flop_rate;
  cs::Chain chain;
  chain.ops_per_block = 2;
  for (int l = 0; l < layers; ++l) {
    chain.ops.push_back(op(btc, 8 * btc + B * H * T * 4 + 2 * B * T * 4, f_att, 2 * f_att));
    chain.ops.push_back(op(btc, 6 * btc + 2 * B * T * 4, f_mlp, 2 * f_mlp));
  }
  return chain;
}

}  // namespace

TEST(CheckpointSched, EvaluateByHand) {
  cs::Chain chain;
  chain.ops = {op(10, 20, 1.0, 2.0), op(5, 7, 3.0, 4.0), op(2, 9, 0.5, 1.0)};
  // Segment [0, 2) then op 2 kept: stored = x0 + (x2 + a2) = 10 + 11, arena = a0 + x1 + a1 = 32,
  // recompute = f0 + f1 = 4, time = (3 + 7 + 1.5) + 4.
  cs::Cost c = cs::evaluate(chain, {Keep::input, Keep::none, Keep::all});
  EXPECT_EQ(c.stored, 21u);
  EXPECT_EQ(c.arena, 32u);
  EXPECT_EQ(c.memory, 53u);
  EXPECT_DOUBLE_EQ(c.recompute_time, 4.0);
  EXPECT_DOUBLE_EQ(c.time, 15.5);
  // Op 0 kept, segment [1, 3): stored = 30 + 5, arena = a1 + x2 + a2 = 18, recompute = 3.5.
  c = cs::evaluate(chain, {Keep::all, Keep::input, Keep::none});
  EXPECT_EQ(c.stored, 35u);
  EXPECT_EQ(c.arena, 18u);
  EXPECT_EQ(c.memory, 53u);
  EXPECT_DOUBLE_EQ(c.recompute_time, 3.5);
  EXPECT_DOUBLE_EQ(c.time, 15.0);
  // Two one-op segments share the arena: max(a0, a2) = 20.
  c = cs::evaluate(chain, {Keep::input, Keep::all, Keep::input});
  EXPECT_EQ(c.stored, 10u + 12u + 2u);
  EXPECT_EQ(c.arena, 20u);
  EXPECT_DOUBLE_EQ(c.recompute_time, 1.5);
  // Three micro-batches in flight keep three copies of the stored part and one arena.
  chain.stored_multiplier = 3;
  c = cs::evaluate(chain, {Keep::input, Keep::all, Keep::input});
  EXPECT_EQ(c.stored, 3 * (10u + 12u + 2u));
  EXPECT_EQ(c.arena, 20u);
  EXPECT_EQ(c.memory, 3 * 24u + 20u);
  chain.stored_multiplier = 1;
}

TEST(CheckpointSched, EvaluateRejectsInvalidSchedules) {
  cs::Chain chain;
  chain.ops = {op(1, 1, 1, 1), op(1, 1, 1, 1), op(1, 1, 1, 1)};
  auto message = [&](const std::vector<Keep>& keep) {
    try {
      cs::evaluate(chain, keep);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_NE(message({Keep::none, Keep::all, Keep::all}).find("op 0"), std::string::npos);
  EXPECT_NE(message({Keep::all, Keep::none, Keep::all}).find("op 1"), std::string::npos);
  EXPECT_NE(message({Keep::input, Keep::all, Keep::none}).find("op 2"), std::string::npos);
  EXPECT_NE(message({Keep::all, Keep::all, static_cast<Keep>(7)}).find("op 2"),
            std::string::npos);
  EXPECT_NE(message({Keep::all, Keep::all}).find("2 entries"), std::string::npos);
  EXPECT_NO_THROW(cs::evaluate(chain, {Keep::input, Keep::none, Keep::none}));
}

TEST(CheckpointSched, FixedPolicies) {
  cs::Chain chain;
  chain.ops_per_block = 2;
  for (int l = 0; l < 5; ++l) {
    chain.ops.push_back(op(4, 30, 1.0, 2.0));
    chain.ops.push_back(op(4, 20, 2.0, 4.0));
  }
  const cs::Schedule none = cs::solve_none(chain);
  EXPECT_EQ(cs::describe(none.keep, 2), "AA|AA|AA|AA|AA");
  EXPECT_EQ(none.cost.memory, 5u * (34 + 24));
  EXPECT_EQ(none.cost.arena, 0u);
  EXPECT_DOUBLE_EQ(none.cost.time, 5 * 9.0);

  const cs::Schedule full = cs::solve_full(chain);
  EXPECT_EQ(cs::describe(full.keep, 2), "I.|I.|I.|I.|I.");
  EXPECT_EQ(full.cost.stored, 5u * 4);
  EXPECT_EQ(full.cost.arena, 30u + 24);
  EXPECT_DOUBLE_EQ(full.cost.recompute_time, 5 * 3.0);
  EXPECT_LT(full.cost.memory, none.cost.memory);

  const cs::Schedule k2 = cs::solve_every_k(chain, 2);
  EXPECT_EQ(cs::describe(k2.keep, 2), "I.|..|I.|..|I.");
  EXPECT_EQ(k2.cost.stored, 3u * 4);
  EXPECT_EQ(k2.cost.arena, 30u + 24 + 34 + 24);
  EXPECT_EQ(k2.cost.memory, k2.cost.stored + k2.cost.arena);

  for (int k : {5, 6, 100}) {
    const cs::Schedule one = cs::solve_every_k(chain, k);
    EXPECT_EQ(cs::describe(one.keep, 2), "I.|..|..|..|..") << k;
    EXPECT_EQ(one.cost.stored, 4u);
    EXPECT_EQ(one.cost.arena, 30u + 24 + 4 * 58);
  }
  EXPECT_EQ(cs::solve_every_k(chain, 1).keep, full.keep);
  EXPECT_THROW(cs::solve_every_k(chain, 0), std::invalid_argument);

  // 5 blocks: k = ceil(sqrt(5)) = 3; 4 blocks: k = 2; 9 blocks: k = 3.
  EXPECT_EQ(cs::describe(cs::solve_sqrt(chain).keep, 2), "I.|..|..|I.|..");
  cs::Chain four = chain;
  four.ops.resize(8);
  EXPECT_EQ(cs::describe(cs::solve_sqrt(four).keep, 2), "I.|..|I.|..");
  cs::Chain nine;
  nine.ops.assign(9, op(1, 1, 1, 1));
  EXPECT_EQ(cs::describe(cs::solve_sqrt(nine).keep, 3), "I..|I..|I..");

  // Dispatch.
  EXPECT_EQ(cs::solve("none", chain, 0, 0).keep, none.keep);
  EXPECT_EQ(cs::solve("full", chain, 0, 0).keep, full.keep);
  EXPECT_EQ(cs::solve("every_k", chain, 0, 2).keep, k2.keep);
  EXPECT_EQ(cs::solve("sqrt", chain, 0, 0).keep, cs::solve_sqrt(chain).keep);
  EXPECT_EQ(cs::solve("rotor", chain, none.cost.memory, 0).keep, none.keep);
  try {
    cs::solve("selective", chain, 0, 0);
    FAIL() << "unknown policy accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("none, full, every_k, sqrt, rotor"), std::string::npos);
  }
}

TEST(CheckpointSched, RejectsBadChains) {
  cs::Chain empty;
  EXPECT_THROW(cs::solve_none(empty), std::invalid_argument);
  cs::Chain odd;
  odd.ops_per_block = 2;
  odd.ops.assign(3, op(1, 1, 1, 1));
  EXPECT_THROW(cs::solve_full(odd), std::invalid_argument);
  cs::Chain negative;
  negative.ops = {op(1, 1, -1.0, 1.0)};
  EXPECT_THROW(cs::solve_rotor(negative, 10), std::invalid_argument);
  cs::Chain fine;
  fine.ops = {op(1, 1, 1, 1)};
  EXPECT_THROW(cs::solve_rotor(fine, 10, 0), std::invalid_argument);
  EXPECT_THROW(cs::describe({Keep::all}, 0), std::invalid_argument);
}

TEST(CheckpointSched, Describe) {
  EXPECT_EQ(cs::describe({Keep::input, Keep::none, Keep::none, Keep::none, Keep::all, Keep::all},
                         2),
            "I.|..|AA");
  EXPECT_EQ(cs::describe({Keep::all, Keep::input, Keep::none}, 1), "A|I|.");
  EXPECT_EQ(cs::describe({}, 2), "");
}

TEST(CheckpointSched, MinMemoryMatchesBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + trial % 10;
    const cs::Chain chain = random_chain(rng, n, 20);
    const Brute brute = brute_min_memory(chain);
    const cs::Schedule mm = cs::solve_min_memory(chain);
    ASSERT_EQ(mm.cost.memory, brute.min_memory) << "trial " << trial;
    ASSERT_TRUE(same_time(mm.cost.time, brute.min_memory_time)) << "trial " << trial;
  }
}

TEST(CheckpointSched, RotorIsOptimalWithExactUnits) {
  std::mt19937 rng(2019);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + trial % 10;
    const cs::Chain chain = random_chain(rng, n, 20);
    const std::size_t lo = cs::solve_min_memory(chain).cost.memory;
    const std::size_t hi = cs::solve_none(chain).cost.memory;
    const std::size_t budget = std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
    const BruteBudget brute = brute_budget(chain, budget);
    // memory_slots = budget: one unit is one byte, so the discretisation is exact.
    const cs::Schedule r = cs::solve_rotor(chain, budget, static_cast<int>(budget));
    ASSERT_TRUE(r.feasible) << "trial " << trial;
    ASSERT_LE(r.cost.memory, budget) << "trial " << trial;
    ASSERT_TRUE(same_time(r.cost.time, brute.time))
        << "trial " << trial << " n " << n << " budget " << budget << ": rotor " << r.cost.time
        << " brute " << brute.time << " " << cs::describe(r.keep, 1);
    // Ties go to less memory.
    ASSERT_EQ(r.cost.memory, brute.memory) << "trial " << trial << " " << cs::describe(r.keep, 1);
    ASSERT_EQ(r.cost.time, cs::evaluate(chain, r.keep).time);
  }
}

TEST(CheckpointSched, RotorWithCoarseUnitsStaysWithinBudget) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + trial % 10;
    const cs::Chain chain = random_chain(rng, n, 1000);
    const std::size_t lo = cs::solve_min_memory(chain).cost.memory;
    const std::size_t hi = cs::solve_none(chain).cost.memory;
    const std::size_t budget = std::uniform_int_distribution<std::size_t>(lo, hi)(rng);
    const BruteBudget brute = brute_budget(chain, budget);
    const cs::Schedule r = cs::solve_rotor(chain, budget, 50);
    ASSERT_TRUE(r.feasible) << "trial " << trial;  // the exact minimum fits, so it is the fallback
    ASSERT_LE(r.cost.memory, budget) << "trial " << trial;
    ASSERT_GE(r.cost.time, brute.time * (1 - 1e-12)) << "trial " << trial;
  }
}

TEST(CheckpointSched, BudgetBelowMinimumIsInfeasible) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const cs::Chain chain = random_chain(rng, 1 + trial % 10, 20);
    const cs::Schedule mm = cs::solve_min_memory(chain);
    ASSERT_GT(mm.cost.memory, 0u);
    for (int slots : {500, static_cast<int>(mm.cost.memory)}) {
      const cs::Schedule r = cs::solve_rotor(chain, mm.cost.memory - 1, slots);
      EXPECT_FALSE(r.feasible);
      EXPECT_EQ(r.keep, mm.keep);
      EXPECT_EQ(r.cost.memory, mm.cost.memory);
    }
    EXPECT_TRUE(cs::solve_rotor(chain, mm.cost.memory, static_cast<int>(mm.cost.memory)).feasible);
  }
  cs::Chain chain;
  chain.ops = {op(5, 5, 1, 1)};
  const cs::Schedule zero = cs::solve_rotor(chain, 0);
  EXPECT_FALSE(zero.feasible);
  EXPECT_EQ(zero.cost.memory, 10u);
}

TEST(CheckpointSched, RotorTimeFallsAsBudgetGrows) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    cs::Chain chain = random_chain(rng, 12, 20);
    chain.ops_per_block = 2;
    const std::size_t lo = cs::solve_min_memory(chain).cost.memory;
    const std::size_t hi = cs::solve_none(chain).cost.memory;
    double previous = std::numeric_limits<double>::infinity();
    for (std::size_t budget = lo; budget <= hi; ++budget) {
      const cs::Schedule r = cs::solve_rotor(chain, budget, static_cast<int>(budget));
      ASSERT_TRUE(r.feasible);
      ASSERT_LE(r.cost.memory, budget);
      ASSERT_LE(r.cost.time, previous * (1 + 1e-12)) << "trial " << trial << " budget " << budget;
      previous = r.cost.time;
    }
    EXPECT_TRUE(same_time(previous, cs::solve_none(chain).cost.time));
  }
}

TEST(CheckpointSched, OpZeroForwardTimesTieOnMemory) {
  // Free forwards: dropping them costs no time, so ties must go to the least memory.
  cs::Chain chain;
  chain.ops = {op(3, 10, 0.0, 1.0), op(3, 10, 0.0, 1.0), op(3, 10, 1.0, 1.0)};
  const std::size_t budget = cs::solve_none(chain).cost.memory;
  const cs::Schedule r = cs::solve_rotor(chain, budget, static_cast<int>(budget));
  const BruteBudget brute = brute_budget(chain, budget);
  EXPECT_TRUE(same_time(r.cost.time, brute.time));
  EXPECT_EQ(r.cost.memory, brute.memory);
  EXPECT_LT(r.cost.memory, budget);
}

// Solver times on real model shapes (printed; the bound only catches a pathological slowdown).
TEST(CheckpointSched, RotorSpeed) {
  struct Case {
    const char* name;
    cs::Chain chain;
  };
  const Case cases[] = {
      {"gpt2-124M (n=24, B=8 T=1024 C=768)", transformer_chain(12, 8, 1024, 768, 12)},
      {"OPT-175B (n=192, B=1 T=2048 C=12288)", transformer_chain(96, 1, 2048, 12288, 96)},
  };
  for (const Case& c : cases) {
    const cs::Schedule none = cs::solve_none(c.chain);
    const cs::Schedule sqrt = cs::solve_sqrt(c.chain);
    const std::size_t budget = none.cost.memory / 3;
    cs::Schedule r;
    const int reps = c.chain.ops.size() > 100 ? 5 : 50;
    // CPU time of this process (wall time swings on a shared machine), and wall time.
    const std::clock_t c0 = std::clock();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) r = cs::solve_rotor(c.chain, budget);
    const auto t1 = std::chrono::steady_clock::now();
    const std::clock_t c1 = std::clock();
    cs::Schedule mm;
    for (int i = 0; i < reps; ++i) mm = cs::solve_min_memory(c.chain);
    const std::clock_t c2 = std::clock();
    const double rotor_ms = 1e3 * double(c1 - c0) / CLOCKS_PER_SEC / reps;
    const double rotor_wall_ms =
        std::chrono::duration<double, std::milli>(t1 - t0).count() / reps;
    const double mm_ms = 1e3 * double(c2 - c1) / CLOCKS_PER_SEC / reps;
    std::printf("%s: rotor %.2f ms CPU (%.2f ms wall), min_memory %.2f ms CPU; budget %.2f GB; "
                "none %.2f GB %.4f s; sqrt %.2f GB %.4f s; rotor %.2f GB %.4f s; min %.2f GB\n"
                "  rotor %s\n",
                c.name, rotor_ms, rotor_wall_ms, mm_ms, budget / 1e9, none.cost.memory / 1e9,
                none.cost.time,
                sqrt.cost.memory / 1e9, sqrt.cost.time, r.cost.memory / 1e9, r.cost.time,
                mm.cost.memory / 1e9, cs::describe(r.keep, 2).c_str());
    EXPECT_TRUE(r.feasible);
    EXPECT_LE(r.cost.memory, budget);
    if (sqrt.cost.memory <= budget) {
      EXPECT_LE(r.cost.time, sqrt.cost.time * (1 + 1e-12));
    }
    EXPECT_LT(rotor_ms, 10000.0);
  }
}
