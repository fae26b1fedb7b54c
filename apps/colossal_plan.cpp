// colossal_plan: the symbolic cost of the layout a config describes, without running it, and the
// calibration of this host's hardware spec.
#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "apps/calibrate.hpp"
#include "apps/cli.hpp"
#include "apps/layout.hpp"
#include "apps/memory_fit.hpp"
#include "apps/on_root.hpp"
#include "apps/trainer.hpp"
#include "core/host_threads.hpp"
#include "core/layers.hpp"
#include "planner/cost_model.hpp"
#include "planner/step_graph.hpp"

using namespace colossal;

namespace {

// --hardware NAME|FILE, else the config's hardware.file / hardware.preset.
planner::HardwareSpec chosen_hardware(const apps::Invocation& inv, int threads) {
  const std::string name = inv.flag("--hardware");
  if (name.empty()) return apps::hardware_spec(inv.config, threads);
  const std::vector<std::string> presets = planner::hardware_presets();
  const bool preset = std::find(presets.begin(), presets.end(), name) != presets.end();
  if (!preset && !std::ifstream(name)) {
    std::string names;
    for (const std::string& n : presets) names += (names.empty() ? "" : ", ") + n;
    throw apps::UsageError("--hardware: '" + name + "' is neither a preset (" + names +
                           ") nor a readable hardware file");
  }
  planner::HardwareSpec hw = preset ? planner::hardware_preset(name) : planner::read_hardware(name);
  apps::with_host_memory(hw, inv.config);
  return planner::scaled_to_threads(hw, threads);
}

// 124M, 1.5B: a parameter count as model cards write it.
std::string format_parameters(double n) {
  const char* units[] = {"M", "B", "T"};
  double scaled = n / 1e6;
  int unit = 0;
  // The unit after rounding to 3 digits: 999.7M is 1B, not "1e+03M".
  while (unit < 2 && scaled >= 999.5) {
    scaled /= 1000.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.3g%s", scaled, units[unit]);
  return text;
}

// The file `flag` names can be written: checked before the work whose result it takes (a
// search, half a minute of measurements), whose output would otherwise come first and the error
// after it.
// Rank 0 tries; every rank throws alike (the others would wait for it in a collective).
void check_writable(const apps::Invocation& inv, const std::string& path, const char* flag) {
  apps::on_root<apps::UsageError>(*inv.world, std::string(flag) + ": ", [&](std::string& error) {
    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) {
      error = std::string(flag) + ": cannot write '" + path + "' (" + std::strerror(errno) +
              "); give a path in a writable directory";
    } else {
      std::fclose(f);
      std::remove(tmp.c_str());
    }
    return std::string();
  });
}

int calibrate(apps::Invocation& inv) {
  const std::string out = inv.flag("--out", "hardware-host.yaml");
  check_writable(inv, out, "--out");  // before the measurements, not after them
  if (inv.rank == 0) {
    if (apps::device_resident_build()) {
      std::printf("calibrating this GPU node with %d rank(s): linear layers' GEMMs (fp32, "
                  "bf16), attention by length and head width, memory-bound kernels and AdamW on "
                  "the device, the host link, the host's AdamW%s ...\n",
                  inv.world_size, inv.world_size > 1 ? ", all-reduces between the ranks" : "");
    } else {
      std::printf("calibrating this host with %d thread(s) per rank, %d rank(s): linear layers' "
                  "GEMMs (fp32, bf16), attention by length and head width, memory-bound "
                  "kernels, AdamW%s (about half a minute) ...\n",
                  core::HostThreads::shared().size(), inv.world_size,
                  inv.world_size > 1 ? ", ping-pong between ranks 0 and 1" : "");
    }
    // A spec's rates are a rank's with its cores to itself; the planner adds the sharing.
    if (const core::ThreadPlan t = core::current_thread_plan(); t.oversubscribed()) {
      std::printf("warning: %d ranks x %d thread(s) share %d core(s): the rates measured now are "
                  "contended, and plans would count the sharing twice; calibrate with at most %d "
                  "rank(s) of %d thread(s)\n",
                  t.local_ranks, t.threads, t.node_cores, std::max(1, t.node_cores / t.threads),
                  t.threads);
    }
    std::fflush(stdout);
  }
  const auto start = std::chrono::steady_clock::now();
  const planner::HardwareSpec hw = apps::calibrate_host(*inv.world, inv.config.hardware.gemm);
  if (inv.rank != 0) return 0;
  const std::string text = planner::hardware_yaml(hw);
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp);
    if (!(f << text)) throw std::runtime_error("cannot write '" + tmp + "'; choose --out elsewhere");
  }
  std::rename(tmp.c_str(), out.c_str());
  std::printf("%s\nwritten to %s in %.1f s; use it with hardware.file: %s (or --hardware %s)\n",
              text.c_str(), out.c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              out.c_str(), out.c_str());
  return 0;
}

// --precision fp32 or bf16 plans that precision; else the config's train.precision.
bool bf16(const apps::Invocation& inv) {
  const std::string p = inv.flag("--precision", core::to_string(inv.config.train.precision));
  try {
    return core::gemm_precision(p) == core::GemmPrecision::bf16;
  } catch (const std::runtime_error&) {
    throw apps::UsageError("--precision: '" + p + "' must be fp32 or bf16");
  }
}

// The config at the planned precision (--precision, else train.precision): what colossal_train
// would run.
io::Config planned_config(const apps::Invocation& inv) {
  io::Config c = inv.config;
  c.train.precision = bf16(inv) ? core::GemmPrecision::bf16 : core::GemmPrecision::fp32;
  return c;
}

// Its layout as colossal_train runs it (apps::run_layout, the planner's layout for
// parallel.mode: auto too): fp32 weights, gradients and AdamW states; in bf16 the products at the
// bf16 rate, bf16 operands (1d), and the weights' bf16 copy where the run's GEMM keeps one, which
// on a GPU (a device with a host link) cuBLAS always does. Not the planner's own bf16 layout
// (2-byte weights, Megatron's 12-byte optimizer state), which no program runs: priced so, a bf16
// plan needed 20-25% less memory than the trainer then allocated.
planner::RunLayout planned_run(const io::Config& c, const planner::HardwareSpec& hw) {
  planner::RunLayout run = apps::run_layout(c);
  if (hw.host_link_bandwidth > 0) run.bf16_weight_copy = run.bf16_products;
  // The model's logits chunk: the planned hardware's, not this build's.
  run.device = hw.host_link_bandwidth > 0;
  return run;
}

int profile(apps::Invocation& inv) {
  const io::Config c = planned_config(inv);
  const auto& p = c.parallel;
  if (p.tensor_mode != core::TensorMode::d1) {
    throw apps::UsageError(
        std::string("--profile prints the per-op table of 1d layouts; for tensor mode ") +
        core::tensor_mode_name(p.tensor_mode) +
        " use --evaluate (memory by category and step time)");
  }
  const std::string stage_text = inv.flag("--stage", "0");
  char* end = nullptr;
  const long stage = std::strtol(stage_text.c_str(), &end, 10);
  if (end == stage_text.c_str() || *end != '\0' || stage < 0 || stage >= p.pipeline) {
    throw apps::UsageError("--stage: '" + stage_text + "' must be an integer in [0, " +
                           std::to_string(p.pipeline - 1) + "]");
  }
  // Threads per rank as colossal_train would decide them for the config's ranks on this node.
  const int ranks = p.world_size();
  const int threads = std::max(1, core::available_cores() / std::max(1, ranks));
  const planner::HardwareSpec hw = chosen_hardware(inv, threads);
  const auto start = std::chrono::steady_clock::now();
  // The schedule from the spec as written, as colossal_train derives it for the planned
  // device (a GPU's weight copy and logits chunk count against the budget).
  const planner::RunLayout run = planned_run(c, hw);
  const apps::ActivationPlan plan =
      apps::activation_plan(c, run, int(stage), chosen_hardware(inv, 0));
  const planner::RankLayout layout =
      planner::rank_layout(run, int(stage), plan.keep, plan.selective);
  std::string tables;
  std::size_t ops = 0;
  for (const auto& chunk : layout.chunks) {
    const planner::StepGraph graph = planner::build_step_graph(c.model, layout.graph_layout(chunk));
    ops += graph.ops.size();
    char head[200];
    std::snprintf(head, sizeof head, "\nvirtual stage %d (blocks %d..%d), %d micro-batch(es) in flight:\n",
                  chunk.virtual_stage, chunk.stage.layer_begin, chunk.stage.layer_end - 1, chunk.slots);
    tables += head + planner::format_profile(graph, layout, hw, c.model.fused_attention);
  }
  const planner::MemoryPrediction memory = planner::predict_memory(c.model, layout);
  const planner::TimePrediction time = planner::predict_time(c.model, layout, hw);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (inv.rank != 0) return 0;
  std::printf("symbolic step of pipeline rank %ld: micro-batch %d x %d tokens, %d micro-batches, "
              "tensor %d%s, sequence %d, data %d (ZeRO %d); %zu ops costed in %.2f ms\n"
              "hardware: %s (%d thread(s) per rank)\nactivation checkpointing: %s\n%s",
              stage, c.train.micro_batch, c.train.seq_len, layout.micro_batches, p.tensor,
              p.sequence_split ? " (sequence_split)" : "", p.sequence, p.data, p.zero_stage, ops, ms,
              hw.name.c_str(), threads, plan.description.c_str(), tables.c_str());
  if (c.fused_attention_auto) {
    std::printf("\nmodel.fused_attention: auto: profiled with the dense attention (--evaluate "
                "chooses as colossal_train does; --set model.fused_attention=true profiles the "
                "fused one)\n");
  }
  std::printf("\npredicted memory per rank: %s\n", memory.format().c_str());
  std::printf("predicted step: %.4f s = compute %.4f (recompute %.4f) + layer collectives %.4f + "
              "pipeline sends %.4f + bubble %.4f + gradient reduction %.4f (of which %.4f hidden "
              "under compute, not counted) + optimizer %.4f\n",
              time.step, time.compute, time.recompute, time.tensor_comm, time.pipeline_comm,
              time.bubble, time.data_comm, time.hidden_comm, time.optimizer);
  const double tokens = double(c.train.global_batch) * c.train.seq_len;
  std::printf("predicted throughput: %.0f tokens/s, %.2f TFLOP/s per rank (MFU %.1f%% of %.3g "
              "TFLOP/s)\n",
              tokens / time.step, time.flops / time.step / 1e12,
              100.0 * time.flops / time.step / hw.peak_flops(layout.bf16_products),
              hw.peak_flops(layout.bf16_products) / 1e12);
  return 0;
}

// --gpus, else hardware.gpus, else the ranks the config's sizes need.
int planned_devices(const apps::Invocation& inv) {
  const std::string text = inv.flag("--gpus");
  if (!text.empty()) {
    char* end = nullptr;
    const long n = std::strtol(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0' || n < 1 || n > 1000000) {
      throw apps::UsageError("--gpus: '" + text + "' must be an integer in [1, 1000000]");
    }
    return int(n);
  }
  if (inv.config.hardware.gpus > 0) return inv.config.hardware.gpus;
  return inv.config.parallel.world_size();
}

void write_plan_config(const apps::Invocation& inv, const planner::Plan& plan,
                       const std::string& path) {
  std::vector<std::string> sets = planner::plan_overrides(plan);
  sets.insert(sets.begin(), "parallel.mode=manual");
  // The precision planned (--precision may differ from the file's).
  sets.push_back(std::string("train.precision=") + (plan.run.bf16_products ? "bf16" : "fp32"));
  const io::Config planned = io::parse_config(inv.config.text, inv.config.source, sets,
                                              io::ParseOptions{.require_data = false});
  const std::string tmp = path + ".tmp";
  const std::string text = io::to_yaml(planned);
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool written = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int error = errno;
  if (f != nullptr && std::fclose(f) != 0 && written) {  // a full disk shows at the flush
    written = false;
    error = errno;
  }
  if (!written) {
    std::remove(tmp.c_str());
    throw std::runtime_error("--emit-yaml: cannot write '" + tmp + "': " + std::strerror(error));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    throw std::runtime_error("--emit-yaml: cannot rename '" + tmp + "' to '" + path +
                             "': " + std::strerror(errno));
  }
}

// The layout the config fixes, predicted (--evaluate), or the search's best plans.
int plan(apps::Invocation& inv) {
  const io::Config c = planned_config(inv);
  const int devices = planned_devices(inv);
  // A host spec plans ranks on this machine: each gets the threads colossal_train would give it
  // (its cores over the ranks), and where ranks outnumber the cores they share them.
  planner::HardwareSpec hw = chosen_hardware(inv, 0);
  int cores = 0;
  if (hw.threads > 0) {
    cores = core::current_thread_plan().node_cores;
    hw = planner::scaled_to_threads(hw, std::max(1, cores / devices));
  }
  // Ranks that outnumber the cores evenly are pinned round-robin by colossal_train (started
  // unbound, as mpirun --oversubscribe starts them).
  const planner::Cluster cluster = apps::make_cluster(
      hw, devices, cores, hw.threads > 0 && core::pins_ranks_to_cores(devices, cores));
  const bool json = inv.has("--json");
  const std::string emit = inv.flag("--emit-yaml");
  if (!emit.empty()) check_writable(inv, emit, "--emit-yaml");
  int top = 5;
  if (const std::string t = inv.flag("--top"); !t.empty()) {
    char* end = nullptr;
    top = int(std::strtol(t.c_str(), &end, 10));
    if (end == t.c_str() || *end != '\0' || top < 1 || top > 100) {
      throw apps::UsageError("--top: '" + t + "' must be an integer in [1, 100]");
    }
  }
  planner::Plan chosen;
  std::string text;
  if (inv.has("--evaluate")) {
    const planner::RunLayout run = planned_run(c, cluster.hw);
    if (run.world() != devices) {
      throw apps::UsageError("--evaluate: the config's layout uses " + std::to_string(run.world()) +
                             " devices but " + std::to_string(devices) +
                             " are planned for; drop --gpus / hardware.gpus or change the sizes");
    }
    // model.fused_attention: auto: the faster attention that fits, as colossal_train decides.
    // The attention the plan's precision can run (--precision, like the search).
    const bool dense_only =
        !apps::fused_attention_unavailable(c).empty() ||
        !core::fused_attention_unsupported(
             c.model.hidden / c.model.heads,
             bf16(inv) && c.parallel.tensor_mode == core::TensorMode::d1)
             .empty();
    const auto& cp = c.checkpointing;
    const double budget = cp.memory_budget * 1024.0 * 1024.0 * 1024.0;
    chosen = c.fused_attention_auto
                 ? planner::evaluate_attention_choice(c.model, run, cluster, dense_only, nullptr,
                                                      cp.policy, cp.every, cp.blocks, budget)
                 : planner::evaluate_plan(c.model, run, cluster, cp.policy, cp.every, cp.blocks,
                                          budget);
    if (!chosen.why.empty() && chosen.step_time == 0.0) {
      throw apps::UsageError("--evaluate: the config's layout is not valid: " + chosen.why);
    }
    text = "the config's layout on " + std::to_string(devices) + " x " + cluster.hw.name + " (" +
           core::format_bytes(cluster.hw.memory_bytes) + " each):\n        " +
           planner::format_plan(chosen) +
           (chosen.fits ? "" : "    does not fit: " + chosen.why + "\n");
  } else {
    planner::SearchOptions options;
    options.top = top;
    options.bucket_mb = c.parallel.bucket_mb;
    options.bf16_reduce = c.parallel.bf16_grad_reduce();
    const planner::RunLayout run = planned_run(c, cluster.hw);  // as parallel.mode: auto
    options.bf16_weight_copy = run.bf16_weight_copy;
    options.bf16_products = run.bf16_products;
    options.device = run.device;
    // model.fused_attention: auto: the search costs each layout with either attention.
    options.try_fused_attention = c.fused_attention_auto;
    options.fused_attention_1d =
        core::fused_attention_unsupported(c.model.hidden / c.model.heads, bf16(inv)).empty();
    const planner::SearchResult result = planner::search_plans(
        c.model, c.train.global_batch, c.train.seq_len, /*bf16=*/false, cluster, options);
    if (result.candidates == 0) {
      throw io::ConfigError(planner::why_no_layout(c.model, c.train.global_batch, c.train.seq_len,
                                                   false, cluster, options));
    }
    if (result.best.empty()) {
      throw io::ConfigError(
          "no layout of " + std::to_string(devices) + (devices == 1 ? " device" : " devices") +
          " fits the model (" +
          std::to_string(c.model.layers) + " layers, hidden " + std::to_string(c.model.hidden) +
          ", " + format_parameters(double(core::parameter_count(c.model))) + " parameters) in " +
          core::format_bytes(cluster.hw.memory_bytes) + " per device (" +
          std::to_string(result.candidates) + " layouts tried); the closest needs " +
          core::format_bytes(result.closest.memory.device()) + " per device: " +
          planner::format_plan(result.closest) +
          (result.closest.device_fits ? "    but " + result.closest.why + "\n" : "") +
          "use more devices (--gpus), a device with more memory (--hardware), or a smaller "
          "train.global_batch / train.seq_len");
    }
    chosen = result.best.front();
    text = planner::format_search(result, cluster);
  }
  if (inv.rank != 0) return 0;
  if (json) {
    std::printf("%s\n", planner::plan_json(chosen).c_str());
  } else {
    std::printf("%s\nas config blocks:\n%s", text.c_str(), planner::plan_yaml(chosen).c_str());
  }
  if (!emit.empty()) {
    write_plan_config(inv, chosen, emit);
    if (!json) std::printf("\nwritten to %s (run it with colossal_train %s)\n", emit.c_str(), emit.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  apps::ProgramInfo info{
      "colossal_plan",
      "usage: colossal_plan CONFIG [--gpus N] [--hardware NAME|FILE] [--top K] [--json]\n"
      "                    [--emit-yaml FILE] [--set KEY=VALUE ...]\n"
      "       colossal_plan CONFIG --evaluate [--hardware NAME|FILE] [--json] [--set ...]\n"
      "       colossal_plan CONFIG --profile [--stage S] [--hardware NAME|FILE] [--set ...]\n"
      "       colossal_plan --calibrate [--out FILE]        (under mpirun -np 2 to measure the link)\n\n"
      "Without a mode: the joint planner. Searches data x tensor x sequence x pipeline layouts\n"
      "(tensor inside a node), the pipeline partition and schedule (1F1B, interleaved chunks),\n"
      "the micro-batch size, ZeRO stage and offload, with each pipeline rank's activation\n"
      "checkpointing (none, or rotor under the device memory), for N devices of the hardware\n"
      "(--gpus, else hardware.gpus, else the config's ranks; --hardware, else hardware.*), and\n"
      "prints the best plans with predicted step time, TFLOP/s per device, MFU and memory, and\n"
      "why the runner-ups lost. --emit-yaml writes the config with the best plan filled in.\n"
      "--evaluate predicts the layout the config fixes instead. --json prints the plan and its\n"
      "prediction as JSON.\n\n"
      "--profile builds the symbolic graph of one micro-batch of the config's model and layout as\n"
      "seen by one rank (tensor rank 0, pipeline rank S) and prints every op of forward and\n"
      "backward: FLOPs, bytes moved, activation bytes kept, predicted time (roofline from the\n"
      "hardware spec) and collectives; then the predicted memory per rank by category (what\n"
      "colossal_train's tracker will count) and the predicted step time. Nothing is allocated; no\n"
      "kernel runs. checkpointing.policy is solved as colossal_train would.\n\n"
      "--calibrate measures this host with the real kernels as training runs them (linear\n"
      "layers' forward and backward in fp32 and bf16, each attention form on a grid of sequence\n"
      "lengths and head widths, a block's layernorm and GELU, AdamW, and with 2+ ranks the link\n"
      "between ranks 0 and 1; about half a minute) and writes a hardware YAML for\n"
      "hardware.file or --hardware. Built for CUDA it measures the GPU\n"
      "node: the kernels on the device, its memory, the host link (pinned copies), the host's\n"
      "AdamW (ZeRO offload) and, with 2+ ranks, all-reduces over the trainer's transport (NCCL at\n"
      "one rank per GPU); run one rank per GPU of the node.\n\n"
      "Program options:\n"
      "  --gpus N               devices to plan for\n"
      "  --top K                plans to print (default 5)\n"
      "  --precision P          fp32 or bf16: train.precision to plan (default the config's),\n"
      "                         as colossal_train runs it (fp32 weights and optimizer states)\n"
      "  --evaluate             predict the config's own layout instead of searching\n"
      "  --json                 the chosen plan and its prediction as JSON\n"
      "  --emit-yaml FILE       write the config with the chosen plan as its parallel: and\n"
      "                         checkpointing: blocks\n"
      "  --profile              the per-op table, memory and step-time prediction\n"
      "  --stage S              the pipeline rank to describe (0 .. parallel.pipeline.size-1)\n"
      "  --hardware NAME|FILE   a preset (host, a100-40g, a100-80g, h100, h200, v100) or a file\n"
      "  --calibrate            measure this host and write its hardware YAML\n"
      "  --out FILE             where --calibrate writes (default hardware-host.yaml)\n",
      {"--stage", "--hardware", "--out", "--gpus", "--top", "--emit-yaml", "--precision"},
      {"--profile", "--calibrate", "--evaluate", "--json"},
      /*print_threads=*/false,
      /*any_world_size=*/true,
      /*config_optional_with=*/{"--calibrate"},
      /*slurm_run_dir=*/false,
      /*needs_data=*/false};  // planning reads no data: data.path may be left out
  return apps::run_program(argc, argv, info, [](apps::Invocation& inv) {
    if (inv.has("--calibrate")) return calibrate(inv);
    if (inv.has("--profile")) return profile(inv);
    return plan(inv);
  });
}
