// The pure parts of collective checkpoints: which logical elements a rank's ranges hold
// (io::tensor_runs over core::logical_runs), the hyperslabs that select them (io::selection_blocks), and the CRC-32
// combination that lets rank 0 check a dataset from the ranks' CRCs of their parts.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>

#include "core/model_spec.hpp"
#include "io/checkpoint.hpp"

using namespace colossal;

namespace {

TEST(CheckpointPlan, Crc32CombineEqualsTheCrcOfTheConcatenation) {
  std::mt19937 rng(7);
  std::vector<unsigned char> bytes(5000);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  // The IEEE CRC-32 that zlib and PNG use: crc32("123456789") = cbf43926, and bit by bit.
  EXPECT_EQ(io::crc32("123456789", 9), 0xcbf43926u);
  for (std::size_t length : {0, 1, 7, 8, 9, 15, 16, 17, 4093, 5000}) {
    uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < length; ++i) {
      c ^= bytes[i];
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    EXPECT_EQ(io::crc32(bytes.data(), length), c ^ 0xFFFFFFFFu) << length << " bytes";
  }
  for (std::size_t split : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(64),
                            std::size_t(1000), std::size_t(4999), std::size_t(5000)}) {
    const uint32_t a = io::crc32(bytes.data(), split);
    const uint32_t b = io::crc32(bytes.data() + split, bytes.size() - split);
    EXPECT_EQ(io::crc32_combine(a, b, bytes.size() - split), io::crc32(bytes.data(), bytes.size()))
        << "split at " << split;
  }
  // Many pieces folded left to right, as rank 0 folds the ranks' pieces of a dataset.
  uint32_t folded = 0;
  for (std::size_t at = 0, n = 1; at < bytes.size(); at += n, n = n * 3 % 997 + 1) {
    const std::size_t len = std::min(n, bytes.size() - at);
    folded = io::crc32_combine(folded, io::crc32(bytes.data() + at, len), len);
  }
  EXPECT_EQ(folded, io::crc32(bytes.data(), bytes.size()));
}

std::vector<io::TensorRun> runs_at(std::initializer_list<std::pair<std::size_t, std::size_t>> r) {
  std::vector<io::TensorRun> out;
  for (auto [logical, length] : r) out.push_back({0, logical, length, nullptr});
  return out;
}

TEST(CheckpointPlan, SelectionBlocksCoverExactlyTheRuns) {
  using B = io::SelectionBlock;
  // A 1-D dataset: one row.
  EXPECT_EQ(io::selection_blocks({100}, runs_at({{10, 30}})), (std::vector<B>{{0, 10, 1, 30}}));
  // Head, middle and tail rows of a [6, 10] dataset: elements 7..44.
  EXPECT_EQ(io::selection_blocks({6, 10}, runs_at({{7, 38}})),
            (std::vector<B>{{4, 0, 1, 5}, {1, 0, 3, 10}, {0, 7, 1, 3}}));  // by column, then row
  // Whole rows from a row start: one rectangle.
  EXPECT_EQ(io::selection_blocks({6, 10}, runs_at({{20, 30}})), (std::vector<B>{{2, 0, 3, 10}}));
  // A column split (columns 4..7 of every row): one rectangle, not one per row.
  EXPECT_EQ(io::selection_blocks({6, 10}, runs_at({{4, 4}, {14, 4}, {24, 4}, {34, 4}, {44, 4},
                                                    {54, 4}})),
            (std::vector<B>{{0, 4, 6, 4}}));
  EXPECT_THROW(io::selection_blocks({2, 2, 2}, runs_at({{0, 8}})), std::invalid_argument);

  // Random disjoint runs: the blocks select every element of the runs and nothing else, once.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t rows = 1 + rng() % 9, cols = 1 + rng() % 13;
    std::vector<io::TensorRun> runs;
    std::vector<int> want(rows * cols, 0);
    for (std::size_t at = rng() % 5; at < rows * cols;) {
      const std::size_t len = std::min<std::size_t>(1 + rng() % 30, rows * cols - at);
      runs.push_back({0, at, len, nullptr});
      for (std::size_t i = at; i < at + len; ++i) want[i] = 1;
      at += len + rng() % 7;
    }
    std::vector<int> got(rows * cols, 0);
    for (const B& b : io::selection_blocks({int64_t(rows), int64_t(cols)}, runs)) {
      for (uint64_t r = b.row; r < b.row + b.rows; ++r) {
        for (uint64_t c = b.col; c < b.col + b.cols; ++c) ++got.at(r * cols + c);
      }
    }
    EXPECT_EQ(got, want) << "trial " << trial;
  }
}

// A small GPT-2 with a padded vocabulary, as tensor parallelism lays it out.
core::ModelSpec small_model() {
  core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 2, 32, 4, 64, 200, 16);
  spec.vocab_multiple = 16;
  return spec;
}

// The value a test buffer holds for element `logical` of logical tensor `tensor`.
float code(std::size_t tensor, std::size_t logical) { return float(tensor * 100000 + logical); }

// Each tensor rank's chunk buffer filled with code() of the logical element each local element
// is (padding: -1), cut into `pieces` ranges as ZeRO shards cut it: the runs a rank writes must
// point at exactly the elements they name, and together tile every logical tensor once.
TEST(CheckpointPlan, ChunkRunsOfTensorRanksAndShardsTileEveryLogicalTensor) {
  const core::ModelSpec spec = small_model();
  const auto logical = core::parameter_table(spec);
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < logical.size(); ++i) index[logical[i].name] = i;
  for (int tensor_size : {1, 2, 4}) {
    for (std::size_t pieces : {std::size_t(1), std::size_t(3), std::size_t(4)}) {
      std::vector<std::vector<int>> hits(logical.size());
      for (std::size_t t = 0; t < logical.size(); ++t) hits[t].assign(logical[t].count, 0);
      std::size_t replicated_read_by_last_rank = 0;
      for (int rank = 0; rank < tensor_size; ++rank) {
        const auto table = core::parameter_table(spec, 16, {tensor_size, rank});
        const std::size_t flat = core::parameter_units(table, 16).back().end;
        std::vector<float> local(flat, -1.0f);
        for (const core::ParamSpec& p : table) {
          for (const core::ShardRun& run : core::shard_runs(p, rank)) {
            for (std::size_t i = 0; i < run.length; ++i) {
              local[p.offset + run.local + i] = code(index.at(p.name), run.logical + i);
            }
          }
        }
        std::vector<io::FlatRange> ranges;  // uneven cuts, in a scrambled order
        const std::size_t step = flat / pieces + 5;
        for (std::size_t begin = 0; begin < flat; begin += step) {
          ranges.push_back({begin, std::min(step, flat - begin), local.data() + begin});
        }
        std::reverse(ranges.begin(), ranges.end());
        for (const io::TensorRun& run : io::tensor_runs(core::logical_runs(table, logical, rank, true), ranges, true)) {
          for (std::size_t i = 0; i < run.length; ++i) {
            ASSERT_EQ(run.data[i], code(run.tensor, run.logical + i))
                << logical[run.tensor].name << " tp" << tensor_size << " rank " << rank;
            ++hits[run.tensor][run.logical + i];
          }
        }
        // Reading, a rank takes the replicated tensors too.
        if (rank == tensor_size - 1) {
          for (const io::TensorRun& run :
               io::tensor_runs(core::logical_runs(table, logical, rank, true), ranges, false)) {
            if (logical[run.tensor].name.find("ln_") != std::string::npos) {
              replicated_read_by_last_rank += run.length;
            }
          }
        }
      }
      for (std::size_t t = 0; t < logical.size(); ++t) {
        EXPECT_EQ(std::count(hits[t].begin(), hits[t].end(), 1), std::ptrdiff_t(hits[t].size()))
            << logical[t].name << " not written exactly once under tp" << tensor_size;
      }
      EXPECT_GT(replicated_read_by_last_rank, 0u);
    }
  }
  // The head chunk of a pipeline (not embedding tokens) leaves its tied copy to the first stage.
  core::StageRange last;
  last.layer_begin = 1;
  last.embeds = false;
  const auto head = core::parameter_table(spec, 16, {}, last);
  std::vector<float> local(core::parameter_units(head, 16).back().end, 0.0f);
  const std::vector<io::FlatRange> all{{0, local.size(), local.data()}};
  for (const io::TensorRun& run : io::tensor_runs(core::logical_runs(head, logical, 0, false), all, true)) {
    EXPECT_EQ(logical[run.tensor].name.find("transformer.w"), std::string::npos);
  }
  std::size_t embedding_read = 0;
  for (const io::TensorRun& run : io::tensor_runs(core::logical_runs(head, logical, 0, false), all, false)) {
    if (logical[run.tensor].name == "transformer.wte.weight") embedding_read += run.length;
  }
  EXPECT_EQ(embedding_read, std::size_t(200 * 32)) << "the head reads the tied embedding";
}

}  // namespace
