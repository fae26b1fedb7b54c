// The Hugging Face export without Python: a model file exported (single and sharded) reads back
// through io::SafetensorsSet bitwise, config.json carries the sizes, sizes parse with units.
// (tests/python/test_hf_export.py checks the same files with safetensors and transformers.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/config.hpp"
#include "io/hdf5_file.hpp"
#include "io/hf_export.hpp"
#include "io/safetensors.hpp"

using namespace colossal;

namespace {

std::string fresh(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("colossal_hf_export_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class HfExport : public ::testing::TestWithParam<std::string> {};

TEST_P(HfExport, ModelFileReadsBackBitwiseSingleAndSharded) {
  const std::string arch = GetParam(), dir = fresh(arch);
  const io::Config config = io::parse_config(
      "model: {arch: " + arch + ", layers: 2, hidden: 16, heads: 2, ffn_hidden: 24, vocab: 50,"
      " max_seq: 8}\ntrain: {seq_len: 8}\n",
      "test", {}, io::ParseOptions{.require_data = false});
  const auto table = core::parameter_table(config.model);
  std::vector<float> values(core::parameter_units(table, 16).back().end, 0.0f);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.001f - 1.5f;
  io::write_model_file(dir + "/model.h5", table, values.data(), config.text);

  for (const uint64_t shard : {uint64_t(0), uint64_t(4096)}) {
    const std::string out = dir + "/hf" + std::to_string(shard);
    const auto files = io::export_model_file(dir + "/model.h5", out, shard);
    const bool sharded = shard > 0;
    EXPECT_EQ(std::filesystem::exists(out + "/model.safetensors.index.json"), sharded);
    EXPECT_EQ(std::filesystem::exists(out + "/model.safetensors"), !sharded);
    EXPECT_GT(files.size(), sharded ? 3u : 1u);
    const io::SafetensorsSet set(out);
    EXPECT_EQ(set.names().size(), table.size());
    for (const core::ParamSpec& p : table) {
      ASSERT_TRUE(set.has(p.name)) << p.name;
      EXPECT_EQ(set.info(p.name).shape, p.shape) << p.name;
      EXPECT_EQ(set.info(p.name).dtype, io::StDtype::F32);
      const std::vector<float> got = set.read_all(p.name);
      const std::vector<float> want(values.begin() + p.offset,
                                    values.begin() + p.offset + p.count);
      EXPECT_EQ(got, want) << p.name << " not bitwise";
    }
    EXPECT_FALSE(set.has("lm_head.weight"));  // tied
    const std::string json = slurp(out + "/config.json");
    if (arch == "gpt2") {
      for (const char* part : {"\"GPT2LMHeadModel\"", "\"n_embd\": 16", "\"n_inner\": 24",
                               "\"n_positions\": 8", "\"vocab_size\": 50", "\"gelu_new\""}) {
        EXPECT_NE(json.find(part), std::string::npos) << part << "\n" << json;
      }
    } else {
      for (const char* part : {"\"OPTForCausalLM\"", "\"hidden_size\": 16", "\"ffn_dim\": 24",
                               "\"max_position_embeddings\": 8", "\"relu\""}) {
        EXPECT_NE(json.find(part), std::string::npos) << part << "\n" << json;
      }
    }
    EXPECT_NE(json.find("\"tie_word_embeddings\": true"), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, HfExport, ::testing::Values("gpt2", "opt"));

TEST(HfExport, BadInputIsNamed) {
  const std::string dir = fresh("bad");
  try {
    io::export_model_file(dir + "/nope.h5", dir + "/out", 0);
    FAIL() << "exported a missing file";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/nope.h5' does not exist"), std::string::npos)
        << e.what();
  }
}

TEST(HfExport, ByteSizesParseWithUnits) {
  EXPECT_EQ(io::parse_byte_size("5GB"), 5'000'000'000ull);
  EXPECT_EQ(io::parse_byte_size("200MB"), 200'000'000ull);
  EXPECT_EQ(io::parse_byte_size("64KiB"), 65536ull);
  EXPECT_EQ(io::parse_byte_size("1.5MiB"), 1572864ull);
  EXPECT_EQ(io::parse_byte_size("1000"), 1000ull);
  EXPECT_EQ(io::parse_byte_size("2gb"), 2'000'000'000ull);
  for (const char* bad : {"big", "", "-5GB", "5XB", "0"}) {
    EXPECT_THROW(io::parse_byte_size(bad), std::invalid_argument) << bad;
  }
}

}  // namespace
