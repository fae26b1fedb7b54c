#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <thread>

#include "core/host_threads.hpp"
#include "core/optimizer.hpp"
#include "grad_check.hpp"

using namespace colossal::core;

TEST(LrSchedule, WarmupThenCosineToMinimum) {
  LrSchedule s{1.0e-3, 1.0e-4, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 1.0e-4);       // (0+1)/10 of max
  EXPECT_DOUBLE_EQ(s.at(4), 5.0e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0e-3);      // cosine starts at max
  EXPECT_NEAR(s.at(60), 5.5e-4, 1e-12);    // half way: (max+min)/2
  EXPECT_NEAR(s.at(35), 1e-4 + 0.5 * 9e-4 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 1.0e-4);
  EXPECT_DOUBLE_EQ(s.at(500), 1.0e-4);     // clamped past the end
}

TEST(Clip, CoefficientBringsNormToTheLimit) {
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0) * 4.0, 1.0, 1e-6);
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 0.0), 1.0);  // 0 disables clipping
}

TEST(AdamW, ThreeStepsMatchClosedFormWithDecayByRule) {
  if (!colossal::test::host_memory()) GTEST_SKIP();
  ParamSpec w{"layer.weight", {2, 2}, ParamRole::weight, 0, 4, 0, {}, {}};
  ParamSpec b{"layer.bias", {3}, ParamRole::bias, 16, 3, 0, {}, {}};
  MemoryTracker tracker;
  AdamW opt({w, b}, 19, tracker);
  std::vector<float> params(19, 0.0f), grads(19, 0.0f);
  for (int i = 0; i < 4; ++i) params[i] = 0.5f + i;
  for (int i = 16; i < 19; ++i) params[i] = -1.0f + i * 0.1f;
  const AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1};
  // Reference in double.
  std::vector<double> ref(params.begin(), params.end()), m(19, 0.0), v(19, 0.0);
  const float clip = 0.5f;
  for (int step = 1; step <= 3; ++step) {
    for (int i = 0; i < 19; ++i) grads[i] = 0.3f * float(i % 5) - 0.4f + 0.1f * step;
    opt.update(params.data(), grads.data(), hp, step, clip);
    for (int i : {0, 1, 2, 3, 16, 17, 18}) {
      const double g = double(grads[i]) * clip;
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.95 * v[i] + 0.05 * g * g;
      const double mh = m[i] / (1 - std::pow(0.9, step)), vh = v[i] / (1 - std::pow(0.95, step));
      const double wd = i < 4 ? 0.1 : 0.0;  // biases are not decayed
      ref[i] -= 1e-2 * (mh / (std::sqrt(vh) + 1e-8) + wd * ref[i]);
    }
  }
  for (int i : {0, 1, 2, 3, 16, 17, 18}) EXPECT_NEAR(params[i], ref[i], 1e-6) << i;
  for (int i = 4; i < 16; ++i) EXPECT_EQ(params[i], 0.0f) << "padding must stay untouched";
}

TEST(HostThreads, EveryElementExactlyOnceForRaggedSizes) {
  HostThreads pool(3);
  for (std::size_t n : {1u, 100u, 12288u, 12289u, 100003u}) {
    std::vector<int> hits(n, 0);
    std::vector<int> part_used(pool.size(), 0);
    pool.run(n, [&](std::size_t part, std::size_t begin, std::size_t end) {
      ++part_used[part];
      for (std::size_t i = begin; i < end; ++i) ++hits[i];
    });
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << n << " " << i;
    for (int used : part_used) EXPECT_LE(used, 1) << "each part runs once";
    EXPECT_EQ(part_used[0], 1);
  }
}

// OpenMP's team (the one oneDNN and BLIS multiply on) runs the same parts: every element once,
// a call from inside a part inline, and an exception thrown in a part rethrown to the caller.
TEST(HostThreads, OpenMpTeamRunsThePartsAndRethrows) {
  if (!HostThreads::openmp_available()) GTEST_SKIP() << "built without OpenMP";
  HostThreads pool(3);
  HostThreads::set_team(HostTeam::openmp);
  for (std::size_t n : {1u, 100u, 12288u, 12289u, 100003u}) {
    std::vector<int> hits(n, 0);
    std::vector<int> part_used(pool.size(), 0);
    pool.run(n, [&](std::size_t part, std::size_t begin, std::size_t end) {
      ASSERT_LT(part, std::size_t(pool.size()));
      ++part_used[part];
      for (std::size_t i = begin; i < end; ++i) ++hits[i];
      if (n >= 3 * 4096 && begin < end) {  // nested in a job spread over the team: inline
        std::size_t inner = 0;
        pool.run(end - begin, [&](std::size_t p, std::size_t b, std::size_t e) {
          EXPECT_EQ(p, 0u);
          inner += e - b;
        }, 1);
        EXPECT_EQ(inner, end - begin);
      }
    });
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << n << " " << i;
    for (int used : part_used) EXPECT_LE(used, 1) << "each part runs once";
    EXPECT_EQ(part_used[0], 1);
  }
  EXPECT_THROW(pool.run(1 << 16,
                        [&](std::size_t part, std::size_t, std::size_t) {
                          if (part == 1) throw std::runtime_error("part 1 failed");
                        }),
               std::runtime_error);
  HostThreads::set_team(HostTeam::own);
}

// The AdamW update is bitwise the same on either team (each element is updated alone).
TEST(AdamW, SameUpdateOnEitherTeam) {
  if (!colossal::test::host_memory() || !HostThreads::openmp_available()) GTEST_SKIP();
  const int previous = HostThreads::shared().size();
  HostThreads::resize_shared(2);
  std::vector<ParamSpec> table = {{"a.weight", {500, 100}, ParamRole::weight, 0, 50000, 0, {}, {}}};
  const auto p0 = colossal::test::random_vector(50000, 5);
  const auto g = colossal::test::random_vector(50000, 6);
  std::vector<float> results[2];
  for (const HostTeam team : {HostTeam::own, HostTeam::openmp}) {
    HostThreads::set_team(team);
    MemoryTracker tracker;
    AdamW opt(table, 50000, tracker);
    std::vector<float> p = p0;
    for (int step = 1; step <= 2; ++step) opt.update(p.data(), g.data(), AdamWParams{}, step, 0.5f);
    results[team == HostTeam::openmp] = p;
  }
  HostThreads::set_team(HostTeam::own);
  HostThreads::resize_shared(previous);
  ASSERT_EQ(results[0], results[1]);
  EXPECT_NE(results[0], p0);
}

TEST(AdamW, ThreadedUpdateOfAWindowMatchesTheReference) {
  if (!colossal::test::host_memory()) GTEST_SKIP();
  // Three tensors, a window cutting through the first and last (a ZeRO shard), large enough
  // that every host thread takes part.
  std::vector<ParamSpec> table = {{"a.weight", {300, 100}, ParamRole::weight, 0, 30000, 0, {}, {}},
                                  {"a.bias", {100}, ParamRole::bias, 30000, 100, 0, {}, {}},
                                  {"b.weight", {400, 100}, ParamRole::weight, 30112, 40000, 0, {}, {}}};
  const std::size_t begin = 1000, end = 60000;
  MemoryTracker tracker;
  AdamW opt(table, begin, end, tracker);
  auto params = colossal::test::random_vector(end - begin, 1);
  auto grads = colossal::test::random_vector(end - begin, 2);
  std::vector<double> ref(params.begin(), params.end());
  const AdamWParams hp{1e-2, 0.9, 0.95, 1e-8, 0.1};
  opt.update(params.data(), grads.data(), hp, 1, 1.0f);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const std::size_t global = begin + i;
    const bool in_tensor = global < 30100 || global >= 30112;
    if (!in_tensor) {
      EXPECT_EQ(params[i], float(ref[i])) << "padding must stay untouched";
      continue;
    }
    const double g = grads[i], m = 0.1 * g, v = 0.05 * g * g;
    const double wd = (global >= 30000 && global < 30100) ? 0.0 : 0.1;
    ref[i] -= 1e-2 * ((m / 0.1) / (std::sqrt(v / 0.05) + 1e-8) + wd * ref[i]);
    ASSERT_NEAR(params[i], ref[i], 1e-6) << global;
  }
  EXPECT_NEAR(sum_of_squares(grads.data(), grads.size()),
              std::inner_product(grads.begin(), grads.end(), grads.begin(), 0.0), 1e-3);
  // Partial sums are combined in part order: the same bits every call.
  EXPECT_EQ(sum_of_squares(grads.data(), grads.size()), sum_of_squares(grads.data(), grads.size()));
}

TEST(HostThreads, ThreadsPerRankFromEnvironmentOrCores) {
  const char* saved_host = std::getenv("COLOSSAL_HOST_THREADS");
  const char* saved_blas = std::getenv("OPENBLAS_NUM_THREADS");
  const std::string host = saved_host ? saved_host : "", blas = saved_blas ? saved_blas : "";
  setenv("COLOSSAL_HOST_THREADS", "3", 1);
  ThreadPlan plan = set_threads_per_rank(4);
  EXPECT_EQ(plan.threads, 3);
  EXPECT_EQ(plan.source, "COLOSSAL_HOST_THREADS");
  EXPECT_EQ(HostThreads::shared().size(), 3);
  unsetenv("COLOSSAL_HOST_THREADS");
  unsetenv("OPENBLAS_NUM_THREADS");
  plan = set_threads_per_rank(1000);  // more ranks than cores: never below one thread
  EXPECT_EQ(plan.threads, plan.cores < int(std::thread::hardware_concurrency()) ? plan.cores : 1);
  EXPECT_EQ(HostThreads::shared().size(), plan.threads);
  if (saved_host) setenv("COLOSSAL_HOST_THREADS", host.c_str(), 1);
  if (saved_blas) setenv("OPENBLAS_NUM_THREADS", blas.c_str(), 1);
  set_threads_per_rank(1);
}

// ZeRO-2/3 run AdamW over this rank's slice of every unit, packed: the same update as the whole
// window on those elements, whether parameters are addressed packed or in the flat buffer.
TEST(AdamW, PiecesMatchTheWholeWindow) {
  if (!colossal::test::host_memory()) GTEST_SKIP();
  ParamSpec w{"a.weight", {4, 8}, ParamRole::weight, 0, 32, 0, {}, {}};
  ParamSpec b{"a.bias", {8}, ParamRole::bias, 32, 8, 0, {}, {}};
  ParamSpec n{"n.weight", {16}, ParamRole::layernorm_weight, 48, 16, 0, {}, {}};
  const std::vector<ParamSpec> table{w, b, n};
  const std::vector<std::pair<std::size_t, std::size_t>> pieces{{8, 24}, {30, 40}, {56, 64}};
  MemoryTracker tracker;
  AdamW whole(table, 64, tracker);
  AdamW packed(table, pieces, tracker);
  EXPECT_EQ(packed.size(), 34u);
  const auto p0 = colossal::test::random_vector(64, 3, 1.0f);
  std::vector<float> pw = p0, pf = p0;
  std::vector<float> packed_params, packed_grads;
  AdamWParams hp;
  hp.lr = 1e-2;
  for (int step = 1; step <= 3; ++step) {
    const auto g = colossal::test::random_vector(64, 10 + step, 1.0f);
    whole.update(pw.data(), g.data(), hp, step, 0.5f);
    packed_grads.clear();
    for (const auto& [lo, hi] : pieces) packed_grads.insert(packed_grads.end(), g.begin() + lo, g.begin() + hi);
    packed.update(pf.data(), packed_grads.data(), hp, step, 0.5f, AdamW::Indexing::flat,
                  AdamW::Indexing::state);
  }
  for (const auto& [lo, hi] : pieces) {
    for (std::size_t i = lo; i < hi; ++i) EXPECT_FLOAT_EQ(pf[i], pw[i]) << i;
  }
  EXPECT_EQ(pf[0], p0[0]) << "elements outside the pieces are not touched";
  EXPECT_EQ(pf[45], p0[45]) << "alignment padding is not touched";
}

// The offload share's arithmetic, shared by the executor, offload.policy: auto and the planner:
// the states offloaded (a multiple of 16 rounded up, at most all), 64ths to the key's fraction
// and back, and the bisection for the fewest chunks that fit.
TEST(OffloadShare, StatesChunksAndTheFewestThatFit) {
  EXPECT_EQ(offloaded_states(1000, 1.0), 1000u);
  EXPECT_EQ(offloaded_states(1000, 0.0), 0u);
  EXPECT_EQ(offloaded_states(1000, 0.5), 512u);   // 500 rounded up to 16
  EXPECT_EQ(offloaded_states(1000, 0.999), 1000u);  // 999 -> 1008, at most all
  EXPECT_EQ(offloaded_states(4096, 0.25), 1024u);
  EXPECT_EQ(offload_fraction(0), 1.0);
  EXPECT_EQ(offload_fraction(16), 0.25);
  for (int k = 1; k <= kOffloadChunks; ++k) EXPECT_EQ(offload_chunks(offload_fraction(k)), k);
  for (int threshold : {1, 2, 23, 63, 64}) {
    int calls = 0;
    const int got = fewest_offload_chunks([&](int k) {
      ++calls;
      return k >= threshold;
    });
    EXPECT_EQ(got, threshold);
    EXPECT_LE(calls, 6) << "a bisection of 64";
  }
}
