// model.init_from: weights written as a Hugging Face directory (our safetensors writer, the names
// and layouts transformers uses, its extra buffers and tied head), a model.h5 or a training
// checkpoint start training with the same first-step loss as the model they came from, under
// every parallel layout, each rank reading only its part; every mismatch is refused naming the
// tensor, the shapes and the config key; config.json gives the sizes (model.preset: from_weights).
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/errors.hpp"
#include "apps/trainer.hpp"
#include "io/checkpoint.hpp"
#include "io/config.hpp"
#include "io/hdf5_file.hpp"
#include "io/init_from.hpp"
#include "io/safetensors.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train_parity.hpp"

using namespace colossal;
namespace fs = std::filesystem;

namespace {

struct Layout {
  int data = 1, tensor = 1, pipeline = 1, zero = 0;
  std::string mode = "1d";
  std::string name() const {
    return "dp" + std::to_string(data) + "tp" + std::to_string(tensor) + mode + "pp" +
           std::to_string(pipeline) + "z" + std::to_string(zero);
  }
};

std::string model_yaml(const std::string& arch) {
  return "model: {arch: " + arch +
         ", layers: 2, hidden: 32, heads: 4, ffn_hidden: 64, vocab: 200, max_seq: 16, "
         "vocab_multiple: 16" +
         (arch == "llama" ? ", kv_heads: 2, rope_theta: 500.0, rms_eps: 1.0e-6" : "");
}

io::Config config(const std::string& arch, const std::string& data, const std::string& run,
                  const Layout& l, const std::string& init_from, uint64_t seed = 1234) {
  const std::string text =
      model_yaml(arch) + (init_from.empty() ? "" : ", init_from: " + init_from) + "}\n" +
      "data: {path: " + data + ", val_path: " + data + ", val_windows: 8}\n"
      "train: {steps: 1, seq_len: 16, global_batch: 8, micro_batch: 2, seed: " +
      std::to_string(seed) + ",\n        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n" +
      "parallel: {data: " + std::to_string(l.data) + ", tensor: {size: " +
      std::to_string(l.tensor) + ", mode: " + l.mode + "}, pipeline: {size: " +
      std::to_string(l.pipeline) + "}, zero: {stage: " + std::to_string(l.zero) + "}}\n" +
      "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " +
      (fs::temp_directory_path() / ("colossal_if_" + run)).string() + "}\n";
  return io::parse_config(text, "test");
}

std::string fresh_dir(parallel::Communicator& world, const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("colossal_if_" + name);
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier();
  return dir.string();
}

// A Hugging Face directory of `values` (laid out as `table`): every logical tensor under its
// name, plus what transformers' files carry besides (GPT-2's causal-mask buffers, an
// lm_head.weight equal to the embedding), and a config.json.
void write_hf_dir(const std::string& dir, const core::ModelSpec& spec,
                  const std::vector<core::ParamSpec>& table, const std::vector<float>& values,
                  uint64_t shard_bytes = 0) {
  std::vector<io::StTensorOut> out;
  for (const auto& p : table) out.push_back({p.name, p.shape, values.data() + p.offset});
  if (spec.tied())  // transformers saves the tied head too; an untied llama's is in `table`
    out.push_back({"lm_head.weight", table.front().shape, values.data() + table.front().offset});
  std::vector<float> mask(std::size_t(spec.max_seq) * spec.max_seq, 1.0f);
  if (spec.arch == core::Arch::gpt2)
    for (int l = 0; l < spec.layers; ++l)
      out.push_back({"transformer.h." + std::to_string(l) + ".attn.bias",
                     {1, 1, spec.max_seq, spec.max_seq}, mask.data()});
  io::write_safetensors_dir(dir, out, shard_bytes, {{"format", "pt"}});
  nlohmann::json c;
  if (spec.arch == core::Arch::gpt2)
    c = {{"model_type", "gpt2"}, {"n_embd", spec.hidden}, {"n_layer", spec.layers},
         {"n_head", spec.heads}, {"n_inner", spec.ffn_hidden}, {"n_positions", spec.max_seq},
         {"vocab_size", spec.vocab}, {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", 1e-5}};
  else if (spec.llama())
    c = {{"model_type", "llama"}, {"hidden_size", spec.hidden},
         {"num_hidden_layers", spec.layers}, {"num_attention_heads", spec.heads},
         {"num_key_value_heads", spec.key_value_heads()}, {"intermediate_size", spec.ffn_hidden},
         {"max_position_embeddings", spec.max_seq}, {"vocab_size", spec.vocab},
         {"rms_norm_eps", spec.rms_eps}, {"rope_theta", spec.rope_theta},
         {"tie_word_embeddings", spec.tie_embeddings}, {"hidden_act", "silu"}};
  else
    c = {{"model_type", "opt"}, {"hidden_size", spec.hidden}, {"num_hidden_layers", spec.layers},
         {"num_attention_heads", spec.heads}, {"ffn_dim", spec.ffn_hidden},
         {"max_position_embeddings", spec.max_seq}, {"vocab_size", spec.vocab},
         {"word_embed_proj_dim", spec.hidden}, {"do_layer_norm_before", true},
         {"activation_function", "relu"}};
  std::ofstream(fs::path(dir) / "config.json") << c.dump(2);
}

double first_loss(const io::Config& c, parallel::Communicator* world) {
  apps::Trainer trainer(c, nullptr, world);  // every layout, 2d/2.5d/3d included
  return trainer.train().losses.at(0);
}

}  // namespace

// A model set to weights its seed does not give, and models initialised from those weights (a
// sharded Hugging Face directory, model.h5, a checkpoint): the same first-step loss, bitwise on
// one rank, within fp32 rounding under dp2, tp2, pp2, ZeRO-3, 2d and tp2 x pp2; tensor, pipeline
// and ZeRO-3 ranks read less than the whole model.
TEST(InitFrom, EveryLayoutStartsFromTheFileWithTheSameLoss) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const std::string data = test::shared_training_text(world, "colossal_if_data.txt", 77);
  for (const std::string arch : {"gpt2", "opt", "llama"}) {
    const std::string dir = fresh_dir(world, arch + std::to_string(world.size()));
    apps::Trainer reference(config(arch, data, "ref" + std::to_string(world.rank()), {}, ""),
                            nullptr);
    const auto table = reference.logical_table();
    // Weights the seeded initialisation does not give: a model that ignored init_from would
    // start elsewhere. (The seed also orders the data, so every run keeps it.)
    std::vector<float> values = reference.logical_parameters();
    // (RMSNorm undoes much of a uniform scale: llama's weights get a larger wobble.)
    const float wobble = arch == "llama" ? 0.1f : 0.01f;
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = 1.25f * values[i] + wobble * std::sin(float(i));
    const double unrelated = reference.evaluate();
    reference.set_local_parameters(reference.from_logical(values));
    ASSERT_GT(std::abs(reference.evaluate() - unrelated), 1e-3 * unrelated);
    const io::Config ref_config = config(arch, data, "refc", {}, "");
    if (world.rank() == 0) {
      write_hf_dir(dir + "/hf", ref_config.model, table, values, /*shard_bytes=*/20000);
      reference.save_weights(dir + "/model.h5");
      std::vector<float> zeros(values.size(), 0.0f);
      io::CheckpointState state;
      state.step = 3;
      state.config = ref_config.text;
      io::write_checkpoint(dir + "/ckpt", table, values.data(), zeros.data(), zeros.data(), state,
                           1);
    }
    world.barrier();
    ASSERT_TRUE(fs::exists(dir + "/hf/model.safetensors.index.json"));  // sharded
    const double expected = reference.train().losses.at(0);

    const std::string checkpoint = io::list_checkpoints(dir + "/ckpt").at(0);
    for (const std::string& source : {dir + "/hf", dir + "/model.h5", checkpoint}) {
      const double one = first_loss(config(arch, data, "one" + std::to_string(world.rank()), {},
                                           source), nullptr);
      EXPECT_EQ(one, expected) << arch << " from " << source;
    }
    std::vector<Layout> layouts;
    if (world.size() == 2)
      layouts = {{2, 1, 1, 0}, {1, 2, 1, 0}, {1, 1, 2, 0}, {2, 1, 1, 3}};
    if (world.size() == 4)
      layouts = {{1, 4, 1, 0, "2d"}, {2, 2, 1, 3}, {1, 2, 2, 0}};
    const auto whole = core::parameter_units(table, 16).back().end;
    for (const Layout& l : layouts) {
      for (const std::string& source : {dir + "/hf", dir + "/model.h5"}) {
        if (l.mode == "2d" && arch == "opt" && source != dir + "/hf") continue;
        if (l.mode == "2d" && arch == "llama") continue;  // llama runs the 1D layouts
        const uint64_t before = io::weights_elements_read();
        std::string run = "l";  // appended, not "l" + name(): GCC 12's -Wrestrict misfires there
        run += l.name();
        const double loss = first_loss(config(arch, data, run, l, source), &world);
        const uint64_t read = io::weights_elements_read() - before;
        EXPECT_NEAR(loss, expected, 1e-5 * expected) << arch << " " << l.name() << " " << source;
        if (l.tensor > 1 || l.pipeline > 1 || l.zero == 3) {
          EXPECT_LT(read, whole) << arch << " " << l.name() << ": rank " << world.rank()
                                 << " read the whole model";
        }
        EXPECT_GT(read, 0u);
      }
    }
  }
}

// What check_weights refuses, each naming the file, the tensor, the shapes and the key.
TEST(InitFrom, RefusesMismatchesNamingTheTensorAndTheKey) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.rank() != 0) return;  // files and checks of one process
  const std::string dir = (fs::temp_directory_path() / "colossal_if_bad").string();
  fs::remove_all(dir);
  const io::Config c = config("gpt2", "unused", "bad", {}, "");
  const auto table = core::parameter_table(c.model);
  std::vector<float> values(core::parameter_units(table, 16).back().end);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i % 97) * 0.01f;
  auto check = [&](const std::string& path, const core::ModelSpec& spec) -> std::string {
    try {
      return "accepted: " + io::check_weights(path, spec, core::parameter_table(spec));
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  write_hf_dir(dir + "/ok", c.model, table, values);
  const std::string ok = check(dir + "/ok", c.model);
  EXPECT_TRUE(has(ok, "accepted")) << ok;
  EXPECT_TRUE(has(ok, "lm_head.weight equals transformer.wte.weight: accepted as the tied head"));
  EXPECT_TRUE(has(ok, "ignored 2 causal-mask buffers")) << ok;

  core::ModelSpec other = c.model;
  other.vocab = 256;
  std::string e = check(dir + "/ok", other);
  EXPECT_TRUE(has(e, "tensor 'transformer.wte.weight' has shape [200, 32] but the model expects "
                     "[256, 32]; set model.vocab: 200")) << e;
  other = c.model;
  other.max_seq = 32;
  e = check(dir + "/ok", other);
  EXPECT_TRUE(has(e, "'transformer.wpe.weight' has shape [16, 32]")) << e;
  EXPECT_TRUE(has(e, "set model.max_seq: 16")) << e;
  other = c.model;
  other.ffn_hidden = 128;
  e = check(dir + "/ok", other);
  EXPECT_TRUE(has(e, "'transformer.h.0.mlp.c_fc.weight' has shape [32, 64] but the model "
                     "expects [32, 128]; set model.ffn_hidden: 64")) << e;
  other = c.model;
  other.layers = 3;
  e = check(dir + "/ok", other);
  EXPECT_TRUE(has(e, "'transformer.h.2.ln_1.weight' is missing; the file holds 2 layers; set "
                     "model.layers: 2")) << e;
  other.layers = 1;
  e = check(dir + "/ok", other);
  EXPECT_TRUE(has(e, "holds 2 layers but model.layers is 1")) << e;
  // The same in a model.h5 (its tensors were only looked up, so the extra layer went unread).
  io::write_model_file(dir + "/deeper.h5", table, values.data(), "");
  e = check(dir + "/deeper.h5", other);
  EXPECT_TRUE(has(e, "deeper.h5: the file holds 2 layers but model.layers is 1; set "
                     "model.layers: 2")) << e;
  other = c.model;
  other.arch = core::Arch::opt;
  e = check(dir + "/ok", other);
  EXPECT_TRUE(has(e, "the file is a GPT-2 checkpoint; set model.arch: gpt2")) << e;

  // An untied head, an OPT projection, an unknown tensor; names without "transformer.".
  auto variant = [&](const std::string& name, auto edit) {
    std::vector<io::StTensorOut> out;
    for (const auto& p : table) out.push_back({p.name, p.shape, values.data() + p.offset});
    edit(out);
    io::write_safetensors_dir(dir + "/" + name, out, 0);
    return dir + "/" + name;
  };
  std::vector<float> head(values.begin() + table[0].offset,
                          values.begin() + table[0].offset + table[0].count);
  head[17] += 1.0f;
  e = check(variant("untied", [&](auto& out) {
              out.push_back({"lm_head.weight", table[0].shape, head.data()});
            }), c.model);
  EXPECT_TRUE(has(e, "tensor 'lm_head.weight' differs from 'transformer.wte.weight' (element 17"))
      << e;
  e = check(variant("extra", [&](auto& out) {
              out.push_back({"transformer.h.0.attn.q_norm.weight", {32}, values.data()});
            }), c.model);
  EXPECT_TRUE(has(e, "tensor 'transformer.h.0.attn.q_norm.weight' has no place")) << e;
  // A matrix stored transposed (another layout's writer) is named as such: no size key fixes it
  // (the hint named the size key of its first dimension).
  e = check(variant("transposed", [&](auto& out) {
              for (auto& t : out) {
                if (t.shape.size() == 2 && t.shape[0] != t.shape[1] &&
                    t.name.find("mlp.c_fc.weight") != std::string::npos) {
                  std::swap(t.shape[0], t.shape[1]);
                  break;
                }
              }
            }), c.model);
  EXPECT_TRUE(has(e, "the file holds it transposed")) << e;
  EXPECT_FALSE(has(e, "set model.")) << e;
  e = check(variant("missing", [&](auto& out) { out.erase(out.begin() + 5); }), c.model);
  EXPECT_TRUE(has(e, "tensor '" + table[5].name + "' is missing")) << e;
  e = check(variant("bare", [&](auto& out) {
              for (auto& t : out) t.name = t.name.substr(std::string("transformer.").size());
            }), c.model);
  EXPECT_TRUE(has(e, "accepted")) << e;
  EXPECT_TRUE(has(e, "names without 'transformer.'")) << e;
  {
    const io::Config opt = config("opt", "unused", "bad", {}, "");
    const auto opt_table = core::parameter_table(opt.model);
    std::vector<float> v(core::parameter_units(opt_table, 16).back().end, 0.5f);
    std::vector<io::StTensorOut> out;
    for (const auto& p : opt_table) out.push_back({p.name, p.shape, v.data() + p.offset});
    out.push_back({"model.decoder.project_in.weight", {32, 16}, v.data()});
    io::write_safetensors_dir(dir + "/proj", out, 0);
    e = check(dir + "/proj", opt.model);
    EXPECT_TRUE(has(e, "'model.decoder.project_in.weight' projects the embedding")) << e;
  }
  // BF16 weights: converted, and said so.
  {
    std::vector<uint16_t> bf;
    std::string header = "{";
    uint64_t at = 0;
    for (const auto& p : table) {
      const std::size_t n = p.count;
      for (std::size_t i = 0; i < n; ++i) bf.push_back(0x3f80);  // 1.0
      if (at != 0) header += ',';
      header += std::string("\"") + p.name + "\":{\"dtype\":\"BF16\",\"shape\":" +
                nlohmann::json(p.shape).dump() + ",\"data_offsets\":[" + std::to_string(at) +
                "," + std::to_string(at + 2 * n) + "]}";
      at += 2 * n;
    }
    header += "}";
    fs::create_directories(dir + "/bf16");
    std::ofstream f(dir + "/bf16/model.safetensors", std::ios::binary);
    const uint64_t len = header.size();
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << header;
    f.write(reinterpret_cast<const char*>(bf.data()), std::streamsize(bf.size() * 2));
    f.close();
    e = check(dir + "/bf16", c.model);
    EXPECT_TRUE(has(e, "converted " + std::to_string(table.size()) + " BF16 tensors to fp32")) << e;
    std::vector<float> got(table[3].count);
    io::read_weights(dir + "/bf16", c.model, table,
                     {{3, 0, got.size(), got.data()}});
    for (float x : got) ASSERT_EQ(x, 1.0f);
  }
  // LLaMA: an untied head is a tensor of its own; k/v and MLP shapes name their keys; a tied
  // model accepts an lm_head equal to the embedding.
  {
    const io::Config lc = config("llama", "unused", "bad", {}, "");
    ASSERT_FALSE(lc.model.tied());
    const auto lt = core::parameter_table(lc.model);
    std::vector<float> v(core::parameter_units(lt, 16).back().end);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 89) * 0.01f;
    write_hf_dir(dir + "/llama", lc.model, lt, v);
    e = check(dir + "/llama", lc.model);
    EXPECT_TRUE(has(e, "accepted: model.init_from: " + std::to_string(lt.size()) + " tensors"))
        << e;
    EXPECT_EQ(lt.back().name, "lm_head.weight");
    core::ModelSpec o = lc.model;
    o.kv_heads = 4;
    e = check(dir + "/llama", o);
    EXPECT_TRUE(has(e, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 32] but "
                       "the model expects [32, 32]; set model.kv_heads: 2")) << e;
    o = lc.model;
    o.ffn_hidden = 96;
    e = check(dir + "/llama", o);
    EXPECT_TRUE(has(e, "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [64, 32] but the "
                       "model expects [96, 32]; set model.ffn_hidden: 64")) << e;
    o = lc.model;
    o.vocab = 256;
    e = check(dir + "/llama", o);
    EXPECT_TRUE(has(e, "set model.vocab: 200")) << e;
    // The untied file into a tied model: lm_head differs from the embedding.
    o = lc.model;
    o.tie_embeddings = true;
    e = check(dir + "/llama", o);
    EXPECT_TRUE(has(e, "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight'")) << e;
    EXPECT_TRUE(has(e, "set model.tie_embeddings: false")) << e;
    // A tied file (lm_head equal to the embedding, as save_pretrained writes it).
    const auto tt = core::parameter_table(o);
    std::vector<float> tv(core::parameter_units(tt, 16).back().end, 0.25f);
    write_hf_dir(dir + "/llama_tied", o, tt, tv);
    e = check(dir + "/llama_tied", o);
    EXPECT_TRUE(has(e, "lm_head.weight equals model.embed_tokens.weight: accepted as the tied "
                       "head")) << e;
    // A tied file without lm_head.weight into the untied model: missing, with the key.
    std::vector<io::StTensorOut> out;
    for (const auto& p : tt) out.push_back({p.name, p.shape, tv.data() + p.offset});
    io::write_safetensors_dir(dir + "/llama_nohead", out, 0);
    e = check(dir + "/llama_nohead", lc.model);
    EXPECT_TRUE(has(e, "tensor 'lm_head.weight' is missing")) << e;
    EXPECT_TRUE(has(e, "set model.tie_embeddings: true")) << e;
  }
  e = check(dir + "/nowhere", c.model);
  EXPECT_TRUE(has(e, "does not exist")) << e;
}

TEST(InitFrom, ConfigJsonGivesTheSizes) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.rank() != 0) return;
  const std::string dir = (fs::temp_directory_path() / "colossal_if_cfg").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const nlohmann::json& j) { std::ofstream(dir + "/config.json") << j.dump(); };
  auto parse = [&](const std::string& extra) {
    return io::parse_config("model: {preset: from_weights, init_from: " + dir + extra +
                                "}\ndata: {path: x}\ntrain: {seq_len: 16}\n",
                            "test");
  };
  auto error = [&](const std::string& extra) -> std::string {
    try {
      parse(extra);
    } catch (const io::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  write({{"model_type", "gpt2"}, {"n_embd", 64}, {"n_layer", 3}, {"n_head", 4},
         {"n_positions", 128}, {"vocab_size", 300}, {"n_inner", nullptr},
         {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5}});
  io::Config c = parse("");
  EXPECT_EQ(c.model.arch, core::Arch::gpt2);
  EXPECT_EQ(c.model.hidden, 64);
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.model.heads, 4);
  EXPECT_EQ(c.model.max_seq, 128);
  EXPECT_EQ(c.model.vocab, 300);
  EXPECT_EQ(c.model.ffn_hidden, 256);  // n_inner null: 4 * n_embd
  EXPECT_EQ(c.model_init_from, dir);
  EXPECT_EQ(parse(", layers: 2").model.layers, 2);  // explicit keys override
  EXPECT_EQ(io::parse_config(c.text, "again").model.vocab, 300);  // the resolved text re-reads

  write({{"model_type", "gpt2"}, {"n_embd", 64}, {"n_head", 4}, {"activation_function", "gelu"}});
  std::string e = error("");
  EXPECT_NE(e.find("model.preset"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json: activation_function: is 'gelu'"), std::string::npos) << e;
  write({{"model_type", "gpt2"}, {"layer_norm_epsilon", 1e-6}});
  EXPECT_NE(error("").find("layer_norm_epsilon: is 1e-06"), std::string::npos) << error("");

  write({{"model_type", "opt"}, {"hidden_size", 64}, {"num_hidden_layers", 2},
         {"num_attention_heads", 8}, {"ffn_dim", 96}, {"max_position_embeddings", 40},
         {"vocab_size", 120}, {"word_embed_proj_dim", 64}, {"do_layer_norm_before", true}});
  c = parse("");
  EXPECT_EQ(c.model.arch, core::Arch::opt);
  EXPECT_EQ(c.model.ffn_hidden, 96);
  EXPECT_EQ(c.model.max_seq, 40);
  EXPECT_EQ(c.model.position_rows(), 42);
  write({{"model_type", "opt"}, {"hidden_size", 64}, {"word_embed_proj_dim", 32}});
  EXPECT_NE(error("").find("word_embed_proj_dim: is 32 but hidden_size is 64"), std::string::npos)
      << error("");
  write({{"model_type", "opt"}, {"do_layer_norm_before", false}});
  EXPECT_NE(error("").find("do_layer_norm_before: is false"), std::string::npos) << error("");
  // LlamaConfig: the sizes, GQA, eps, theta and tying; what we do not run is refused by key.
  const nlohmann::json llama = {
      {"model_type", "llama"},       {"hidden_size", 64},           {"num_hidden_layers", 3},
      {"num_attention_heads", 8},    {"num_key_value_heads", 2},    {"intermediate_size", 160},
      {"max_position_embeddings", 96}, {"vocab_size", 256},         {"rms_norm_eps", 1e-6},
      {"rope_theta", 500000.0},      {"tie_word_embeddings", false}, {"hidden_act", "silu"},
      {"rope_scaling", nullptr},     {"attention_bias", false},     {"mlp_bias", false},
      {"head_dim", 8}};
  write(llama);
  c = parse("");
  EXPECT_EQ(c.model.arch, core::Arch::llama);
  EXPECT_EQ(c.model.hidden, 64);
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.model.heads, 8);
  EXPECT_EQ(c.model.kv_heads, 2);
  EXPECT_EQ(c.model.ffn_hidden, 160);
  EXPECT_EQ(c.model.max_seq, 96);
  EXPECT_EQ(c.model.vocab, 256);
  EXPECT_EQ(c.model.rms_eps, 1e-6);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_EQ(io::parse_config(c.text, "again").model.kv_heads, 2);
  EXPECT_EQ(io::parse_config(c.text, "again").model.rope_theta, 500000.0);
  {
    nlohmann::json j = llama;
    j["tie_word_embeddings"] = true;
    j.erase("num_key_value_heads");
    j.erase("rope_theta");  // transformers 5 writes it in rope_parameters
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 2500.0}};
    write(j);
    c = parse("");
    EXPECT_TRUE(c.model.tie_embeddings);
    EXPECT_EQ(c.model.key_value_heads(), 8);
    EXPECT_EQ(c.model.rope_theta, 2500.0);
  }
  const std::vector<std::pair<std::pair<std::string, nlohmann::json>, std::string>> refused = {
      {{"hidden_act", "gelu"}, "config.json: hidden_act: is 'gelu'"},
      {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}, "config.json: rope_scaling: is"},
      {{"rope_parameters", {{"rope_type", "llama3"}, {"factor", 8.0}}},
       "rope_type llama3 needs factor, low_freq_factor, high_freq_factor and "
       "original_max_position_embeddings"},
      {{"rope_parameters", {{"rope_type", "yarn"}, {"factor", 8.0}}},
       "config.json: rope_parameters: is {\"factor\":8.0,\"rope_type\":\"yarn\"}; our rotary "
       "embedding supports rope_type default and llama3"},
      {{"attention_bias", true}, "config.json: attention_bias: is true"},
      {{"mlp_bias", true}, "config.json: mlp_bias: is true"},
      {{"head_dim", 16}, "config.json: head_dim: is 16"},
      {{"num_key_value_heads", 3}, "config.json: num_key_value_heads: is 3"},
      {{"rms_norm_eps", -1.0}, "config.json: rms_norm_eps: is -1"},
  };
  for (const auto& [edit, want] : refused) {
    nlohmann::json j = llama;
    j[edit.first] = edit.second;
    write(j);
    e = error("");
    EXPECT_NE(e.find(want), std::string::npos) << edit.first << ": " << e;
  }
  {
    // Llama 3's scaling (Llama 3.1 and later), in transformers 4's rope_scaling or transformers
    // 5's rope_parameters: its four numbers reach the spec and the resolved config; both forms
    // present must agree.
    const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                   {"factor", 32.0},
                                   {"low_freq_factor", 1.0},
                                   {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 8192}};
    nlohmann::json j = llama;
    j["rope_scaling"] = llama3;
    write(j);
    c = parse("");
    for (const io::Config& got : {c, io::parse_config(c.text, "again")}) {
      EXPECT_EQ(got.model.rope_scaling.factor, 32.0);
      EXPECT_EQ(got.model.rope_scaling.low_freq_factor, 1.0);
      EXPECT_EQ(got.model.rope_scaling.high_freq_factor, 4.0);
      EXPECT_EQ(got.model.rope_scaling.original_max_seq, 8192);
    }
    j.erase("rope_scaling");
    j.erase("rope_theta");
    j["rope_parameters"] = llama3;
    j["rope_parameters"]["rope_theta"] = 500000.0;
    write(j);
    c = parse("");
    EXPECT_EQ(c.model.rope_scaling.factor, 32.0);
    EXPECT_EQ(c.model.rope_theta, 500000.0);
    // Both: transformers 5 reads rope_scaling in place of rope_parameters, 4 only rope_scaling.
    j["rope_scaling"] = llama3;
    write(j);
    e = error("");
    EXPECT_NE(e.find("config.json: rope_scaling: and rope_parameters are both set"),
              std::string::npos) << e;
    j.erase("rope_parameters");
    j["rope_theta"] = 500000.0;
    j["rope_scaling"]["rope_theta"] = 1234.0;  // transformers 5 would take this one
    write(j);
    e = error("");
    EXPECT_NE(e.find("rope_scaling.rope_theta: is 1234.0 but rope_theta is 500000.0"),
              std::string::npos) << e;
    j["rope_scaling"].erase("rope_theta");
    j["rope_scaling"]["high_freq_factor"] = 1.0;  // not above low_freq_factor
    write(j);
    e = error("");
    EXPECT_NE(e.find("rope_scaling.low_freq_factor: is 1.0, not below high_freq_factor 1.0"),
              std::string::npos) << e;
    j["rope_scaling"] = llama3;
    j["rope_scaling"]["original_max_position_embeddings"] = 8192.5;
    write(j);
    e = error("");
    EXPECT_NE(e.find("rope_scaling.original_max_position_embeddings: is 8192.5, not a whole "
                     "number"),
              std::string::npos) << e;
    j["rope_scaling"] = nlohmann::json::object();  // empty: none, as transformers reads it
    j["rope_parameters"] = llama3;
    write(j);
    EXPECT_EQ(parse("").model.rope_scaling.factor, 32.0);
    // Unscaled in config.json, scaled in the config: the start-up names the difference.
    io::HfNumerics unscaled;
    unscaled.rope_factor = 1.0;
    const auto differences = io::numerics_differences(
        io::parse_config("model: {preset: llama-tiny, rope_factor: 8}\ndata: {path: x}\n", "t")
            .model,
        unscaled);
    ASSERT_EQ(differences.size(), 1u);
    EXPECT_STREQ(differences[0].key, "model.rope_factor");
    EXPECT_STREQ(differences[0].hf_key, "rope_scaling.factor");
  }
  {
    // Both rope_theta forms, differing: transformers 5 reads one, older versions the other.
    nlohmann::json j = llama;
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
    write(j);
    e = error("");
    EXPECT_NE(e.find("rope_parameters.rope_theta: is 10000.0 but rope_theta is 500000.0"),
              std::string::npos) << e;
    j["rope_parameters"]["rope_theta"] = 500000.0;  // the same value twice is fine
    write(j);
    EXPECT_EQ(parse("").model.rope_theta, 500000.0);
    // LlamaConfig's sizes have no default here (its defaults are a 7B model's): a GPT-2
    // config.json labelled llama was read as one and ran out of memory.
    for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                            "intermediate_size", "vocab_size"}) {
      j = llama;
      j.erase(key);
      write(j);
      e = error("");
      EXPECT_NE(e.find(std::string("config.json: ") + key + ": missing"), std::string::npos)
          << key << ": " << e;
    }
  }
  {
    // Sizes set in the config (no from_weights): the rotary base and RMSNorm epsilon, which no
    // tensor shows, still come from config.json unless set; set, they win.
    write(llama);
    const std::string sizes =
        "model: {arch: llama, layers: 3, hidden: 64, heads: 8, kv_heads: 2, ffn_hidden: 160, "
        "vocab: 256, max_seq: 96, init_from: " + dir;
    const std::string rest = "}\ndata: {path: x}\ntrain: {seq_len: 16}\n";
    c = io::parse_config(sizes + rest, "test");
    EXPECT_EQ(c.model.rope_theta, 500000.0);
    EXPECT_EQ(c.model.rms_eps, 1e-6);
    EXPECT_EQ(io::parse_config(c.text, "again").model.rope_theta, 500000.0);
    c = io::parse_config(sizes + ", rope_theta: 20000" + rest, "test");
    EXPECT_EQ(c.model.rope_theta, 20000.0);
    EXPECT_EQ(c.model.rms_eps, 1e-6);
    EXPECT_FALSE(c.model.rope_scaling.scaled());
    nlohmann::json j = llama;
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 2.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
    write(j);
    c = io::parse_config(sizes + rest, "test");  // the scaling too comes from config.json
    EXPECT_EQ(c.model.rope_scaling.factor, 8.0);
    EXPECT_EQ(c.model.rope_scaling.low_freq_factor, 2.0);
    EXPECT_EQ(c.model.rope_scaling.original_max_seq, 64);
    c = io::parse_config(sizes + ", rope_factor: 4" + rest, "test");  // set, it wins
    EXPECT_EQ(c.model.rope_scaling.factor, 4.0);
    EXPECT_EQ(c.model.rope_scaling.low_freq_factor, 2.0);
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    write(j);
    try {
      io::parse_config(sizes + rest, "test");
      ADD_FAILURE() << "rope_scaling in config.json was ignored";
    } catch (const io::ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find("model.init_from: " + dir +
                                             "/config.json: rope_scaling: is"),
                std::string::npos) << err.what();
    }
    // A stored config (a model file's, a checkpoint's) is read as written: the config.json
    // beside its init_from, changed since, is not consulted.
    const io::Config stored =
        io::parse_config(sizes + ", rope_theta: 7000, rms_eps: 1.0e-5" + rest,
                         "model.h5 (config)", {}, io::ParseOptions{.stored = true});
    EXPECT_EQ(stored.model.rope_theta, 7000.0);
    EXPECT_FALSE(stored.model.rope_scaling.scaled());
  }
  write({{"model_type", "mistral"}});
  EXPECT_NE(error("").find("model_type: is 'mistral'"), std::string::npos) << error("");

  try {
    io::parse_config("model: {preset: from_weights}\ndata: {path: x}\n", "test");
    ADD_FAILURE() << "from_weights without init_from was accepted";
  } catch (const io::ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("from_weights needs model.init_from"),
              std::string::npos) << err.what();
  }
  write(llama);
  const std::string resolved = parse("").text;
  fs::remove(dir + "/config.json");
  EXPECT_NE(error("").find("no config.json beside"), std::string::npos) << error("");
  // The resolved text (model.h5's, a checkpoint's) sets every size: it reads without the
  // weights' directory (colossal_export of a fine-tuned model failed once it was gone).
  c = io::parse_config(resolved, "model.h5 (config)");
  EXPECT_EQ(c.model.hidden, 64);
  EXPECT_EQ(c.model.kv_heads, 2);
  EXPECT_EQ(c.model.rope_theta, 500000.0);
  EXPECT_EQ(c.model.rms_eps, 1e-6);
}
