#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.hpp"
#include "grad_check.hpp"

using namespace colossal::core;

TEST(Philox, KnownAnswerVectors) {
  // Random123's published known-answer tests for philox4x32-10.
  auto r = philox4x32(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = philox4x32(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
}

TEST(Rng, ShardsDrawTheSameValuesAsTheWholeTensor) {
  if (!colossal::test::host_memory()) GTEST_SKIP();
  const std::size_t n = 1000;
  const uint64_t stream = hash_name("transformer.h.0.mlp.c_fc.weight");
  std::vector<float> whole(n), parts(n);
  fill_normal(whole.data(), n, 0.02f, 1234, stream);
  // Any split into ranges, as a sharded layout would draw it.
  for (std::size_t begin : {0u, 137u, 500u, 999u}) {
    const std::size_t end = begin == 0 ? 137 : begin == 137 ? 500 : begin == 500 ? 999 : 1000;
    fill_normal(parts.data() + begin, end - begin, 0.02f, 1234, stream, begin);
  }
  EXPECT_EQ(whole, parts);
}

TEST(Rng, SeedAndNameSelectIndependentStreamsWithNormalStatistics) {
  if (!colossal::test::host_memory()) GTEST_SKIP();
  const std::size_t n = 200000;
  std::vector<float> a(n), b(n), c(n);
  fill_normal(a.data(), n, 1.0f, 1, hash_name("x"));
  fill_normal(b.data(), n, 1.0f, 2, hash_name("x"));
  fill_normal(c.data(), n, 1.0f, 1, hash_name("y"));
  double mean = 0, var = 0, cross_ab = 0, cross_ac = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mean += a[i];
    var += double(a[i]) * a[i];
    cross_ab += double(a[i]) * b[i];
    cross_ac += double(a[i]) * c[i];
  }
  mean /= n;
  var = var / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.01);
  EXPECT_NEAR(cross_ab / n, 0.0, 0.01);
  EXPECT_NEAR(cross_ac / n, 0.0, 0.01);
}

TEST(Rng, RandomBelowIsInRangeAndCoversIt) {
  std::vector<int> counts(7, 0);
  for (uint64_t i = 0; i < 7000; ++i) {
    const uint64_t r = random_below(9, 3, i, 7);
    ASSERT_LT(r, 7u);
    ++counts[r];
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
}
