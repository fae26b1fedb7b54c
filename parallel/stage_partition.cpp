#include "parallel/stage_partition.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace colossal::parallel {

std::vector<int> partition_stages(const std::vector<double>& cost, int stages, double first_extra,
                                  double last_extra) {
  const int n = int(cost.size());
  if (stages < 1 || stages > n) {
    throw std::invalid_argument(
        "colossal::parallel: " + std::to_string(stages) + " pipeline stages for " +
        std::to_string(n) + " layers (every stage needs at least one block); use between 1 and " +
        std::to_string(n) + " stages (parallel.pipeline.size x chunks)");
  }
  using std::size_t;
  std::vector<double> prefix(size_t(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + cost[size_t(i)];
  // best[s][i]: the least slowest-stage cost of blocks [0, i) in s stages; cut[s][i] where the
  // last of them starts. Stages are scanned so that the earliest stages get the fewest blocks.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(stages) + 1,
                                        std::vector<double>(size_t(n) + 1, inf));
  std::vector<std::vector<int>> cut(size_t(stages) + 1, std::vector<int>(size_t(n) + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s) {
    const std::vector<double>& before = best[size_t(s) - 1];
    std::vector<double>& here = best[size_t(s)];
    std::vector<int>& here_cut = cut[size_t(s)];
    for (int i = s; i <= n - (stages - s); ++i) {
      for (int j = i - 1; j >= s - 1; --j) {  // the stage is [j, i): later starts first
        double stage = prefix[size_t(i)] - prefix[size_t(j)];
        if (s == 1) stage += first_extra;
        if (s == stages) stage += last_extra;
        const double worst = std::max(before[size_t(j)], stage);
        // Ties: the smallest j, so that the stages before this one hold the fewest blocks.
        if (worst < here[size_t(i)] || (worst == here[size_t(i)] && j < here_cut[size_t(i)])) {
          here[size_t(i)] = worst;
          here_cut[size_t(i)] = j;
        }
      }
    }
  }
  std::vector<int> counts(std::size_t(stages), 0);
  int i = n;
  for (int s = stages; s >= 1; --s) {
    const int j = cut[std::size_t(s)][std::size_t(i)];
    counts[std::size_t(s) - 1] = i - j;
    i = j;
  }
  return counts;
}

std::vector<int> balanced_stage_layers(const core::ModelSpec& spec, int seq_len, int stages) {
  const std::vector<double> cost(std::size_t(spec.layers),
                                 core::block_forward_flops(spec, seq_len));
  return partition_stages(cost, stages, 0.0, core::head_forward_flops(spec));
}

}  // namespace colossal::parallel
