#include "apps/layout.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "apps/errors.hpp"
#include "apps/on_root.hpp"
#include "apps/memory_fit.hpp"
#include "apps/offload_policy.hpp"
#include "core/gemm.hpp"
#include "core/layers.hpp"
#include "core/host_threads.hpp"
#include "core/kokkos_compat.hpp"
#include "core/memory.hpp"
#include "parallel/stage_partition.hpp"
#include "planner/search.hpp"

namespace colossal::apps {

std::vector<int> pipeline_layers(const io::Config& config) {
  const auto& p = config.parallel;
  if (!p.pipeline_layers.empty()) return p.pipeline_layers;
  // The planner's partition: forward FLOPs per token of the blocks against the LM head.
  return parallel::balanced_stage_layers(config.model, config.train.seq_len,
                                         p.pipeline * p.pipeline_chunks);
}

bool bf16_operands(const io::Config& config) {
  return config.train.precision == core::GemmPrecision::bf16 &&
         config.parallel.tensor_mode == core::TensorMode::d1;
}

planner::RunLayout run_layout(const io::Config& config) {
  const auto& p = config.parallel;
  planner::RunLayout run;
  run.global_batch = config.train.global_batch;
  run.micro_batch = config.train.micro_batch;
  run.seq_len = config.train.seq_len;
  // The layout colossal_train runs. Its train.precision: bf16 rounds matrix-product operands and
  // keeps every array in fp32 but the activations only products read (bf16_operands); the
  // planner's bf16 (colossal_plan --precision bf16) is GPU mixed precision with 2-byte weights
  // and activations.
  run.bf16 = false;
  run.bf16_operands = bf16_operands(config);
  run.bf16_weight_copy =
      core::default_gemm_keeps_copy(config.hardware.gemm, config.train.precision);
  run.bf16_products = config.train.precision == core::GemmPrecision::bf16;
  // The model's logits chunk follows where its memory is (core::Model).
  run.device = core::device_memory_v<Kokkos::DefaultExecutionSpace>;
  run.data = p.data;
  run.tensor = p.tensor;
  run.tensor_mode = p.tensor_mode;
  run.depth = p.tensor_depth;
  run.sequence = p.sequence;
  run.pipeline = p.pipeline;
  run.sequence_split = p.sequence_split;
  run.schedule = p.pipeline_schedule;
  run.chunks = p.pipeline_chunks;
  run.layers = pipeline_layers(config);  // the partition the trainer runs
  run.zero_stage = p.zero_stage;
  run.offload_optimizer = p.offload_optimizer;
  run.offload_params = p.offload_params;
  run.offload_fraction = p.offload_fraction;
  run.offload_params_fraction = p.offload_params_fraction;
  run.bucket_mb = p.bucket_mb;
  run.bf16_reduce = p.bf16_grad_reduce();
  return run;
}

planner::RankLayout rank_layout(const io::Config& config, int pipeline_rank,
                                const std::vector<core::Keep>& keep, bool selective,
                                bool inference, bool decode) {
  planner::RunLayout run = run_layout(config);
  run.inference = inference;
  run.decode = decode && config.parallel.tensor_mode == core::TensorMode::d1;
  return planner::rank_layout(run, pipeline_rank, keep, selective);
}

io::Config inference_config(const io::Config& config) {
  io::Config c = config;
  auto& p = c.parallel;
  const bool sharded = p.zero_stage == 3;
  p.zero_stage = sharded ? 3 : 0;
  p.offload_optimizer = false;
  p.offload_fraction = 1.0;
  p.offload_params = sharded && p.offload_params;
  if (!p.offload_params) p.offload_params_fraction = 1.0;
  p.grad_reduce = "fp32";
  c.checkpointing = io::CheckpointingConfig{};
  return c;
}

ActivationPlan inference_activation_plan(const io::Config& config) {
  std::vector<int> every(std::size_t(config.model.layers));
  for (int b = 0; b < config.model.layers; ++b) every[std::size_t(b)] = b;
  return ActivationPlan{core::keep_blocks(config.model.layers, every), false,
                        "inference: one block's activations at a time"};
}

void predict_rank(const io::Config& config, int pipeline_rank, const ActivationPlan& plan,
                  const planner::HardwareSpec& hw, planner::MemoryPrediction& memory,
                  planner::TimePrediction& time, bool inference, bool decode) {
  // 2d / 2.5d / 3d too: the layout carries the tensor mode, predict_* take the grid forms.
  const planner::RankLayout layout =
      rank_layout(config, pipeline_rank, plan.keep, plan.selective, inference, decode);
  memory = planner::predict_memory(config.model, layout);
  time = planner::predict_time(config.model, layout, hw);
}

void with_host_memory(planner::HardwareSpec& hw, const io::Config& config) {
  if (config.hardware.host_memory_gib > 0) {
    hw.host_memory_bytes = config.hardware.host_memory_gib * 1024.0 * 1024.0 * 1024.0;
  }
}

planner::HardwareSpec hardware_spec(const io::Config& config, int threads) {
  planner::HardwareSpec hw = config.hardware.file.empty()
                                 ? planner::hardware_preset(config.hardware.preset)
                                 : planner::read_hardware(config.hardware.file);
  with_host_memory(hw, config);
  return planner::scaled_to_threads(hw, threads);
}

ActivationPlan activation_plan(const io::Config& config, int pipeline_rank,
                               const planner::HardwareSpec& hw) {
  return activation_plan(config, run_layout(config), pipeline_rank, hw);
}

ActivationPlan activation_plan(const io::Config& config, const planner::RunLayout& run,
                               int pipeline_rank, const planner::HardwareSpec& hw) {
  const auto& c = config.checkpointing;
  const double budget = c.memory_budget * 1024.0 * 1024.0 * 1024.0;
  const planner::CheckpointPlan plan =
      planner::plan_checkpointing(config.model, planner::rank_layout(run, pipeline_rank), hw,
                                  c.policy, budget, c.every, c.blocks);
  if (!plan.feasible) {
    const bool grid = config.parallel.tensor_mode != core::TensorMode::d1;
    const std::string stage = "pipeline stage " + std::to_string(pipeline_rank);
    const std::string who =
        grid ? std::string("every rank of the ") +
                   core::tensor_mode_name(config.parallel.tensor_mode) + " grid" +
                   (config.parallel.pipeline > 1 ? " of " + stage : std::string())
             : stage;
    throw std::runtime_error(
        "checkpointing.memory_budget " + core::format_bytes(budget) + " is below the " +
        core::format_bytes(plan.minimum_bytes) + " that " + who +
        " needs with the least memory any schedule can use (" +
        core::format_bytes(plan.rest_bytes) + " without activations); raise "
        "checkpointing.memory_budget, or shard more (ZeRO, tensor or pipeline parallelism)");
  }
  return ActivationPlan{plan.keep, plan.selective, plan.description};
}

}  // namespace colossal::apps

namespace colossal::apps {

planner::Cluster make_cluster(planner::HardwareSpec hw, int devices, int cores, bool pinned,
                              int nodes) {
  if (hw.threads <= 0) return planner::Cluster{hw, devices};
  hw.memory_bytes /= devices;
  hw.devices_per_node = devices;
  return planner::Cluster{hw, devices, cores, pinned, nodes};
}

namespace {

// The cluster colossal_train's start-up plans for (rank 0): the config's hardware, host rates
// scaled to `threads` per rank, the nodes' cores as the thread decision saw them (mpirun
// --oversubscribe shares them).
planner::Cluster planning_cluster(const io::Config& config, int ranks, int threads) {
  const core::ThreadPlan node = core::current_thread_plan();
  planner::HardwareSpec hw = hardware_spec(config, threads);
  // On GPUs the offloaded bytes go to this node's memory: plan for what it has now, unless
  // hardware.host_memory_gib says otherwise.
  if (device_resident_build() && config.hardware.host_memory_gib <= 0) {
    if (const double available = host_available_bytes(); available > 0) {
      hw.host_memory_bytes = available;
    }
  }
  return make_cluster(hw, ranks, node.node_cores * node.nodes(ranks), node.pinned,
                      node.nodes(ranks));
}

// Whether this build runs the fused attention at the config's head size and precision.
bool fused_attention_runs(const io::Config& config) {
  return core::fused_attention_unsupported(config.model.hidden / config.model.heads,
                                           bf16_operands(config))
      .empty();
}

}  // namespace

std::string fused_attention_unavailable(const io::Config& config) {
  const auto& p = config.parallel;
  if (p.sequence > 1) {
    return "ring attention (parallel.sequence " + std::to_string(p.sequence) +
           ") keeps its rows of the probabilities";
  }
  if (!fused_attention_runs(config)) {
    return "this build's fused attention does not run head size " +
           std::to_string(config.model.hidden / config.model.heads) + " in bf16";
  }
  return "";
}

AttentionDecision decide_attention(const io::Config& config, const planner::Cluster& cluster,
                                   double device, int share) {
  AttentionDecision d;
  d.unavailable = fused_attention_unavailable(config);
  const auto& c = config.checkpointing;
  // Each attention with the offload parallel.zero.offload.policy: auto then chooses for it
  // (apply_offload_policy runs next): a dense attention that fits only by offloading is costed
  // so, not as not fitting.
  auto run_for = [&](bool fused) {
    io::Config v = config;
    v.model.fused_attention = fused;
    v.fused_attention_auto = false;
    if (v.parallel.offload_policy == "auto") {
      try {
        decide_offload(v, device, share).apply(v);
      } catch (const std::invalid_argument&) {
        // Nothing the policy may move is enough: costed as written (it does not fit).
      }
    }
    return run_layout(v);
  };
  planner::Plan other;
  planner::Plan chosen = planner::evaluate_attention_choice(
      config.model, run_for, cluster, !d.unavailable.empty(), &other, c.policy, c.every,
      c.blocks, c.memory_budget * 1024.0 * 1024.0 * 1024.0);
  d.fused = chosen.fused_attention;
  d.dense_plan = std::move(d.fused ? other : chosen);
  d.fused_plan = std::move(d.fused ? chosen : other);
  return d;
}

io::Config plan_attention(const io::Config& config, parallel::Communicator& world, int threads,
                          std::FILE* log) {
  if (!config.fused_attention_auto) return config;
  // What each rank may hold (collective): the GPU's free memory over the ranks sharing it, or
  // hardware.device_memory_gib; on a host build this node's available memory over its ranks.
  int share = 1;
  const double device = device_capacity(config, &share);
  double capacity = device / std::max(1, share);
  int sharers = std::max(1, share);  // the ranks that share the memory of `capacity`
  if (!device_resident_build() && config.hardware.device_memory_gib <= 0) {
    const int locals = std::max(1, core::current_thread_plan().local_ranks);  // on this node
    sharers = locals;
    double mine = 0.0;
    try {
      const double available = host_available_bytes();  // 0: unknown
      // (At least a byte where something was read: 0 means unknown, no limit.)
      if (available > 0) mine = std::max(1.0, available / locals - kRuntimeBytesPerRank);
    } catch (const std::invalid_argument&) {
      mine = 0.0;  // COLOSSAL_HOST_MEMORY_BYTES is bad: check_memory_fits names it next
    }
    double least = mine;
    MPI_Allreduce(&mine, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    capacity = least;
  }
  // 2d / 2.5d / 3d: world rank 0 also holds the whole model while it samples or scores
  // (whole_model_bytes, as check_memory_fits counts it): every rank plans with rank 0's room,
  // the larger of the two attentions' whole model taken off its share of the memory.
  if (capacity > 0) {
    io::Config v = config;
    v.fused_attention_auto = false;
    double whole = 0.0;
    for (bool fused : {false, true}) {
      v.model.fused_attention = fused;
      whole = std::max(whole, whole_model_bytes(v,
                                                device_resident_build() ? MemoryPool::device
                                                                        : MemoryPool::host,
                                                device_resident_build()));
    }
    if (whole > 0) capacity = std::max(1.0, capacity - whole / sharers);
  }
  // decision: "true" or "false", then the report's line.
  const auto decide = [&](std::string&) {
    std::string decision;
    planner::Cluster cluster = planning_cluster(config, world.size(), threads);
    if (capacity > 0) cluster.hw.memory_bytes = capacity;
    const AttentionDecision d = decide_attention(config, cluster, device, share);
    const planner::Plan& chosen = d.fused ? d.fused_plan : d.dense_plan;
    const planner::Plan& other = d.fused ? d.dense_plan : d.fused_plan;
    auto predicted = [&](const planner::Plan& p) {
      char text[160];
      std::snprintf(text, sizeof text, "%.4g s a step, %s a rank%s%s", p.step_time,
                    core::format_bytes(p.memory.against(cluster.hw)).c_str(),
                    p.run.offload_optimizer ? " with offload" : "",
                    p.fits ? "" : ", does not fit");
      return std::string(text);
    };
    decision = std::string(d.fused ? "true\nfused (" : "false\ndense (");
    if (chosen.step_time == 0.0) {  // the planner cannot cost this layout
      decision += "the default; the cost model cannot price this layout: " + chosen.why + ")";
    } else if (!d.unavailable.empty()) {
      decision += d.unavailable + ")";
    } else {
      decision += "predicted " + predicted(chosen) + "; " + (d.fused ? "dense " : "fused ") +
                  predicted(other) + "; " + core::format_bytes(cluster.hw.memory_bytes) +
                  " a rank available)";
    }
    return decision;
  };
  const std::string decision =
      on_root<CollectiveError>(world, "model.fused_attention: auto: ", decide);
  const std::size_t cut = decision.find('\n');
  if (log != nullptr) {
    std::fprintf(log, "attention (model.fused_attention: auto): %s\n",
                 decision.substr(cut + 1).c_str());
  }
  return io::parse_config(config.text, config.source,
                          {"model.fused_attention=" + decision.substr(0, cut)});
}

io::Config plan_automatically(const io::Config& config, parallel::Communicator& world, int threads,
                              std::string* report) {
  const auto search = [&](std::string& error) {
    std::string overrides;
    const planner::Cluster cluster = planning_cluster(config, world.size(), threads);
    // As run_layout describes the trainer's runs: fp32 arrays but (1d) the activations only
    // products read, the products at train.precision's rate, and the weights' bf16 copy where
    // the run's GEMM keeps one.
    planner::SearchOptions options;
    options.bucket_mb = config.parallel.bucket_mb;
    options.bf16_reduce = config.parallel.bf16_grad_reduce();
    const planner::RunLayout run = run_layout(config);
    options.bf16_weight_copy = run.bf16_weight_copy;
    options.bf16_products = run.bf16_products;
    options.device = run.device;
    options.try_fused_attention = config.fused_attention_auto;
    options.fused_attention_1d = fused_attention_runs(config);
    const planner::SearchResult result = planner::search_plans(
        config.model, config.train.global_batch, config.train.seq_len, /*bf16=*/false, cluster,
        options);
    if (result.candidates == 0) {
      error = "parallel.mode: auto: " +
              planner::why_no_layout(config.model, config.train.global_batch,
                                     config.train.seq_len, false, cluster, options) +
              " (start that many ranks)";
    } else if (result.best.empty()) {
      error = "parallel.mode: auto: no layout of " + std::to_string(world.size()) +
              " ranks fits in " + core::format_bytes(cluster.hw.memory_bytes) +
              " per rank; the closest needs " +
              core::format_bytes(result.closest.memory.device()) + " (" +
              planner::format_plan(result.closest) +
              (result.closest.device_fits ? "    it " + result.closest.why + "\n" : "") +
              "); start more ranks, lower train.micro_batch or train.seq_len, or give a larger "
              "memory in hardware.file";
    } else {
      if (report != nullptr) *report = planner::format_search(result, cluster);
      for (const std::string& o : planner::plan_overrides(result.best.front())) {
        overrides += o + "\n";
      }
    }
    return overrides;
  };
  const std::string overrides = on_root<CollectiveError>(world, "parallel.mode: auto: ", search);
  std::vector<std::string> sets{"parallel.mode=manual"};
  std::size_t begin = 0;
  while (begin < overrides.size()) {
    const std::size_t end = overrides.find('\n', begin);
    sets.push_back(overrides.substr(begin, end - begin));
    begin = end + 1;
  }
  return io::parse_config(config.text, config.source, sets);
}

}  // namespace colossal::apps
