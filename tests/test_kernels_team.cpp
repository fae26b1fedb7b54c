// The team (device) kernels of core/kernels_team.hpp, core/llama_kernels_team.hpp,
// core/grid_kernels_team.hpp, core/attention_team.hpp and core/adamw_team.hpp, run on the host's
// execution space, against the host kernels of core/kernels.hpp / core/llama_kernels.hpp /
// core/tensor2d.hpp / core/layers.hpp / core/optimizer.hpp on random inputs of odd sizes, and their
// backward passes against finite differences. COLOSSAL_TEAM_SIZE sets the team size (default:
// Kokkos::AUTO; the Serial backend runs teams of one, an OpenMP build of Kokkos several threads,
// which exercises the barriers). Each test prints its largest difference from the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/adamw_team.hpp"
#include "core/attention_team.hpp"
#include "core/decode_kernels.hpp"
#include "core/gemm.hpp"
#include "core/grid_kernels_team.hpp"
#include "core/kernels.hpp"
#include "core/kernels_team.hpp"
#include "core/layers.hpp"
#include "core/llama_kernels.hpp"
#include "core/llama_kernels_team.hpp"
#include "core/memory.hpp"
#include "core/model_spec.hpp"
#include "core/optimizer.hpp"
#include "core/tensor2d.hpp"
#include "core/tensor_group.hpp"
#include "device_arrays.hpp"
#include "grad_check.hpp"

using namespace colossal;
using namespace colossal::core;
using colossal::test::check_gradient;
using colossal::test::dot;
using colossal::test::random_vector;

namespace {

using TeamExec = Kokkos::DefaultHostExecutionSpace;  // Serial here; OpenMP in a threaded Kokkos
using RefExec = Kokkos::Serial;                      // the host kernels as the model runs them

int team_size() {
  const char* env = std::getenv("COLOSSAL_TEAM_SIZE");
  return env != nullptr ? std::atoi(env) : 0;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  return worst;
}

// |a - b| <= atol + rtol |b| element by element; reports the first few misses.
void expect_close(const char* what, const std::vector<float>& a, const std::vector<float>& b,
                  double atol, double rtol = 0.0) {
  ASSERT_EQ(a.size(), b.size());
  int bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(double(a[i]) - b[i]) <= atol + rtol * std::abs(double(b[i])))) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  std::printf("  %-28s max |team - reference| = %.3g over %zu values\n", what,
              max_abs_diff(a, b), a.size());
}

class TeamKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::host_memory()) GTEST_SKIP() << "these tests pass host pointers";
    std::printf("  team size %d (0: Kokkos::AUTO) on %s\n", team_size(), TeamExec::name());
  }
};

}  // namespace

TEST_F(TeamKernels, LayernormForwardMatchesHost) {
  for (int C : {37, 768}) {
    const int N = 13;
    auto x = random_vector(N * C, 1, 3.0f), w = random_vector(C, 2), b = random_vector(C, 3);
    for (auto& v : x) v += 0.7f;  // a non-zero mean
    std::vector<float> out(N * C), mean(N), rstd(N), ref(N * C), ref_mean(N), ref_rstd(N);
    kernels::layernorm_forward<RefExec>(ref.data(), ref_mean.data(), ref_rstd.data(), x.data(),
                                        w.data(), b.data(), N, C, 1e-5f);
    team::layernorm_forward<TeamExec>(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                      b.data(), N, C, 1e-5f, team_size());
    Kokkos::fence();
    SCOPED_TRACE("C " + std::to_string(C));
    expect_close("layernorm out", out, ref, 1e-5, 1e-5);
    expect_close("layernorm mean", mean, ref_mean, 1e-6, 1e-5);
    expect_close("layernorm rstd", rstd, ref_rstd, 1e-6, 1e-5);
  }
}

// The residual prefill in the layernorm's pass (ResidualCopy: the residual add fused with the
// layernorm): the same normalised rows and statistics, bitwise, plus copy = x + bias exactly (or
// x without a bias), on the host kernel and the team one, in fp32 and bf16 output.
TEST_F(TeamKernels, LayernormWritesTheResidualPrefillInItsPass) {
  const int N = 9, C = 67;
  auto x = random_vector(N * C, 31, 3.0f), w = random_vector(C, 32), b = random_vector(C, 33);
  const auto bias = random_vector(C, 34);
  std::vector<float> plain(N * C), plain_mean(N), plain_rstd(N);
  kernels::layernorm_forward<RefExec>(plain.data(), plain_mean.data(), plain_rstd.data(),
                                      x.data(), w.data(), b.data(), N, C, 1e-5f);
  std::vector<float> with_bias(N * C), without(N * C);
  for (int i = 0; i < N * C; ++i) with_bias[i] = x[i] + bias[i % C];
  for (bool on_team : {false, true}) {
    for (bool has_bias : {true, false}) {
      SCOPED_TRACE(std::string(on_team ? "team" : "host") + (has_bias ? ", bias" : ", no bias"));
      std::vector<float> out(N * C), mean(N), rstd(N), copy(N * C, -1.0f);
      std::vector<std::uint16_t> out16(N * C), want16(N * C);
      const ResidualCopy prefill{copy.data(), has_bias ? bias.data() : nullptr};
      if (on_team) {
        team::layernorm_forward<TeamExec>(out.data(), mean.data(), rstd.data(), x.data(),
                                          w.data(), b.data(), N, C, 1e-5f, team_size(), prefill);
        Kokkos::fence();
        expect_close("team out", out, plain, 1e-5, 1e-5);  // the team's own sums
      } else {
        kernels::layernorm_forward<RefExec>(out.data(), mean.data(), rstd.data(), x.data(),
                                            w.data(), b.data(), N, C, 1e-5f, prefill);
        EXPECT_EQ(out, plain);
        EXPECT_EQ(mean, plain_mean);
        EXPECT_EQ(rstd, plain_rstd);
        kernels::layernorm_forward<RefExec, std::uint16_t>(out16.data(), mean.data(),
                                                           rstd.data(), x.data(), w.data(),
                                                           b.data(), N, C, 1e-5f, prefill);
        to_bf16_bits(plain.data(), want16.data(), plain.size());
        EXPECT_EQ(out16, want16);
      }
      EXPECT_EQ(copy, has_bias ? with_bias : x);
    }
  }
}

// Outputs saved in bf16 (train.precision: bf16): the team layernorm writing bf16 patterns gives
// exactly the patterns of its fp32 output; the softmax backward reading saved bf16 probabilities
// gives what it gives for those values widened to fp32; kernels::to_bf16 rounds as the GEMM
// backends' to_bf16_bits do.
TEST_F(TeamKernels, Bf16StorageIsTheRoundedFp32) {
  const int N = 11, C = 67;
  auto x = random_vector(N * C, 21, 3.0f), w = random_vector(C, 22), b = random_vector(C, 23);
  std::vector<float> out(N * C), mean(N), rstd(N);
  std::vector<std::uint16_t> out16(N * C), want16(N * C);
  team::layernorm_forward<TeamExec>(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                    b.data(), N, C, 1e-5f, team_size());
  team::layernorm_forward<TeamExec, std::uint16_t>(out16.data(), mean.data(), rstd.data(),
                                                   x.data(), w.data(), b.data(), N, C, 1e-5f,
                                                   team_size());
  Kokkos::fence();
  to_bf16_bits(out.data(), want16.data(), out.size());
  EXPECT_EQ(out16, want16);
  std::vector<std::uint16_t> bits(out.size());
  kernels::to_bf16<RefExec>(bits.data(), out.data(), int64_t(out.size()));
  EXPECT_EQ(bits, want16);
  // The way back (parallel.grad_reduce: bf16): widened exactly as from_bf16_bits, or added.
  std::vector<float> widened(out.size()), want_widened(out.size());
  from_bf16_bits(bits.data(), want_widened.data(), bits.size());
  kernels::from_bf16<RefExec>(widened.data(), bits.data(), int64_t(bits.size()), false);
  EXPECT_EQ(widened, want_widened);
  std::vector<float> summed = x;
  kernels::from_bf16<RefExec>(summed.data(), bits.data(), int64_t(bits.size()), true);
  for (std::size_t i = 0; i < summed.size(); ++i) ASSERT_EQ(summed[i], x[i] + want_widened[i]) << i;

  const int rows = 2 * 3 * 29, T = 29;
  auto att = random_vector(int64_t(rows) * T, 24, 4.0f);
  kernels::causal_softmax_forward<RefExec>(att.data(), rows, T);
  std::vector<std::uint16_t> att16(att.size());
  to_bf16_bits(att.data(), att16.data(), att.size());
  std::vector<float> att_rounded(att.size());
  from_bf16_bits(att16.data(), att_rounded.data(), att.size());
  auto d16 = random_vector(int64_t(rows) * T, 25), d32 = d16;
  team::causal_softmax_backward<TeamExec, std::uint16_t>(d16.data(), att16.data(), rows, T, T, 0,
                                                         0.3f, team_size());
  team::causal_softmax_backward<TeamExec>(d32.data(), att_rounded.data(), rows, T, T, 0, 0.3f,
                                          team_size());
  Kokkos::fence();
  // The same arithmetic on the same values; only the compiler's contraction into fused
  // multiply-adds may differ between the two instantiations.
  expect_close("softmax backward from bf16", d16, d32, 1e-7, 1e-6);
}

TEST_F(TeamKernels, LayernormBackwardMatchesHostAndFiniteDifferences) {
  // Two column chunks (one ragged), rows not a multiple of 16; 600 rows: two slabs of rows
  // (team::column_slabs), added by the second kernel.
  for (const int N : {70, 600}) {
    SCOPED_TRACE("N " + std::to_string(N));
    const int C = 37;
    auto x = random_vector(N * C, 1, 2.0f), w = random_vector(C, 2), g = random_vector(N * C, 3);
    std::vector<float> out(N * C), mean(N), rstd(N);
    kernels::layernorm_forward<RefExec>(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                        w.data(), N, C, 1e-5f);
    // Everything accumulates: start from non-zero values.
    auto dx = random_vector(N * C, 4), dw = random_vector(C, 5), db = random_vector(C, 6);
    auto rdx = dx, rdw = dw, rdb = db;
    kernels::layernorm_backward<RefExec>(rdx.data(), rdw.data(), rdb.data(), g.data(), x.data(),
                                         w.data(), mean.data(), rstd.data(), N, C);
    team::layernorm_backward<TeamExec>(dx.data(), dw.data(), db.data(), g.data(), x.data(),
                                       w.data(), mean.data(), rstd.data(), N, C, team_size());
    Kokkos::fence();
    expect_close("layernorm dinp", dx, rdx, 1e-5, 1e-5);
    expect_close("layernorm dweight", dw, rdw, 1e-4, 1e-5);
    expect_close("layernorm dbias", db, rdb, 1e-4, 1e-5);
  }
  const int N = 4, C = 9;
  auto x = random_vector(N * C, 1, 2.0f), w = random_vector(C, 2), b = random_vector(C, 3);
  auto g = random_vector(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto f = [&] {
    team::layernorm_forward<TeamExec>(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                      b.data(), N, C, 1e-5f, team_size());
    Kokkos::fence();
    return dot(out, g);
  };
  f();
  std::vector<float> dx(N * C, 0.5f), dw(C, 0.0f), db(C, 0.0f);
  team::layernorm_backward<TeamExec>(dx.data(), dw.data(), db.data(), g.data(), x.data(),
                                     w.data(), mean.data(), rstd.data(), N, C, team_size());
  Kokkos::fence();
  for (auto& v : dx) v -= 0.5f;
  EXPECT_EQ(check_gradient("dx", f, x, dx), 0);
  EXPECT_EQ(check_gradient("dw", f, w, dw), 0);
  EXPECT_EQ(check_gradient("db", f, b, db), 0);
}

// N = 1000: three slabs of rows (team::column_slabs), the last one shorter.
TEST_F(TeamKernels, BiasBackwardMatchesHostAndDoubleSums) {
  EXPECT_EQ(team::column_slabs(70, 2), 1);
  EXPECT_EQ(team::column_slabs(1000, 2), 3);
  EXPECT_EQ(team::column_slabs(16384, 24), 10);  // gpt2's d_model 768 at B*T = 16384
  for (int N : {70, 1000}) {
    const int M = 37, ld = 40;
    auto d = random_vector(N * ld, 9);
    std::vector<float> db(M, 1.0f), ref(M, 1.0f), exact(M);
    kernels::bias_backward<RefExec>(ref.data(), d.data(), N, M, ld);
    team::bias_backward<TeamExec>(db.data(), d.data(), N, M, ld, team_size());
    Kokkos::fence();
    for (int j = 0; j < M; ++j) {
      double s = 1.0;
      for (int n = 0; n < N; ++n) s += d[n * ld + j];
      exact[j] = float(s);
    }
    SCOPED_TRACE("N " + std::to_string(N));
    expect_close("bias dbias vs host", db, ref, 1e-4);
    expect_close("bias dbias vs double", db, exact, 1e-4);
    // The order of additions is the shapes', not the team's: teams of one thread give the same
    // bits as this run's (several threads under scripts/check_team_kernels.sh).
    std::vector<float> one(M, 1.0f);
    team::bias_backward<TeamExec>(one.data(), d.data(), N, M, ld, 1);
    Kokkos::fence();
    EXPECT_EQ(one, db);
  }
}

// RMSNorm: rows of a non-zero mean (which RMSNorm, unlike layernorm, keeps), C below and above
// a team's width, the bf16 output exactly the rounded fp32 one.
TEST_F(TeamKernels, RmsnormForwardMatchesHost) {
  for (int C : {37, 768}) {
    const int N = 13;
    auto x = random_vector(N * C, 41, 3.0f), w = random_vector(C, 42);
    for (auto& v : x) v += 0.7f;
    std::vector<float> out(N * C), rstd(N), ref(N * C), ref_rstd(N);
    kernels::rmsnorm_forward<RefExec>(ref.data(), ref_rstd.data(), x.data(), w.data(), N, C,
                                      1e-5f);
    team::rmsnorm_forward<TeamExec>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f,
                                    team_size());
    std::vector<std::uint16_t> out16(N * C), want16(N * C);
    std::vector<float> rstd16(N);
    team::rmsnorm_forward<TeamExec, std::uint16_t>(out16.data(), rstd16.data(), x.data(),
                                                   w.data(), N, C, 1e-5f, team_size());
    Kokkos::fence();
    SCOPED_TRACE("C " + std::to_string(C));
    expect_close("rmsnorm out", out, ref, 1e-5, 1e-5);
    expect_close("rmsnorm rstd", rstd, ref_rstd, 1e-6, 1e-5);
    to_bf16_bits(out.data(), want16.data(), out.size());
    EXPECT_EQ(out16, want16);
    EXPECT_EQ(rstd16, rstd);
  }
}

TEST_F(TeamKernels, RmsnormBackwardMatchesHostAndFiniteDifferences) {
  for (int N : {70, 1000}) {  // rows not a multiple of 16; many rows per row group
    const int C = 37;         // two column chunks, one ragged
    auto x = random_vector(N * C, 43, 2.0f), w = random_vector(C, 44);
    auto g = random_vector(N * C, 45);
    std::vector<float> out(N * C), rstd(N);
    kernels::rmsnorm_forward<RefExec>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    // Both gradients accumulate: start from non-zero values.
    auto dx = random_vector(N * C, 46), dw = random_vector(C, 47);
    auto rdx = dx, rdw = dw;
    kernels::rmsnorm_backward<RefExec>(rdx.data(), rdw.data(), g.data(), x.data(), w.data(),
                                       rstd.data(), N, C);
    team::rmsnorm_backward<TeamExec>(dx.data(), dw.data(), g.data(), x.data(), w.data(),
                                     rstd.data(), N, C, team_size());
    Kokkos::fence();
    SCOPED_TRACE("N " + std::to_string(N));
    expect_close("rmsnorm dinp", dx, rdx, 1e-5, 1e-5);
    expect_close("rmsnorm dweight", dw, rdw, 1e-4, 1e-5);
  }
  const int N = 4, C = 9;
  auto x = random_vector(N * C, 48, 2.0f), w = random_vector(C, 49), g = random_vector(N * C, 50);
  std::vector<float> out(N * C), rstd(N);
  auto f = [&] {
    team::rmsnorm_forward<TeamExec>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f,
                                    team_size());
    Kokkos::fence();
    return dot(out, g);
  };
  f();
  std::vector<float> dx(N * C, 0.5f), dw(C, 0.0f);
  team::rmsnorm_backward<TeamExec>(dx.data(), dw.data(), g.data(), x.data(), w.data(),
                                   rstd.data(), N, C, team_size());
  Kokkos::fence();
  for (auto& v : dx) v -= 0.5f;
  EXPECT_EQ(check_gradient("dx", f, x, dx), 0);
  EXPECT_EQ(check_gradient("dw", f, w, dw), 0);
}

// RoPE per pair: a column block inside wider rows (the columns around it a sentinel that must
// stay), positions from an offset, both directions; the round trip gives the input back.
TEST_F(TeamKernels, RopeMatchesHost) {
  const int B = 3, Tl = 7, heads = 3, hs = 10, col0 = 5, ld = col0 + heads * hs + 4, pos0 = 11;
  std::vector<float> cos_table((pos0 + Tl) * hs / 2), sin_table(cos_table.size());
  kernels::rope_table(cos_table.data(), sin_table.data(), pos0 + Tl, hs, 10000.0);
  auto x = random_vector(B * Tl * ld, 51, 2.0f);
  for (bool inverse : {false, true}) {
    auto got = x, ref = x;
    kernels::rope_rotate<RefExec>(ref.data(), B, Tl, ld, col0, heads, hs, pos0, cos_table.data(),
                                  sin_table.data(), inverse);
    team::rope_rotate<TeamExec>(got.data(), B, Tl, ld, col0, heads, hs, pos0, cos_table.data(),
                                sin_table.data(), inverse);
    Kokkos::fence();
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    expect_close("rope", got, ref, 1e-6, 1e-6);
    for (int r = 0; r < B * Tl; ++r) {
      for (int c = 0; c < ld; ++c) {
        if (c < col0 || c >= col0 + heads * hs) {
          ASSERT_EQ(got[r * ld + c], x[r * ld + c]);
        }
      }
    }
    if (inverse) break;
    team::rope_rotate<TeamExec>(got.data(), B, Tl, ld, col0, heads, hs, pos0, cos_table.data(),
                                sin_table.data(), true);
    Kokkos::fence();
    expect_close("rope round trip", got, x, 1e-5);
  }
}

// Incremental decoding's attention (core/decode_kernels.hpp): new rows at positions p0.. over a
// cache of p0 + n keys, with grouped key/value heads and a q row stride wider than the heads,
// more keys than one team tile (kDecodeKeyTile), against a softmax in double; the host form too.
std::vector<float> cached_attention_reference(const std::vector<float>& q, int ldq,
                                              const std::vector<float>& k,
                                              const std::vector<float>& v, int n, int p0, int H,
                                              int KV, int hs) {
  std::vector<float> out(std::size_t(n) * H * hs);
  const int kvw = KV * hs;
  for (int r = 0; r < n; ++r) {
    for (int h = 0; h < H; ++h) {
      const int g = h / (H / KV);
      std::vector<double> w(std::size_t(p0 + r + 1));
      double mx = -1e300, total = 0.0;
      for (int j = 0; j <= p0 + r; ++j) {
        double dot = 0.0;
        for (int d = 0; d < hs; ++d) {
          dot += double(q[r * ldq + h * hs + d]) * k[j * kvw + g * hs + d];
        }
        w[j] = dot / std::sqrt(double(hs));
        mx = std::max(mx, w[j]);
      }
      for (double& x : w) total += (x = std::exp(x - mx));
      for (int d = 0; d < hs; ++d) {
        double acc = 0.0;
        for (int j = 0; j <= p0 + r; ++j) acc += w[j] * v[j * kvw + g * hs + d];
        out[(r * H + h) * hs + d] = float(acc / total);
      }
    }
  }
  return out;
}

TEST_F(TeamKernels, CachedAttentionMatchesHostAndDoubleSoftmax) {
  const int H = 6, KV = 2, hs = 10, ldq = (H + 2 * KV) * hs + 3, window = 640;
  const auto k = random_vector(std::size_t(window) * KV * hs, 91, 2.0f);
  const auto v = random_vector(std::size_t(window) * KV * hs, 92);
  for (auto [n, p0] : {std::pair{1, 0}, std::pair{1, 300}, std::pair{5, 520}, std::pair{7, 0}}) {
    SCOPED_TRACE("n " + std::to_string(n) + ", p0 " + std::to_string(p0));
    const auto q = random_vector(std::size_t(n) * ldq, 93 + p0, 2.0f);
    const auto want = cached_attention_reference(q, ldq, k, v, n, p0, H, KV, hs);
    std::vector<float> host(want.size()), got(want.size());
    kernels::cached_attention<RefExec>(host.data(), q.data(), ldq, k.data(), v.data(), n, p0, H,
                                       KV, hs);
    team::cached_attention<TeamExec>(got.data(), q.data(), ldq, k.data(), v.data(), n, p0, H, KV,
                                     hs, team_size());
    Kokkos::fence();
    expect_close("cached attention (host)", host, want, 1e-5, 1e-5);
    expect_close("cached attention (team)", got, want, 1e-5, 1e-5);
  }
  // The append: each row's keys and values into its position, nothing else written.
  const int n = 3, p0 = 4, ld = ldq, kvw = KV * hs;
  const auto src = random_vector(std::size_t(n) * ld, 94);
  std::vector<float> ck(std::size_t(window) * kvw, -1.0f), cv = ck;
  kernels::kv_append<RefExec>(ck.data(), cv.data(), src.data(), n, ld, H * hs, (H + KV) * hs,
                              kvw, p0);
  for (int pos = 0; pos < window; ++pos) {
    for (int c = 0; c < kvw; ++c) {
      const bool row = pos >= p0 && pos < p0 + n;
      ASSERT_EQ(ck[pos * kvw + c], row ? src[(pos - p0) * ld + H * hs + c] : -1.0f);
      ASSERT_EQ(cv[pos * kvw + c], row ? src[(pos - p0) * ld + (H + KV) * hs + c] : -1.0f);
    }
  }
}

// SwiGLU per element: gate and up as column blocks of padded rows (the padding must stay).
TEST_F(TeamKernels, SwigluMatchesHost) {
  const int64_t N = 13;
  const int F = 37, ld = 2 * F + 3;
  auto in = random_vector(N * ld, 52, 4.0f), dout = random_vector(N * F, 53);
  std::vector<float> out(N * F, 9.0f), ref = out;
  kernels::swiglu_forward<RefExec>(ref.data(), in.data(), in.data() + F, ld, N, F);
  team::swiglu_forward<TeamExec>(out.data(), in.data(), in.data() + F, ld, N, F);
  std::vector<float> din(N * ld, 9.0f), rdin = din;
  kernels::swiglu_backward<RefExec>(rdin.data(), rdin.data() + F, dout.data(), in.data(),
                                    in.data() + F, ld, N, F);
  team::swiglu_backward<TeamExec>(din.data(), din.data() + F, dout.data(), in.data(),
                                  in.data() + F, ld, N, F);
  Kokkos::fence();
  expect_close("swiglu out", out, ref, 1e-6, 1e-6);
  expect_close("swiglu dgate, dup", din, rdin, 1e-6, 1e-6);
  for (int64_t n = 0; n < N; ++n) {
    for (int c = 2 * F; c < ld; ++c) ASSERT_EQ(din[n * ld + c], 9.0f);
  }
}

// GQA's expand and reduce per element, bitwise the host's (copies, and each group added in head
// order): groups of 3, of 1 (multi-head) and of all heads (multi-query).
TEST_F(TeamKernels, GqaExpandAndReduceMatchHostBitwise) {
  const int64_t N = 13;
  const int H = 6, hs = 10, C = H * hs;
  for (int KV : {2, 6, 1}) {
    const int row = (H + 2 * KV) * hs;
    auto in = random_vector(N * row, 54), din = random_vector(N * 3 * C, 55);
    std::vector<float> qkv(N * 3 * C, 9.0f), ref = qkv;
    kernels::gqa_expand<RefExec>(ref.data(), in.data(), N, H, KV, hs);
    team::gqa_expand<TeamExec>(qkv.data(), in.data(), N, H, KV, hs);
    std::vector<float> dgqa(N * row, 9.0f), rdgqa = dgqa;
    kernels::gqa_reduce<RefExec>(rdgqa.data(), din.data(), N, H, KV, hs);
    team::gqa_reduce<TeamExec>(dgqa.data(), din.data(), N, H, KV, hs);
    Kokkos::fence();
    SCOPED_TRACE("KV " + std::to_string(KV));
    EXPECT_EQ(qkv, ref);
    EXPECT_EQ(dgqa, rdgqa);
  }
}

TEST_F(TeamKernels, CausalSoftmaxMatchesHostSquareAndRing) {
  struct Case {
    int rows, Tq, Tk, q_offset;
  };
  // Square attention (Tq = Tk, every query), and a ring rank's rows (5 queries from 10 on).
  for (Case c : {Case{2 * 3 * 37, 37, 37, 0}, Case{2 * 5, 5, 20, 10}}) {
    SCOPED_TRACE("Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk));
    auto att = random_vector(int64_t(c.rows) * c.Tk, 12, 4.0f), ref = att;
    kernels::causal_softmax_forward<RefExec>(ref.data(), c.rows, c.Tq, c.Tk, c.q_offset);
    team::causal_softmax_forward<TeamExec>(att.data(), c.rows, c.Tq, c.Tk, c.q_offset,
                                           team_size());
    Kokkos::fence();
    expect_close("softmax forward", att, ref, 1e-6, 1e-5);
    auto datt = random_vector(int64_t(c.rows) * c.Tk, 13), rdatt = datt;
    kernels::causal_softmax_backward<RefExec>(rdatt.data(), ref.data(), c.rows, c.Tq, c.Tk,
                                              c.q_offset, 0.3f);
    team::causal_softmax_backward<TeamExec>(datt.data(), ref.data(), c.rows, c.Tq, c.Tk,
                                            c.q_offset, 0.3f, team_size());
    Kokkos::fence();
    expect_close("softmax backward", datt, rdatt, 1e-6, 1e-5);
  }
}

TEST_F(TeamKernels, CrossEntropyMatchesHostAtGpt2Vocabulary) {
  for (int V : {1031, 50257}) {
    const int N = V > 10000 ? 6 : 23;
    SCOPED_TRACE("V " + std::to_string(V));
    auto logits = random_vector(int64_t(N) * V, 17, 6.0f);
    std::vector<int32_t> targets(N);
    for (int n = 0; n < N; ++n) targets[n] = (n * 7919 + 3) % V;
    targets[0] = V - 1;
    for (float scale : {0.0f, 0.25f}) {
      auto l = logits, ref = logits;
      std::vector<float> loss(N), ref_loss(N);
      kernels::cross_entropy_forward_backward<RefExec>(ref.data(), ref_loss.data(),
                                                       targets.data(), N, V, V, scale);
      team::cross_entropy_forward_backward<TeamExec>(l.data(), loss.data(), targets.data(), N, V,
                                                     V, scale, team_size());
      Kokkos::fence();
      expect_close("cross-entropy loss", loss, ref_loss, 2e-5, 1e-5);
      expect_close(scale == 0 ? "cross-entropy logits kept" : "cross-entropy gradient", l, ref,
                   1e-8, 1e-5);
    }
  }
  // Rows of a padded stride: the same values as compact rows, the padding untouched.
  {
    const int N = 5, V = 1031, ld = 1088;
    auto compact = random_vector(int64_t(N) * V, 23, 6.0f);
    std::vector<float> strided(std::size_t(N) * ld, -2.0f);
    for (int n = 0; n < N; ++n) {
      std::copy_n(compact.begin() + int64_t(n) * V, V, strided.begin() + int64_t(n) * ld);
    }
    std::vector<int32_t> targets = {0, 1030, 517, 3, 1029};
    std::vector<float> loss(N), strided_loss(N);
    team::cross_entropy_forward_backward<TeamExec>(compact.data(), loss.data(), targets.data(), N,
                                                   V, V, 0.25f, team_size());
    team::cross_entropy_forward_backward<TeamExec>(strided.data(), strided_loss.data(),
                                                   targets.data(), N, V, ld, 0.25f, team_size());
    Kokkos::fence();
    EXPECT_EQ(strided_loss, loss);
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < ld; ++j) {
        const float want = j < V ? compact[std::size_t(n) * V + j] : -2.0f;
        ASSERT_EQ(strided[std::size_t(n) * ld + j], want) << "row " << n << " column " << j;
      }
    }
  }
  // Finite differences of sum(loss) * scale (the gradient is that of scale * loss per row).
  const int N = 3, V = 11;
  auto logits = random_vector(N * V, 5, 2.0f);
  std::vector<int32_t> targets = {4, 0, 10};
  auto f = [&] {
    auto l = logits;
    std::vector<float> loss(N);
    team::cross_entropy_forward_backward<TeamExec>(l.data(), loss.data(), targets.data(), N, V,
                                                   V, 0.0f, team_size());
    Kokkos::fence();
    double s = 0;
    for (float v : loss) s += 0.5 * v;
    return s;
  };
  auto grad = logits;
  std::vector<float> loss(N);
  team::cross_entropy_forward_backward<TeamExec>(grad.data(), loss.data(), targets.data(), N, V,
                                                 V, 0.5f, team_size());
  Kokkos::fence();
  EXPECT_EQ(check_gradient("dlogits", f, logits, grad, 1, 1e-3), 0);
}

TEST_F(TeamKernels, VocabParallelPiecesMatchHost) {
  const int N = 9, ld = 1040, valid = 1031;
  const int64_t v0 = 2000;
  auto logits = random_vector(int64_t(N) * ld, 23, 5.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = int32_t(v0 + (n % 3 == 0 ? -5 : n * 113));  // some away
  std::vector<float> mx(N), rmx(N), sums(2 * N), rsums(2 * N), loss(N), rloss(N);
  kernels::vocab_parallel_row_max<RefExec>(rmx.data(), logits.data(), N, ld, valid);
  team::vocab_parallel_row_max<TeamExec>(mx.data(), logits.data(), N, ld, valid, team_size());
  Kokkos::fence();
  EXPECT_EQ(mx, rmx);
  kernels::vocab_parallel_sums<RefExec>(rsums.data(), logits.data(), rmx.data(), targets.data(),
                                        N, ld, valid, v0);
  team::vocab_parallel_sums<TeamExec>(sums.data(), logits.data(), rmx.data(), targets.data(), N,
                                      ld, valid, v0, team_size());
  Kokkos::fence();
  expect_close("vp sums", sums, rsums, 1e-4, 1e-5);
  auto l = logits, rl = logits;
  kernels::vocab_parallel_finish<RefExec>(rl.data(), rloss.data(), rmx.data(), rsums.data(),
                                          targets.data(), N, ld, valid, v0, 0.5f);
  team::vocab_parallel_finish<TeamExec>(l.data(), loss.data(), rmx.data(), rsums.data(),
                                        targets.data(), N, ld, valid, v0, 0.5f, team_size());
  Kokkos::fence();
  EXPECT_EQ(loss, rloss);
  EXPECT_EQ(l, rl);  // the same expression element by element
}

TEST_F(TeamKernels, EmbeddingsMatchHostBitwiseAndFiniteDifferences) {
  const int B = 3, T = 7, C = 37, V = 11, P = 12, offset = 2;
  std::vector<int32_t> tokens(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 5 + i / 4) % V;  // repeats, some rows unused
  auto wte = random_vector(V * C, 1), wpe = random_vector(P * C, 2);
  auto dout = random_vector(B * T * C, 3);
  for (int64_t v0 : {int64_t(0), int64_t(4)}) {  // whole vocabulary; a shard of rows [4, 9)
    const int64_t rows = v0 == 0 ? V : 5;
    SCOPED_TRACE("v0 " + std::to_string(v0));
    std::vector<float> out(B * T * C), ref(B * T * C);
    kernels::embedding_forward<RefExec>(ref.data(), tokens.data(), wte.data() + v0 * C,
                                        v0 == 0 ? wpe.data() : nullptr, B, T, C, offset, v0,
                                        rows);
    team::embedding_forward<TeamExec>(out.data(), tokens.data(), wte.data() + v0 * C,
                                      v0 == 0 ? wpe.data() : nullptr, B, T, C, offset, v0, rows);
    Kokkos::fence();
    EXPECT_EQ(out, ref);
    auto dwte = random_vector(rows * C, 4), dwpe = random_vector(P * C, 5);
    auto rdwte = dwte, rdwpe = dwpe;
    kernels::embedding_backward<RefExec>(rdwte.data(), rdwpe.data(), dout.data(), tokens.data(),
                                         B, T, C, offset, v0, rows);
    team::embedding_backward<TeamExec>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T,
                                       C, offset, v0, rows, team_size());
    Kokkos::fence();
    // Every row receives its positions in the host's order: bitwise the same.
    EXPECT_EQ(dwte, rdwte);
    EXPECT_EQ(dwpe, rdwpe);
    std::printf("  embedding backward: bitwise equal to the host (%zu + %zu values)\n",
                dwte.size(), dwpe.size());
  }
  {  // many repeats of few tokens (a byte-level corpus): long runs inside the sort's bins
    const int B2 = 8, T2 = 512, V2 = 5, C2 = 33;
    std::vector<int32_t> many(B2 * T2);
    for (int i = 0; i < B2 * T2; ++i) many[i] = (i * 7 + i / 13) % V2;
    auto d2 = random_vector(int64_t(B2) * T2 * C2, 6);
    auto got = random_vector(V2 * C2, 7), want = got;
    kernels::embedding_backward<RefExec>(want.data(), nullptr, d2.data(), many.data(), B2, T2, C2,
                                         0);
    team::embedding_backward<TeamExec>(got.data(), nullptr, d2.data(), many.data(), B2, T2, C2, 0,
                                       0, INT64_MAX, team_size());
    Kokkos::fence();
    EXPECT_EQ(got, want);
    // The workspace grew to the largest batch and stays (a smaller batch reuses it).
    using Workspace = team::detail::EmbeddingWorkspace<TeamExec::memory_space>;
    EXPECT_EQ(Workspace::at_least(0).capacity, int64_t(B2) * T2);
  }
  {  // a vocabulary past the 2^16 buckets: rows r and r + 2^16 share one, sorted apart
    const int B3 = 2, T3 = 40, C3 = 9;
    const int64_t V3 = 70000;
    std::vector<int32_t> wide(B3 * T3);
    // Rows 0-6 and 1000-2006, and rows 65536-65542 in the buckets of rows 0-6.
    for (int i = 0; i < B3 * T3; ++i) {
      wide[i] = int32_t(i % 5 == 0 ? 65536 + i % 7 : i % 7 + (i % 3) * 1000);
    }
    auto d3 = random_vector(int64_t(B3) * T3 * C3, 8);
    auto got = random_vector(V3 * C3, 9), want = got;
    kernels::embedding_backward<RefExec>(want.data(), nullptr, d3.data(), wide.data(), B3, T3, C3,
                                         0, 0, V3);
    team::embedding_backward<TeamExec>(got.data(), nullptr, d3.data(), wide.data(), B3, T3, C3, 0,
                                       0, V3, team_size());
    Kokkos::fence();
    EXPECT_EQ(got, want);
  }
  std::vector<float> out(B * T * C);
  auto f = [&] {
    team::embedding_forward<TeamExec>(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C,
                                      offset);
    Kokkos::fence();
    return dot(out, dout);
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(P * C, 0.0f);
  team::embedding_backward<TeamExec>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T,
                                     C, offset, 0, INT64_MAX, team_size());
  Kokkos::fence();
  EXPECT_EQ(check_gradient("dwte", f, wte, dwte, 3), 0);
  EXPECT_EQ(check_gradient("dwpe", f, wpe, dwpe, 3), 0);
}

// One team sorting k[0, n) (a functor: nvcc refuses a device lambda in a test's private body).
struct SortOneTeam {
  int64_t* k;
  int n;
  void operator()(const team::Member<TeamExec>& team) const { team::detail::team_sort(team, k, n); }
};

// The embedding backward's in-team sort (the host's scatter happens to come out in order, so
// the kernel test alone would not notice a broken sort): shuffled keys of every length up to a
// few powers of two, duplicates included, against std::sort.
TEST_F(TeamKernels, TeamSortOrdersAnyLength) {
  std::mt19937_64 rng(11);
  for (int n : {0, 1, 2, 3, 5, 8, 13, 31, 32, 33, 100, 257, 1000, 4097}) {
    std::vector<int64_t> keys(n);
    for (int i = 0; i < n; ++i) keys[i] = int64_t(rng() % 5000) * 100000 + i;
    if (n > 4) keys[n / 2] = keys[1];  // a repeated key
    std::vector<int64_t> want = keys;
    std::sort(want.begin(), want.end());
    Kokkos::parallel_for("test_team_sort", team::policy<TeamExec>(1, team_size()),
                         SortOneTeam{keys.data(), n});
    Kokkos::fence();
    EXPECT_EQ(keys, want) << "n " << n;
  }
}

TEST_F(TeamKernels, RowCopiesMatchHost) {
  const int64_t N = 13;
  const int M = 37, ld = 41;
  auto bias = random_vector(M, 1), src = random_vector(N * ld, 2), res = random_vector(N * M, 3);
  std::vector<float> a(N * ld, 9.0f), ra = a;
  kernels::broadcast_rows<RefExec>(ra.data(), bias.data(), N, M, ld);
  team::broadcast_rows<TeamExec>(a.data(), bias.data(), N, M, ld);
  std::vector<float> b(N * M), rb(N * M);
  kernels::residual_plus_bias<RefExec>(rb.data(), res.data(), bias.data(), N, M);
  team::residual_plus_bias<TeamExec>(b.data(), res.data(), bias.data(), N, M);
  std::vector<float> c(N * M, 3.0f), rc = c;
  kernels::copy_columns<RefExec>(rc.data(), M, src.data(), ld, N, M - 4);
  team::copy_columns<TeamExec>(c.data(), M, src.data(), ld, N, M - 4);
  Kokkos::fence();
  EXPECT_EQ(a, ra);
  EXPECT_EQ(b, rb);
  EXPECT_EQ(c, rc);
}

// ---------------------------------------------------------------------------------------------
// The grid modes' kernels (core/grid_kernels_team.hpp).

namespace {

// One rank: the split layernorm's host form over all of a row's columns (its all-reduces are
// then the identity).
class OneRankGroup final : public TensorGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, std::size_t) override {}
  void all_reduce_max(float*, std::size_t) override {}
  void all_gather(const float* in, std::size_t n, float* out) override {
    std::copy(in, in + n, out);
  }
  void reduce_scatter(const float* in, std::size_t n, float* out) override {
    std::copy(in, in + n, out);
  }
  void broadcast(float*, std::size_t, int) override {}
  void send_recv(const float* send, std::size_t n, int, float* recv, int) override {
    std::copy(send, send + n, recv);
  }
};

// Columns [k c, (k + 1) c) of the r x (q c) matrix a: rank k's block.
std::vector<float> column_block(const std::vector<float>& a, int64_t r, int c, int q, int k) {
  std::vector<float> block(r * c);
  for (int64_t n = 0; n < r; ++n) {
    std::copy_n(a.begin() + n * q * c + k * c, c, block.begin() + n * c);
  }
  return block;
}

void put_column_block(std::vector<float>& a, const std::vector<float>& block, int64_t r, int c,
                      int q, int k) {
  for (int64_t n = 0; n < r; ++n) {
    std::copy_n(block.begin() + n * c, c, a.begin() + n * q * c + k * c);
  }
}

// The all-reduce over q simulated ranks: every rank's buffer becomes the sum in rank order.
void sum_over_ranks(std::vector<std::vector<float>>& bufs) {
  std::vector<float> total(bufs[0].size(), 0.0f);
  for (const auto& b : bufs) {
    for (std::size_t i = 0; i < b.size(); ++i) total[i] += b[i];
  }
  for (auto& b : bufs) b = total;
}

// The embedding blocks' host forms as core/model2d.cpp and core/model3d.cpp write them (one
// loop for both: element (tok, s) of the token block at tok * rs + s * cs).
void host_grid_embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t rs,
                                 int64_t cs, const float* wpe, int64_t BT, int T, int64_t c,
                                 int64_t v0, int64_t vb, int64_t offset, int64_t p0, int64_t pb) {
  for (int64_t n = 0; n < BT; ++n) {
    const int64_t tok = int64_t(tokens[n]) - v0, p = int64_t(n % T) + offset - p0;
    for (int64_t s = 0; s < c; ++s) {
      float v = 0.0f;
      if (tok >= 0 && tok < vb) v += wte[tok * rs + s * cs];
      if (p >= 0 && p < pb) v += wpe[p * c + s];
      out[n * c + s] = v;
    }
  }
}

void host_grid_embedding_backward(float* dwte, int64_t rs, int64_t cs, float* dwpe,
                                  const float* d, const int32_t* tokens, int64_t BT, int T,
                                  int64_t c, int64_t v0, int64_t vb, int64_t offset, int64_t p0,
                                  int64_t pb) {
  for (int64_t s = 0; s < c; ++s) {
    for (int64_t n = 0; n < BT; ++n) {
      const int64_t tok = int64_t(tokens[n]) - v0, p = int64_t(n % T) + offset - p0;
      if (tok >= 0 && tok < vb) dwte[tok * rs + s * cs] += d[n * c + s];
      if (p >= 0 && p < pb) dwpe[p * c + s] += d[n * c + s];
    }
  }
}

}  // namespace

// The split layernorm's team passes on q simulated ranks (each holding a block of c columns,
// the row sums added across the ranks between the passes where the host form all-reduces them)
// against the host form on one rank holding every column: the same values within float rounding.
TEST_F(TeamKernels, SplitLayernormMatchesHostAcrossColumnBlocks) {
  OneRankGroup one;
  const int64_t r = 13;
  for (int cols : {111, 768}) {
    for (int q : {1, 3}) {
      SCOPED_TRACE("cols " + std::to_string(cols) + ", q " + std::to_string(q));
      const int c = cols / q;
      const float inv_cols = 1.0f / float(cols), eps = 1e-5f;
      auto x = random_vector(r * cols, 21, 3.0f), w = random_vector(cols, 22),
           b = random_vector(cols, 23), g = random_vector(r * cols, 24);
      for (int64_t n = 0; n < r; ++n) x[n * cols] += 4.0f;  // a mean away from zero
      std::vector<float> out(r * cols), mean(r), rstd(r), work(2 * r);
      layernorm_split_forward(one, out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                              b.data(), r, cols, cols, eps, work.data());
      std::vector<std::vector<float>> xs, sums(q, std::vector<float>(r)), means(q), rstds(q);
      for (int k = 0; k < q; ++k) xs.push_back(column_block(x, r, c, q, k));
      for (int k = 0; k < q; ++k) {
        team::layernorm_split_row_sums<TeamExec>(sums[k].data(), xs[k].data(), r, c, team_size());
      }
      Kokkos::fence();
      sum_over_ranks(sums);
      for (int k = 0; k < q; ++k) {
        means[k].assign(r, -1.0f);
        team::layernorm_split_row_squares<TeamExec>(sums[k].data(), means[k].data(),
                                                    xs[k].data(), r, c, inv_cols, team_size());
      }
      Kokkos::fence();
      sum_over_ranks(sums);
      std::vector<float> team_out(r * cols);
      for (int k = 0; k < q; ++k) {
        std::vector<float> o(r * c), wk(w.begin() + k * c, w.begin() + (k + 1) * c),
            bk(b.begin() + k * c, b.begin() + (k + 1) * c);
        rstds[k].assign(r, -1.0f);
        team::layernorm_split_normalize<TeamExec>(o.data(), rstds[k].data(), xs[k].data(),
                                                  means[k].data(), sums[k].data(), wk.data(),
                                                  bk.data(), r, c, inv_cols, eps, team_size());
        Kokkos::fence();
        put_column_block(team_out, o, r, c, q, k);
        EXPECT_EQ(means[k], means[0]);  // every rank the same statistics
        EXPECT_EQ(rstds[k], rstds[0]);
      }
      expect_close("split layernorm mean", means[0], mean, 1e-6, 1e-5);
      expect_close("split layernorm rstd", rstds[0], rstd, 1e-6, 1e-5);
      expect_close("split layernorm out", team_out, out, 1e-5, 1e-5);

      // Backward from the host's saved statistics: dx accumulates, as do the parameter
      // gradients (each rank its block of columns).
      std::vector<float> dx(r * cols, 0.5f), dw(cols, 0.25f), db(cols, -0.125f);
      auto team_dx = dx, team_dw = dw, team_db = db;
      layernorm_split_backward(one, dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(),
                               mean.data(), rstd.data(), r, cols, cols, work.data());
      std::vector<std::vector<float>> bsums(q, std::vector<float>(2 * r));
      std::vector<std::vector<float>> gs;
      for (int k = 0; k < q; ++k) {
        gs.push_back(column_block(g, r, c, q, k));
        team::layernorm_split_backward_sums<TeamExec>(bsums[k].data(), gs[k].data(),
                                                      xs[k].data(), w.data() + k * c,
                                                      mean.data(), rstd.data(), r, c,
                                                      team_size());
      }
      Kokkos::fence();
      sum_over_ranks(bsums);
      for (int k = 0; k < q; ++k) {
        auto dxk = column_block(team_dx, r, c, q, k);
        team::layernorm_split_backward_finish<TeamExec>(
            dxk.data(), team_dw.data() + k * c, team_db.data() + k * c, bsums[k].data(),
            gs[k].data(), xs[k].data(), w.data() + k * c, mean.data(), rstd.data(), r, c,
            inv_cols, team_size());
        Kokkos::fence();
        put_column_block(team_dx, dxk, r, c, q, k);
      }
      expect_close("split layernorm dx", team_dx, dx, 1e-5, 1e-5);
      expect_close("split layernorm dweight", team_dw, dw, 1e-5, 1e-5);
      expect_close("split layernorm dbias", team_db, db, 1e-5, 1e-5);
    }
  }
}

// The embedding blocks of 2D (token block vb x c, row-major) and 3D (c x vb, transposed) on
// every rank of a split of the vocabulary and position rows (the last blocks padded past the
// tables' ends), against the host forms of core/model2d.cpp and core/model3d.cpp: bitwise, since
// every element adds in the host's order.
TEST_F(TeamKernels, GridEmbeddingBlocksMatchHostBitwise) {
  const int B = 3, T = 7, V = 13, P = 10, offset = 2;
  const int64_t BT = int64_t(B) * T;
  std::vector<int32_t> tokens(BT);
  for (int64_t i = 0; i < BT; ++i) tokens[i] = int32_t((i * 5 + i / 4) % V);  // repeats
  for (int c : {6, 37}) {
    for (int blocks : {1, 3}) {
      const int64_t vb = (V + blocks - 1) / blocks, pb = (P + blocks - 1) / blocks;
      auto d = random_vector(BT * c, 31);
      for (int k = 0; k < blocks; ++k) {
        const int64_t v0 = k * vb, p0 = k * pb;
        auto wte = random_vector(vb * c, 32 + k), wpe = random_vector(pb * c, 35 + k);
        for (bool transposed : {false, true}) {
          SCOPED_TRACE("c " + std::to_string(c) + ", block " + std::to_string(k) + " of " +
                       std::to_string(blocks) + (transposed ? ", 3D layout" : ", 2D layout"));
          const int64_t rs = transposed ? 1 : c, cs = transposed ? vb : 1;
          std::vector<float> out(BT * c, 7.0f), want(BT * c);
          host_grid_embedding_forward(want.data(), tokens.data(), wte.data(), rs, cs, wpe.data(),
                                      BT, T, c, v0, vb, offset, p0, pb);
          team::grid_embedding_forward<TeamExec>(out.data(), tokens.data(), wte.data(), rs, cs,
                                                 wpe.data(), BT, T, c, v0, vb, offset, p0, pb);
          auto dwte = random_vector(vb * c, 38), dwpe = random_vector(pb * c, 39);
          auto want_dwte = dwte, want_dwpe = dwpe;
          host_grid_embedding_backward(want_dwte.data(), rs, cs, want_dwpe.data(), d.data(),
                                       tokens.data(), BT, T, c, v0, vb, offset, p0, pb);
          team::embedding_backward_tokens<TeamExec>(dwte.data(), rs, cs, d.data(), tokens.data(),
                                                    int(BT), c, v0, vb, team_size());
          team::grid_position_backward<TeamExec>(dwpe.data(), d.data(), B, T, c, offset, p0, pb);
          Kokkos::fence();
          EXPECT_EQ(out, want);
          EXPECT_EQ(dwte, want_dwte);
          EXPECT_EQ(dwpe, want_dwpe);
        }
      }
    }
  }
  std::printf("  grid embedding blocks: bitwise equal to the host forms\n");
}

// AdamW over a small parameter table (decayed matrices, undecayed biases, padding between
// tensors), both indexings, a ZeRO-style pair of pieces: bitwise the host optimizer's update.
TEST_F(TeamKernels, FusedAdamWMatchesOptimizerBitwise) {
  std::vector<ParamSpec> table;
  auto add = [&](const char* name, ParamRole role, std::size_t offset, std::size_t count) {
    ParamSpec p;
    p.name = name;
    p.role = role;
    p.offset = offset;
    p.count = count;
    p.shape = {int64_t(count)};
    table.push_back(p);
  };
  add("w0", ParamRole::weight, 0, 10000);  // several blocks
  add("b0", ParamRole::bias, 10000, 37);
  add("ln", ParamRole::layernorm_weight, 10048, 70);
  add("wte", ParamRole::token_embedding, 10128, 4099);
  const std::size_t flat = 14240;
  MemoryTracker tracker;
  AdamWParams hp;
  hp.lr = 1e-3;
  hp.weight_decay = 0.1;
  const std::vector<std::pair<std::size_t, std::size_t>> pieces = {{5, 10040}, {10100, 14240}};
  for (bool flat_index : {false, true}) {
    SCOPED_TRACE(flat_index ? "flat indexing" : "state indexing");
    AdamW ref(table, pieces, tracker);
    std::size_t state = 0;
    for (const auto& [b, e] : pieces) state += e - b;
    std::vector<float> m(state, 0.0f), v(state, 0.0f);
    const std::size_t buf = flat_index ? flat : state;
    auto params = random_vector(buf, 31), grads = random_vector(buf, 32);
    auto ref_params = params;
    const auto blocks = team::adamw_blocks(table, pieces, flat_index, flat_index, 1000);
    team::AdamWBlockTable<TeamExec> device_blocks(blocks);
    const auto at = flat_index ? AdamW::Indexing::flat : AdamW::Indexing::state;
    // State indexing: buffers hold the window packed; flat: the whole flat buffer.
    const float* g = grads.data();
    float* rp = ref_params.data();
    float* tp = params.data();
    for (int64_t step = 1; step <= 3; ++step) {
      ref.update(rp, g, hp, step, 0.7f, at, at);
      team::adamw_update<TeamExec>(tp, g, m.data(), v.data(), device_blocks.data(),
                                   device_blocks.size(), team::adamw_scalars(hp, step, 0.7f),
                                   team_size());
      Kokkos::fence();
    }
    EXPECT_EQ(params, ref_params);
    EXPECT_EQ(m, std::vector<float>(ref.m(), ref.m() + ref.size()));
    EXPECT_EQ(v, std::vector<float>(ref.v(), ref.v() + ref.size()));
    std::printf("  adamw: max |team - optimizer| = %.3g (params), %zu blocks\n",
                max_abs_diff(params, ref_params), blocks.size());
  }
}

namespace {

// Dense double-precision reference of causal attention: y (B,T,C) and lse (B,H,T).
void naive_attention(const std::vector<float>& qkv, std::vector<double>& y,
                     std::vector<double>& lse, int B, int T, int C, int H) {
  const int hs = C / H;
  y.assign(std::size_t(B) * T * C, 0.0);
  lse.assign(std::size_t(B) * H * T, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < T; ++i) {
        std::vector<double> p(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int e = 0; e < hs; ++e) {
            s += double(qkv[(b * T + i) * 3 * C + h * hs + e]) *
                 qkv[(b * T + j) * 3 * C + C + h * hs + e];
          }
          p[j] = s / std::sqrt(double(hs));
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (double& v : p) sum += (v = std::exp(v - mx));
        lse[(b * H + h) * T + i] = mx + std::log(sum);
        for (int e = 0; e < hs; ++e) {
          double o = 0;
          for (int j = 0; j <= i; ++j) {
            o += p[j] / sum * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + e];
          }
          y[(b * T + i) * C + h * hs + e] = o;
        }
      }
    }
  }
}

void check_team_attention(int B, int T, int C, int H, int tile) {
  SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " C " + std::to_string(C) +
               " H " + std::to_string(H) + " tile " + std::to_string(tile));
  const team::AttentionShape shape{tile, team_size()};
  auto qkv = random_vector(B * T * 3 * C, 21, 2.0f), g = random_vector(B * T * C, 22);
  std::vector<double> ny, nlse;
  naive_attention(qkv, ny, nlse, B, T, C, H);
  std::vector<float> lse(B * H * T), y(B * T * C);
  team::attention_forward<TeamExec>(lse.data(), y.data(), qkv.data(), B, T, C, H, shape);
  Kokkos::fence();
  expect_close("attention y vs double", y, std::vector<float>(ny.begin(), ny.end()), 1e-5);
  expect_close("attention lse vs double", lse, std::vector<float>(nlse.begin(), nlse.end()), 1e-5);
  // The dense host path (probabilities saved) and the host fused path, both from GEMMs.
  auto gemm = make_host_gemm();
  std::vector<float> att(std::size_t(B) * H * T * T), dense_y(B * T * C),
      dense_dqkv(B * T * 3 * C), scratch(std::size_t(H) * T * T);
  attention_forward(*gemm, att.data(), dense_y.data(), qkv.data(), B, T, C, H);
  attention_backward(*gemm, dense_dqkv.data(), scratch.data(), g.data(), qkv.data(), att.data(),
                     B, T, C, H);
  const int host_tile = 8;
  std::vector<float> work(fused_attention_work_floats(host_tile)), host_lse(B * H * T),
      host_y(B * T * C), host_dqkv(B * T * 3 * C);
  fused_attention_forward(*gemm, host_lse.data(), host_y.data(), qkv.data(), work.data(), B, T, C,
                          H, host_tile);
  fused_attention_backward(*gemm, host_dqkv.data(), g.data(), host_y.data(), qkv.data(),
                           host_lse.data(), work.data(), B, T, C, H, host_tile);
  expect_close("attention y vs dense", y, dense_y, 1e-5);
  expect_close("attention lse vs host fused", lse, host_lse, 1e-5);
  std::vector<float> dqkv(B * T * 3 * C, 7.0f);  // assigned: the 7s must all go
  team::attention_backward<TeamExec>(dqkv.data(), g.data(), y.data(), qkv.data(), lse.data(), B,
                                     T, C, H, shape);
  Kokkos::fence();
  expect_close("attention dqkv vs dense", dqkv, dense_dqkv, 1e-4);
  expect_close("attention dqkv vs host fused", dqkv, host_dqkv, 1e-4);
}

}  // namespace

// Tiles of 4 and 5 over T = 9 and 37 (ragged last tiles, several key tiles per query tile, so the
// online softmax rescales), tile 16 at T = 9 (one block), and the automatic tile at a GPT-2 head
// size (hs = 64; T = 70, not a multiple of it).
TEST_F(TeamKernels, FusedAttentionMatchesDenseAndHostFused) {
  check_team_attention(2, 9, 12, 3, 4);
  check_team_attention(2, 9, 12, 3, 16);
  check_team_attention(1, 37, 10, 2, 5);
  check_team_attention(1, 70, 128, 2, 0);
}

TEST_F(TeamKernels, FusedAttentionBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 9, C = 12, H = 3;
  const team::AttentionShape shape{4, team_size()};
  auto qkv = random_vector(B * T * 3 * C, 21, 2.0f), g = random_vector(B * T * C, 22);
  std::vector<float> lse(B * H * T), y(B * T * C), dqkv(B * T * 3 * C);
  auto f = [&] {
    team::attention_forward<TeamExec>(lse.data(), y.data(), qkv.data(), B, T, C, H, shape);
    Kokkos::fence();
    return dot(y, g);
  };
  f();
  team::attention_backward<TeamExec>(dqkv.data(), g.data(), y.data(), qkv.data(), lse.data(), B,
                                     T, C, H, shape);
  Kokkos::fence();
  EXPECT_EQ(check_gradient("team dqkv", f, qkv, dqkv, 1, 1e-2, 1e-3), 0);
}

TEST(TeamAttention, TileFollowsScratchSize) {
  using Policy = Kokkos::TeamPolicy<TeamExec>;
  const auto launch = team::attention_launch<TeamExec>(team::AttentionKernel::forward, 64, 0);
  EXPECT_LE(launch.bytes, std::size_t(Policy::scratch_size_max(0)));
  EXPECT_EQ(launch.level, 0);
  EXPECT_GE(launch.tile, 8);
  // The next larger tile would not have fitted.
  if (launch.tile < 64) {
    EXPECT_GT(team::ScratchFloats<TeamExec>::shmem_size(team::attention_scratch_floats(
                  team::AttentionKernel::forward, 2 * launch.tile, 64)),
              std::size_t(Policy::scratch_size_max(0)));
  }
}

#if defined(KOKKOS_ENABLE_CUDA)
// On a GPU (a CUDA build of Kokkos, where a binary only starts with a GPU visible): every team
// kernel on Kokkos::Cuda over device buffers, with the team sizes Kokkos chooses there, against
// the host kernels on the same inputs.
using colossal::test::Dev;
using colossal::test::to_device;
using colossal::test::to_host;

TEST(DeviceTeamKernels, RowAndColumnKernelsMatchHost) {
  const int N = 640, C = 768;  // the column reductions in two slabs of rows (team::column_slabs)
  auto x = random_vector(N * C, 1, 3.0f), w = random_vector(C, 2), b = random_vector(C, 3);
  auto g = random_vector(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  kernels::layernorm_forward<RefExec>(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                      b.data(), N, C, 1e-5f);
  auto dx = to_device(x), dw = to_device(w), dbv = to_device(b), dout = to_device(out),
       dmean = to_device(mean), drstd = to_device(rstd), dg = to_device(g);
  team::layernorm_forward<Dev>(dout.data(), dmean.data(), drstd.data(), dx.data(), dw.data(),
                               dbv.data(), N, C, 1e-5f);
  expect_close("gpu layernorm out", to_host(dout), out, 1e-5, 1e-5);
  std::vector<float> dinp(N * C, 0.5f), dweight(C, 0.25f), dbias(C, 0.0f);
  auto ddinp = to_device(dinp), ddweight = to_device(dweight), ddbias = to_device(dbias);
  kernels::layernorm_backward<RefExec>(dinp.data(), dweight.data(), dbias.data(), g.data(),
                                       x.data(), w.data(), mean.data(), rstd.data(), N, C);
  team::layernorm_backward<Dev>(ddinp.data(), ddweight.data(), ddbias.data(), dg.data(), dx.data(),
                                dw.data(), dmean.data(), drstd.data(), N, C);
  expect_close("gpu layernorm dinp", to_host(ddinp), dinp, 1e-5, 1e-5);
  expect_close("gpu layernorm dweight", to_host(ddweight), dweight, 1e-4, 1e-5);
  expect_close("gpu layernorm dbias", to_host(ddbias), dbias, 1e-4, 1e-5);

  const int rows = 4 * 37, T = 37;
  auto att = random_vector(rows * T, 5, 4.0f), ref_att = att;
  kernels::causal_softmax_forward<RefExec>(ref_att.data(), rows, T, T, 0);
  auto datt = to_device(att);
  team::causal_softmax_forward<Dev>(datt.data(), rows, T, T, 0);
  expect_close("gpu softmax forward", to_host(datt), ref_att, 1e-6, 1e-5);

  // GPT-2's vocabulary in rows of the model's aligned stride (ActivationSizes::logits_ld), the
  // padding a sentinel that neither side may touch.
  const int V = 50257, ldV = 50304, rowsV = 8;
  auto logits = random_vector(int64_t(rowsV) * ldV, 6, 6.0f);
  for (int n = 0; n < rowsV; ++n) {
    std::fill(logits.begin() + int64_t(n) * ldV + V, logits.begin() + int64_t(n + 1) * ldV, 7.5f);
  }
  auto ref_logits = logits;
  std::vector<int32_t> targets(rowsV);
  for (int n = 0; n < rowsV; ++n) targets[n] = (n * 7919 + 3) % V;
  std::vector<float> loss(rowsV);
  kernels::cross_entropy_forward_backward<RefExec>(ref_logits.data(), loss.data(), targets.data(),
                                                   rowsV, V, ldV, 0.125f);
  auto dlogits = to_device(logits);
  auto dtargets = to_device(targets);
  auto dloss = to_device(std::vector<float>(rowsV));
  team::cross_entropy_forward_backward<Dev>(dlogits.data(), dloss.data(), dtargets.data(), rowsV,
                                            V, ldV, 0.125f);
  EXPECT_EQ(ref_logits[int64_t(rowsV) * ldV - 1], 7.5f);
  expect_close("gpu cross-entropy loss", to_host(dloss), loss, 5e-5, 1e-5);
  expect_close("gpu cross-entropy grad", to_host(dlogits), ref_logits, 1e-8, 1e-5);

  std::vector<float> bias_grad(C, 1.0f);
  auto dbias_grad = to_device(bias_grad);
  kernels::bias_backward<RefExec>(bias_grad.data(), g.data(), N, C, C);
  team::bias_backward<Dev>(dbias_grad.data(), dg.data(), N, C, C);
  expect_close("gpu bias_backward", to_host(dbias_grad), bias_grad, 1e-4, 1e-5);

  const int Bt = 4, Tt = 64, Vt = 97;
  std::vector<int32_t> tokens(Bt * Tt);
  for (int i = 0; i < Bt * Tt; ++i) tokens[i] = (i * 13 + i / 7) % Vt;
  auto demb = random_vector(Bt * Tt * C, 7);
  std::vector<float> dwte(Vt * C, 0.0f), dwpe(Tt * C, 0.0f);
  auto ddwte = to_device(dwte), ddwpe = to_device(dwpe), ddemb = to_device(demb);
  auto dtokens = to_device(tokens);
  kernels::embedding_backward<RefExec>(dwte.data(), dwpe.data(), demb.data(), tokens.data(), Bt,
                                       Tt, C, 0);
  team::embedding_backward<Dev>(ddwte.data(), ddwpe.data(), ddemb.data(), dtokens.data(), Bt, Tt,
                                C, 0);
  EXPECT_EQ(to_host(ddwte), dwte);
  EXPECT_EQ(to_host(ddwpe), dwpe);
}

// bf16 storage on the device: the rounding kernel bitwise as the host's; the layernorm's bf16
// output within one bf16 step of the host's (the row sums add in another order); the softmax
// backward from bf16 probabilities as the host's from the same patterns.
TEST(DeviceTeamKernels, Bf16StorageMatchesHost) {
  const int N = 64, C = 768;
  auto x = random_vector(N * C, 31, 3.0f), w = random_vector(C, 32), b = random_vector(C, 33);
  std::vector<std::uint16_t> want(N * C), bits(N * C);
  to_bf16_bits(x.data(), want.data(), want.size());
  auto dx = to_device(x), dw = to_device(w), dbv = to_device(b);
  auto dbits = to_device(bits);
  kernels::to_bf16<Dev>(dbits.data(), dx.data(), int64_t(x.size()));
  EXPECT_EQ(to_host(dbits), want);

  std::vector<std::uint16_t> out16(N * C);
  std::vector<float> mean(N), rstd(N);
  kernels::layernorm_forward<RefExec, std::uint16_t>(out16.data(), mean.data(), rstd.data(),
                                                     x.data(), w.data(), b.data(), N, C, 1e-5f);
  auto dout16 = to_device(out16);
  auto dmean = to_device(mean), drstd = to_device(rstd);
  team::layernorm_forward<Dev, std::uint16_t>(dout16.data(), dmean.data(), drstd.data(),
                                              dx.data(), dw.data(), dbv.data(), N, C, 1e-5f);
  std::vector<float> got(N * C), ref(N * C);
  const std::vector<std::uint16_t> got16 = to_host(dout16);
  from_bf16_bits(got16.data(), got.data(), got.size());
  from_bf16_bits(out16.data(), ref.data(), ref.size());
  expect_close("gpu bf16 layernorm out", got, ref, 1e-6, 1.0 / 128);

  const int rows = 4 * 37, T = 37;
  auto att = random_vector(rows * T, 34, 4.0f);
  kernels::causal_softmax_forward<RefExec>(att.data(), rows, T);
  std::vector<std::uint16_t> att16(att.size());
  to_bf16_bits(att.data(), att16.data(), att.size());
  auto d = random_vector(rows * T, 35), dref = d;
  kernels::causal_softmax_backward<RefExec, std::uint16_t>(dref.data(), att16.data(), rows, T,
                                                           0.3f);
  auto dd = to_device(d);
  auto datt16 = to_device(att16);
  team::causal_softmax_backward<Dev, std::uint16_t>(dd.data(), datt16.data(), rows, T, T, 0,
                                                    0.3f);
  expect_close("gpu bf16 softmax backward", to_host(dd), dref, 1e-6, 1e-5);

  // The MLP epilogue (bias + GELU, output in bf16) against the host's.
  const int F = 3 * 257;
  auto pre = random_vector(N * F, 36, 3.0f), fb = random_vector(F, 37), host_pre = pre;
  std::vector<std::uint16_t> act(N * F), host_act(N * F);
  kernels::bias_activation_forward<RefExec>(host_act.data(), host_pre.data(), fb.data(), N, F,
                                            true);
  auto dpre = to_device(pre);
  auto dfb = to_device(fb);
  auto dact = to_device(act);
  kernels::bias_activation_forward<Dev>(dact.data(), dpre.data(), dfb.data(), N, F, true);
  EXPECT_EQ(to_host(dpre), host_pre);
  std::vector<float> got_act(N * F), want_act(N * F);
  const std::vector<std::uint16_t> act16 = to_host(dact);
  from_bf16_bits(act16.data(), got_act.data(), got_act.size());
  from_bf16_bits(host_act.data(), want_act.data(), want_act.size());
  expect_close("gpu bias + GELU (bf16)", got_act, want_act, 1e-6, 1.0 / 128);
}

// The references run on the host's execution space (the team kernels checked against the host
// optimizer and the host fused attention above): in a CUDA build, core/layers.cpp and AdamW
// launch on the device.
TEST(DeviceTeamKernels, AdamWAndAttentionMatchHost) {
  std::vector<ParamSpec> table(2);
  table[0].name = "w";
  table[0].role = ParamRole::weight;
  table[0].count = 100000;
  table[1].name = "b";
  table[1].role = ParamRole::bias;
  table[1].offset = 100000;
  table[1].count = 768;
  const std::size_t n = 100768;
  AdamWParams hp;
  auto params = random_vector(n, 1), grads = random_vector(n, 2);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  auto dparams = to_device(params), dgrads = to_device(grads), dm = to_device(m),
       dv = to_device(v);
  const auto block_list = team::adamw_blocks(table, {{0, n}}, false, false);
  team::AdamWBlockTable<Dev> blocks(block_list);
  for (int64_t step = 1; step <= 2; ++step) {
    team::adamw_update<TeamExec>(params.data(), grads.data(), m.data(), v.data(),
                                 block_list.data(), int(block_list.size()),
                                 team::adamw_scalars(hp, step, 0.5f));
    team::adamw_update<Dev>(dparams.data(), dgrads.data(), dm.data(), dv.data(), blocks.data(),
                            blocks.size(), team::adamw_scalars(hp, step, 0.5f));
  }
  // The device may contract multiply-adds, so equal to float rounding rather than bitwise.
  expect_close("gpu adamw params", to_host(dparams), params, 1e-6, 1e-6);

  const int B = 2, T = 200, C = 128, H = 2;  // hs = 64, T not a multiple of any tile
  auto qkv = random_vector(B * T * 3 * C, 21, 2.0f), dy = random_vector(B * T * C, 22);
  std::vector<double> ny, nlse;
  naive_attention(qkv, ny, nlse, B, T, C, H);
  auto dqkv_in = to_device(qkv), ddy = to_device(dy);
  auto dlse = to_device(std::vector<float>(B * H * T));
  auto dyo = to_device(std::vector<float>(B * T * C));
  team::attention_forward<Dev>(dlse.data(), dyo.data(), dqkv_in.data(), B, T, C, H);
  const auto y = to_host(dyo), lse = to_host(dlse);
  expect_close("gpu attention y", y, std::vector<float>(ny.begin(), ny.end()), 1e-5);
  expect_close("gpu attention lse", lse, std::vector<float>(nlse.begin(), nlse.end()), 1e-5);
  std::vector<float> host_dqkv(B * T * 3 * C);
  team::attention_backward<TeamExec>(host_dqkv.data(), dy.data(), y.data(), qkv.data(),
                                     lse.data(), B, T, C, H);
  auto ddqkv = to_device(std::vector<float>(B * T * 3 * C, 7.0f));
  team::attention_backward<Dev>(ddqkv.data(), ddy.data(), dyo.data(), dqkv_in.data(), dlse.data(),
                                B, T, C, H);
  expect_close("gpu attention dqkv", to_host(ddqkv), host_dqkv, 1e-4);
}

// The LLaMA kernels through their entry points (core/llama_kernels.hpp), which take the team
// forms on the device, against the host kernels on the same inputs.
TEST(DeviceTeamKernels, LlamaKernelsMatchHost) {
  const int N = 64, C = 768;
  auto x = random_vector(N * C, 61, 3.0f), w = random_vector(C, 62), g = random_vector(N * C, 63);
  std::vector<float> out(N * C), rstd(N);
  kernels::rmsnorm_forward<RefExec>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  auto dx = to_device(x), dw = to_device(w), dg = to_device(g);
  auto dout = to_device(std::vector<float>(N * C)), drstd = to_device(std::vector<float>(N));
  kernels::rmsnorm_forward<Dev>(dout.data(), drstd.data(), dx.data(), dw.data(), N, C, 1e-5f);
  expect_close("gpu rmsnorm out", to_host(dout), out, 1e-5, 1e-5);
  expect_close("gpu rmsnorm rstd", to_host(drstd), rstd, 1e-6, 1e-5);
  std::vector<float> dinp(N * C, 0.5f), dweight(C, 0.25f);
  auto ddinp = to_device(dinp), ddweight = to_device(dweight);
  drstd = to_device(rstd);
  kernels::rmsnorm_backward<RefExec>(dinp.data(), dweight.data(), g.data(), x.data(), w.data(),
                                     rstd.data(), N, C);
  kernels::rmsnorm_backward<Dev>(ddinp.data(), ddweight.data(), dg.data(), dx.data(), dw.data(),
                                 drstd.data(), N, C);
  expect_close("gpu rmsnorm dinp", to_host(ddinp), dinp, 1e-5, 1e-5);
  expect_close("gpu rmsnorm dweight", to_host(ddweight), dweight, 1e-4, 1e-5);

  const int B = 2, T = 32, H = 12, KV = 4, hs = 64, W = (H + 2 * KV) * hs, pos0 = 5;
  std::vector<float> cos_table((pos0 + T) * hs / 2), sin_table(cos_table.size());
  kernels::rope_table(cos_table.data(), sin_table.data(), pos0 + T, hs, 10000.0);
  auto qkv_gqa = random_vector(B * T * W, 64, 2.0f);
  auto dqkv_gqa = to_device(qkv_gqa), dcos = to_device(cos_table), dsin = to_device(sin_table);
  kernels::rope_rotate<RefExec>(qkv_gqa.data(), B, T, W, 0, H, hs, pos0, cos_table.data(),
                                sin_table.data(), false);
  kernels::rope_rotate<Dev>(dqkv_gqa.data(), B, T, W, 0, H, hs, pos0, dcos.data(), dsin.data(),
                            false);
  expect_close("gpu rope", to_host(dqkv_gqa), qkv_gqa, 1e-6, 1e-6);
  std::vector<float> qkv(B * T * 3 * H * hs);
  auto dqkv = to_device(qkv);
  kernels::gqa_expand<RefExec>(qkv.data(), qkv_gqa.data(), B * T, H, KV, hs);
  dqkv_gqa = to_device(qkv_gqa);
  kernels::gqa_expand<Dev>(dqkv.data(), dqkv_gqa.data(), B * T, H, KV, hs);
  EXPECT_EQ(to_host(dqkv), qkv);
  std::vector<float> reduced(B * T * W);
  auto dreduced = to_device(reduced);
  kernels::gqa_reduce<RefExec>(reduced.data(), qkv.data(), B * T, H, KV, hs);
  kernels::gqa_reduce<Dev>(dreduced.data(), dqkv.data(), B * T, H, KV, hs);
  EXPECT_EQ(to_host(dreduced), reduced);

  const int F = 3 * 257;
  auto fc = random_vector(N * 2 * F, 65, 4.0f), dact = random_vector(N * F, 66);
  std::vector<float> act(N * F), dfc(N * 2 * F);
  auto dfcv = to_device(fc), dactv = to_device(dact), actv = to_device(act), dfcout = to_device(dfc);
  kernels::swiglu_forward<RefExec>(act.data(), fc.data(), fc.data() + F, 2 * F, N, F);
  kernels::swiglu_forward<Dev>(actv.data(), dfcv.data(), dfcv.data() + F, 2 * F, N, F);
  expect_close("gpu swiglu out", to_host(actv), act, 1e-6, 1e-5);
  kernels::swiglu_backward<RefExec>(dfc.data(), dfc.data() + F, dact.data(), fc.data(),
                                    fc.data() + F, 2 * F, N, F);
  kernels::swiglu_backward<Dev>(dfcout.data(), dfcout.data() + F, dactv.data(), dfcv.data(),
                                dfcv.data() + F, 2 * F, N, F);
  expect_close("gpu swiglu dgate, dup", to_host(dfcout), dfc, 1e-6, 1e-5);
}
// Incremental decoding's attention on the device (the team form) against the host form.
TEST(DeviceTeamKernels, CachedAttentionMatchesHost) {
  const int H = 12, KV = 4, hs = 64, ldq = (H + 2 * KV) * hs, window = 1024, n = 3, p0 = 700;
  const auto k = random_vector(std::size_t(window) * KV * hs, 95, 2.0f);
  const auto v = random_vector(std::size_t(window) * KV * hs, 96);
  const auto q = random_vector(std::size_t(n) * ldq, 97, 2.0f);
  std::vector<float> host(std::size_t(n) * H * hs);
  kernels::cached_attention<RefExec>(host.data(), q.data(), ldq, k.data(), v.data(), n, p0, H, KV,
                                     hs);
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  auto dout = to_device(std::vector<float>(host.size()));
  kernels::cached_attention<Dev>(dout.data(), dq.data(), ldq, dk.data(), dv.data(), n, p0, H, KV,
                                 hs);
  expect_close("gpu cached attention", to_host(dout), host, 1e-5, 1e-5);
}

// The grid modes' kernels on the device: the split layernorm's passes (one rank holding every
// column, so the all-reduces between them are the identity) against the same passes on the
// host's execution space, and the embedding blocks of both layouts bitwise against the host's
// order (the host forms of core/model2d.cpp and core/model3d.cpp, written out).
TEST(DeviceTeamKernels, GridKernelsMatchHost) {
  const int64_t r = 64;
  const int c = 384;
  const float inv_cols = 1.0f / float(c), eps = 1e-5f;
  auto x = random_vector(r * c, 71, 3.0f), w = random_vector(c, 72), b = random_vector(c, 73);
  auto g = random_vector(r * c, 74);
  std::vector<float> sums(2 * r), mean(r), rstd(r), out(r * c);
  team::layernorm_split_row_sums<TeamExec>(sums.data(), x.data(), r, c);
  team::layernorm_split_row_squares<TeamExec>(sums.data(), mean.data(), x.data(), r, c, inv_cols);
  team::layernorm_split_normalize<TeamExec>(out.data(), rstd.data(), x.data(), mean.data(),
                                            sums.data(), w.data(), b.data(), r, c, inv_cols, eps);
  Kokkos::fence();
  auto dx = to_device(x), dw = to_device(w), dbv = to_device(b), dg = to_device(g);
  auto dsums = to_device(std::vector<float>(2 * r)), dmean = to_device(std::vector<float>(r)),
       drstd = to_device(std::vector<float>(r)), dout = to_device(std::vector<float>(r * c));
  team::layernorm_split_row_sums<Dev>(dsums.data(), dx.data(), r, c);
  team::layernorm_split_row_squares<Dev>(dsums.data(), dmean.data(), dx.data(), r, c, inv_cols);
  team::layernorm_split_normalize<Dev>(dout.data(), drstd.data(), dx.data(), dmean.data(),
                                       dsums.data(), dw.data(), dbv.data(), r, c, inv_cols, eps);
  expect_close("gpu split layernorm mean", to_host(dmean), mean, 1e-6, 1e-5);
  expect_close("gpu split layernorm rstd", to_host(drstd), rstd, 1e-6, 1e-5);
  expect_close("gpu split layernorm out", to_host(dout), out, 1e-5, 1e-5);
  std::vector<float> dinp(r * c, 0.5f), dweight(c, 0.25f), dbias(c, 0.0f);
  auto ddinp = to_device(dinp), ddweight = to_device(dweight), ddbias = to_device(dbias);
  dmean = to_device(mean);
  drstd = to_device(rstd);
  team::layernorm_split_backward_sums<TeamExec>(sums.data(), g.data(), x.data(), w.data(),
                                                mean.data(), rstd.data(), r, c);
  team::layernorm_split_backward_finish<TeamExec>(dinp.data(), dweight.data(), dbias.data(),
                                                  sums.data(), g.data(), x.data(), w.data(),
                                                  mean.data(), rstd.data(), r, c, inv_cols);
  Kokkos::fence();
  team::layernorm_split_backward_sums<Dev>(dsums.data(), dg.data(), dx.data(), dw.data(),
                                           dmean.data(), drstd.data(), r, c);
  team::layernorm_split_backward_finish<Dev>(ddinp.data(), ddweight.data(), ddbias.data(),
                                             dsums.data(), dg.data(), dx.data(), dw.data(),
                                             dmean.data(), drstd.data(), r, c, inv_cols);
  expect_close("gpu split layernorm dx", to_host(ddinp), dinp, 1e-5, 1e-5);
  // column_sums adds in an order fixed by the shapes: the bias gradient (sums of dout alone)
  // bitwise the host's team form; the weight gradient's terms are products that either compiler
  // may contract into its sums.
  expect_close("gpu split layernorm dweight", to_host(ddweight), dweight, 1e-5, 1e-5);
  EXPECT_EQ(to_host(ddbias), dbias);

  const int B = 4, T = 64, V = 300, offset = 2;
  const int64_t BT = int64_t(B) * T, vb = 100, pb = 35;
  std::vector<int32_t> tokens(BT);
  for (int64_t i = 0; i < BT; ++i) tokens[i] = int32_t((i * 13 + i / 7) % V);
  auto d = random_vector(BT * c, 75);
  auto dd = to_device(d);
  auto dtokens = to_device(tokens);
  for (bool transposed : {false, true}) {
    const int64_t rs = transposed ? 1 : c, cs = transposed ? vb : 1, v0 = vb, p0 = pb;
    auto wte = random_vector(vb * c, 76), wpe = random_vector(pb * c, 77);
    std::vector<float> want(BT * c);
    host_grid_embedding_forward(want.data(), tokens.data(), wte.data(), rs, cs, wpe.data(), BT,
                                T, c, v0, vb, offset, p0, pb);
    auto dwte = to_device(wte), dwpe = to_device(wpe);
    auto dembed = to_device(std::vector<float>(BT * c));
    team::grid_embedding_forward<Dev>(dembed.data(), dtokens.data(), dwte.data(), rs, cs,
                                      dwpe.data(), BT, T, c, v0, vb, offset, p0, pb);
    EXPECT_EQ(to_host(dembed), want) << (transposed ? "3D layout" : "2D layout");
    auto gwte = random_vector(vb * c, 78), gwpe = random_vector(pb * c, 79);
    auto dgwte = to_device(gwte), dgwpe = to_device(gwpe);
    for (int64_t s = 0; s < c; ++s) {
      for (int64_t n = 0; n < BT; ++n) {
        const int64_t tok = int64_t(tokens[n]) - v0, p = int64_t(n % T) + offset - p0;
        if (tok >= 0 && tok < vb) gwte[tok * rs + s * cs] += d[n * c + s];
        if (p >= 0 && p < pb) gwpe[p * c + s] += d[n * c + s];
      }
    }
    team::embedding_backward_tokens<Dev>(dgwte.data(), rs, cs, dd.data(), dtokens.data(), int(BT),
                                         c, v0, vb, 0);
    team::grid_position_backward<Dev>(dgwpe.data(), dd.data(), B, T, c, offset, p0, pb);
    EXPECT_EQ(to_host(dgwte), gwte) << (transposed ? "3D layout" : "2D layout");
    EXPECT_EQ(to_host(dgwpe), gwpe) << (transposed ? "3D layout" : "2D layout");
  }
}
#endif  // KOKKOS_ENABLE_CUDA
