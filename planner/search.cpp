#include "planner/search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/optimizer.hpp"
#include "core/tensor_mode.hpp"
#include "parallel/stage_partition.hpp"

namespace colossal::planner {

namespace {

// In increasing order, in O(sqrt n).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int i = 1; int64_t(i) * i <= n; ++i) {
    if (n % i != 0) continue;
    low.push_back(i);
    if (i != n / i) high.push_back(n / i);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// Blocks per virtual stage balancing forward FLOPs per token: the trainer's default split.
std::vector<int> balanced_layers(const core::ModelSpec& spec, const RunLayout& run) {
  return parallel::balanced_stage_layers(spec, run.seq_len, run.pipeline * run.chunks);
}

// What makes a layout's pipeline impossible (as the config requires); empty when possible.
std::string invalid_pipeline(const core::ModelSpec& spec, const RunLayout& r) {
  if (r.pipeline * r.chunks > spec.layers) return "more virtual stages than layers";
  if (r.schedule == parallel::PipelineSchedule::interleaved &&
      r.micro_batches() % r.pipeline != 0) {
    return "interleaved needs micro-batches per rank a multiple of the stages";
  }
  if (r.pipeline > 1 && r.schedule == parallel::PipelineSchedule::one_f_one_b &&
      r.micro_batches() < r.pipeline) {
    return "1f1b needs at least one micro-batch per stage";
  }
  return "";
}

// What makes a layout impossible before costing it; empty when it is possible.
std::string invalid(const core::ModelSpec& spec, const RunLayout& r) {
  if (spec.heads % r.tensor != 0 || spec.ffn_hidden % r.tensor != 0) {
    return "tensor " + std::to_string(r.tensor) + " does not divide heads and MLP width";
  }
  if (spec.llama() && spec.key_value_heads() % r.tensor != 0) {
    return "tensor " + std::to_string(r.tensor) + " does not divide the key/value heads";
  }
  if (r.seq_len % r.sequence != 0) return "sequence does not divide the sequence length";
  if (r.sequence > 1 && spec.fused_attention) return "ring attention needs unfused attention";
  if (r.sequence_split && (r.tensor == 1 || r.seq_len % r.tensor != 0)) {
    return "sequence_split needs tensor > 1 dividing the sequence length";
  }
  if (r.global_batch % (r.micro_batch * r.data) != 0) {
    return "global batch not a multiple of data x micro-batch";
  }
  if (std::string why = invalid_pipeline(spec, r); !why.empty()) return why;
  // (ZeRO on one data rank without offload shards nothing but runs: the search skips it,
  // colossal_plan --evaluate and model.fused_attention: auto cost it.)
  if (r.offload_optimizer && r.zero_stage == 0) return "offload needs ZeRO";
  if (r.offload_params && (r.zero_stage != 3 || r.tensor_mode != core::TensorMode::d1 ||
                           !r.offload_optimizer || r.offload_fraction < 1.0)) {
    return "parameter offload needs ZeRO 3 in 1d with every optimizer chunk offloaded";
  }
  return "";
}

std::string bytes_text(double b) { return core::format_bytes(b); }

// The grid side of a 2d / 2.5d / 3d layout (0 when the tensor size has no such shape).
int grid_side(const RunLayout& r) { return planner::grid_side(r.tensor_mode, r.tensor, r.depth); }

// What makes a 2d / 2.5d / 3d layout impossible (the checks of io/config.cpp); empty if none.
std::string invalid_tensor_mode(const core::ModelSpec& spec, const RunLayout& r) {
  const int q = grid_side(r);
  const std::string mode = core::tensor_mode_name(r.tensor_mode);
  if (spec.llama()) return mode + " runs gpt2 and opt only, not llama";
  if (q == 0) return "tensor " + std::to_string(r.tensor) + " is not a " + mode + " grid";
  const int width = core::tensor_grid_multiple(r.tensor_mode, q);
  if (spec.heads % q != 0 || spec.hidden % width != 0 || spec.ffn_hidden % width != 0 ||
      r.micro_batch % width != 0) {
    return mode + " needs heads, hidden, MLP width and micro-batch divisible by the grid";
  }
  if (r.sequence > 1 || r.sequence_split || r.zero_stage > 2 || r.bf16) {
    return mode + " runs without sequence, ZeRO 3 and bf16 activations";
  }
  if (r.offload_optimizer && r.zero_stage == 0) return "offload needs ZeRO";
  if (r.offload_params) return mode + " offloads no parameters (ZeRO 3 runs in 1d only)";
  if (std::string why = invalid_pipeline(spec, r); !why.empty()) return why;
  const int depth = core::tensor_depth(r.tensor_mode, r.depth);
  if (r.global_batch % (r.micro_batch * r.data * depth) != 0) {
    return "global batch not a multiple of data x depth x micro-batch";
  }
  return "";
}


// The rank layout of a 2d / 2.5d / 3d run on pipeline stage `stage` (every rank of a stage's
// grid holds the same share).
RankLayout grid_rank_layout(const core::ModelSpec& spec, RunLayout r, int stage = 0) {
  if (r.layers.empty()) r.layers = r.pipeline == 1 ? std::vector<int>{spec.layers}
                                                   : balanced_layers(spec, r);
  return rank_layout(r, stage);
}

// The host side of a plan whose ranks offload at most `offloaded` bytes each: a node's ranks
// share its host memory. A CPU rank has no host link: there the offloaded bytes count against
// the device's (the host's) memory already.
void check_host_memory(Plan& plan, double offloaded, const Cluster& cluster) {
  const HardwareSpec& hw = cluster.hw;
  plan.device_fits = plan.fits;
  if (hw.host_link_bandwidth <= 0.0 || offloaded <= 0.0) return;
  const int ranks = std::max(1, std::min(cluster.devices, hw.devices_per_node));
  plan.host_bytes = offloaded * ranks;
  if (hw.host_memory_bytes <= 0.0 || plan.host_bytes <= hw.host_memory_bytes) return;
  if (plan.fits) {
    plan.why = "its " + std::to_string(ranks) + " rank(s) per node offload " +
               bytes_text(plan.host_bytes) + " to the host, which has " +
               bytes_text(hw.host_memory_bytes) + " (host_memory_gib)";
  }
  plan.fits = false;
}

}  // namespace

Plan evaluate_plan(const core::ModelSpec& spec, RunLayout run, const Cluster& cluster,
                   std::optional<core::CheckpointPolicy> policy, int every,
                   const std::vector<int>& blocks,
                   double budget_bytes, int memory_slots) {
  Plan plan;
  const HardwareSpec& hw = cluster.hw;
  if (run.layers.empty() && run.pipeline * run.chunks <= spec.layers) {
    run.layers = balanced_layers(spec, run);
  }
  plan.run = run;
  plan.fused_attention = spec.fused_attention;
  plan.why = run.tensor_mode == core::TensorMode::d1 ? invalid(spec, run)
                                                     : invalid_tensor_mode(spec, run);
  if (!plan.why.empty()) return plan;
  if (run.world() != cluster.devices) {
    plan.why = "uses " + std::to_string(run.world()) + " devices of " +
               std::to_string(cluster.devices);
    return plan;
  }
  if (run.tensor_mode != core::TensorMode::d1) {
    // Every rank of a 2d / 2.5d / 3d layout (of one pipeline stage) holds the same share: one
    // prediction per stage; the plan takes the largest memory and the longest step. Checkpointing
    // as in 1d (auto: rotor when keeping everything does not fit on some stage), over whole
    // blocks.
    using core::CheckpointPolicy;
    std::vector<RankLayout> stages;
    double largest = 0.0;
    for (int stage = 0; stage < run.pipeline; ++stage) {
      stages.push_back(grid_rank_layout(spec, run, stage));
      largest = std::max(largest, predict_memory(spec, stages.back()).against(hw));
    }
    plan.policy = policy.value_or(largest <= hw.memory_bytes ? CheckpointPolicy::none
                                                             : CheckpointPolicy::rotor);
    plan.budget_bytes = budget_bytes > 0 ? budget_bytes : hw.memory_bytes;
    plan.fits = true;
    double busy = 0.0, minimum = 0.0, offloaded = 0.0;
    for (std::size_t stage = 0; stage < stages.size(); ++stage) {
      RankLayout& l = stages[stage];
      const CheckpointPlan cp = plan_checkpointing(spec, l, hw, plan.policy, plan.budget_bytes,
                                                   every, blocks, memory_slots);
      l.keep = cp.keep;
      l.selective = cp.selective;
      const MemoryPrediction m = predict_memory(spec, l);
      const TimePrediction t = predict_time(spec, l, hw);
      if (stage == 0 || m.against(hw) > plan.memory.against(hw)) plan.memory = m;
      if (stage == 0 || t.step > plan.time.step) plan.time = t;
      busy += busy_seconds(t);
      const std::string who = run.pipeline > 1 ? "stage " + std::to_string(stage) : "every rank";
      plan.schedules.push_back(plan.policy == CheckpointPolicy::none
                                   ? who + ": keep everything"
                                   : who + ": " + cp.description);
      if (!cp.feasible) minimum = std::max(minimum, cp.minimum_bytes);
      plan.fits = plan.fits && cp.feasible && m.against(hw) <= hw.memory_bytes;
      offloaded = std::max(offloaded, m[core::MemCategory::offloaded]);
    }
    if (cluster.oversubscribed()) {  // each stage's ranks take turns with the others' on the cores
      share_cores(plan.time, busy / run.pipeline * cluster.devices * cluster.threads(),
                  cluster.cores);
    }
    if (!plan.fits) {
      plan.why = "needs " +
                 bytes_text(minimum > 0 ? std::max(minimum, plan.memory.against(hw))
                                        : plan.memory.against(hw)) +
                 " of " + bytes_text(hw.memory_bytes);
    }
    check_host_memory(plan, offloaded, cluster);
    if (plan.policy != CheckpointPolicy::rotor) plan.budget_bytes = 0.0;
    plan.step_time = plan.time.step;
    const double tokens = double(run.global_batch) * run.seq_len;
    plan.tokens_per_s = tokens / plan.step_time;
    plan.tflops_per_device = core::flops_per_token(spec, run.seq_len) * tokens / plan.step_time /
                             cluster.devices / 1e12;
    plan.mfu = plan.tflops_per_device * 1e12 / hw.peak_flops(run.bf16);
    return plan;
  }
  const double memory = hw.memory_bytes;
  // The ranks that decide: the first (most micro-batches in flight, embeddings), the last (LM
  // head) and the one with the most blocks; every rank where they share cores (their work adds).
  std::vector<int> ranks{0};
  if (cluster.oversubscribed()) {
    for (int r = 1; r < run.pipeline; ++r) ranks.push_back(r);
  } else if (run.pipeline > 1) {
    // Blocks per rank: virtual stage c * pipeline + r belongs to rank r.
    std::vector<int> blocks(std::size_t(run.pipeline), 0);
    for (std::size_t v = 0; v < run.layers.size(); ++v) blocks[v % std::size_t(run.pipeline)] += run.layers[v];
    ranks.push_back(int(std::max_element(blocks.begin(), blocks.end()) - blocks.begin()));
    ranks.push_back(run.pipeline - 1);
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  }
  plan.fits = true;
  using core::CheckpointPolicy;
  plan.policy = policy.value_or(CheckpointPolicy::none);
  plan.budget_bytes = budget_bytes > 0 ? budget_bytes : memory;
  std::vector<TimePrediction> stage_times;  // per pipeline rank, when they all are costed
  double offloaded = 0.0;                   // the most any costed rank moves to the host
  for (int r : ranks) {
    RankLayout l = rank_layout(run, r);
    CheckpointPolicy chosen = plan.policy;
    if (!policy) {  // auto
      chosen = predict_memory(spec, l).against(hw) <= memory ? CheckpointPolicy::none
                                                             : CheckpointPolicy::rotor;
      if (chosen == CheckpointPolicy::rotor) plan.policy = CheckpointPolicy::rotor;
    }
    const CheckpointPlan cp =
        plan_checkpointing(spec, l, hw, chosen, plan.budget_bytes, every, blocks, memory_slots);
    l.keep = cp.keep;
    l.selective = cp.selective;
    const MemoryPrediction m = predict_memory(spec, l);
    const TimePrediction t = predict_time(spec, l, hw);
    plan.schedules.push_back("rank " + std::to_string(r) + ": " + cp.description);
    if (!cp.feasible || m.against(hw) > memory) {
      plan.fits = false;
      plan.why = "pipeline rank " + std::to_string(r) + " needs " +
                 bytes_text(cp.feasible ? m.against(hw) : cp.minimum_bytes) + " of " +
                 bytes_text(memory);
    }
    if (m.against(hw) > plan.memory.against(hw)) plan.memory = m;
    if (t.step > plan.time.step) plan.time = t;
    stage_times.push_back(t);
    offloaded = std::max(offloaded, m[core::MemCategory::offloaded]);
  }
  check_host_memory(plan, offloaded, cluster);
  if (cluster.oversubscribed()) {
    const int nodes = std::max(1, cluster.nodes);
    const SharedCoresLayout shared{run.data,          run.tensor,   run.sequence,
                                   run.pipeline,      run.chunks,   run.micro_batches(),
                                   run.schedule,      cluster.cores / nodes,
                                   cluster.devices / nodes,         cluster.threads(),
                                   cluster.pinned};
    share_node_cores(plan.time, shared, stage_times);
  }
  if (plan.policy != CheckpointPolicy::rotor) plan.budget_bytes = 0.0;
  plan.step_time = plan.time.step;
  const double tokens = double(run.global_batch) * run.seq_len;
  plan.tokens_per_s = tokens / plan.step_time;
  plan.tflops_per_device =
      core::flops_per_token(spec, run.seq_len) * tokens / plan.step_time / cluster.devices / 1e12;
  plan.mfu = plan.tflops_per_device * 1e12 / hw.peak_flops(run.bf16);
  return plan;
}

Plan evaluate_attention_choice(core::ModelSpec spec, const RunLayout& run, const Cluster& cluster,
                               bool dense_only, Plan* other,
                               std::optional<core::CheckpointPolicy> policy, int every,
                               const std::vector<int>& blocks, double budget_bytes,
                               int memory_slots) {
  return evaluate_attention_choice(
      std::move(spec), [&](bool) { return run; }, cluster, dense_only, other, policy, every,
      blocks, budget_bytes, memory_slots);
}

Plan evaluate_attention_choice(core::ModelSpec spec,
                               const std::function<RunLayout(bool fused)>& run_for,
                               const Cluster& cluster, bool dense_only, Plan* other,
                               std::optional<core::CheckpointPolicy> policy, int every,
                               const std::vector<int>& blocks, double budget_bytes,
                               int memory_slots) {
  auto cost = [&](bool fused) {
    spec.fused_attention = fused;
    return evaluate_plan(spec, run_for(fused), cluster, policy, every, blocks, budget_bytes,
                         memory_slots);
  };
  Plan dense = cost(false), fused;
  // An invalid layout is invalid with either attention; ring attention runs the dense one only
  // (the caller says so: `dense_only`).
  if (!dense_only && dense.step_time > 0.0) fused = cost(true);
  const bool take_fused = &pick_attention(dense, fused, cluster.hw) == &fused;
  if (other != nullptr) *other = take_fused ? dense : fused;
  return take_fused ? fused : dense;
}

const Plan& pick_attention(const Plan& dense, const Plan& fused, const HardwareSpec& hw) {
  if (fused.step_time == 0.0) return dense;
  if (dense.step_time == 0.0) return fused;
  if (dense.fits != fused.fits) return dense.fits ? dense : fused;
  if (dense.fits && fused.step_time != dense.step_time) {
    return fused.step_time < dense.step_time ? fused : dense;
  }
  return fused.memory.against(hw) < dense.memory.against(hw) ? fused : dense;
}

SearchResult search_plans(const core::ModelSpec& spec, int global_batch, int seq_len, bool bf16,
                          const Cluster& cluster, const SearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SearchResult result;
  const int G = cluster.devices;
  auto better = [&](const Plan& a, const Plan& b) {
    if (a.step_time != b.step_time) return a.step_time < b.step_time;
    return a.memory.against(cluster.hw) < b.memory.against(cluster.hw);
  };
  auto keep_best = [&](const Plan& p) {
    result.best.push_back(p);
    std::sort(result.best.begin(), result.best.end(), better);
    if (int(result.best.size()) > options.top) result.best.pop_back();
  };
  // The slowest plan still kept: a candidate whose lower bound is above it cannot enter.
  auto bar = [&] {
    return int(result.best.size()) < options.top ? INFINITY : result.best.back().step_time;
  };
  // Pass 1: every shape (tensor, sequence, pipeline, micro-batch, split, schedule) with a lower
  // bound on its step time: the slowest rank's compute, layer collectives, sends and bubble with
  // everything kept and no gradient reduction. A ZeRO stage or offload only adds to it, and so does
  // recomputation. Pass 2 costs the shapes in bound order and stops at the first whose bound
  // cannot beat the plans kept.
  struct Shape {
    RunLayout run;
    double bound;
    bool fused = false;  // costed with the fused attention (options.try_fused_attention)
  };
  core::ModelSpec fused_spec = spec;
  fused_spec.fused_attention = true;
  // The attentions each 1d shape, and each grid shape, is costed with (none for 1d where the
  // spec asks for a fused attention the 1d shapes cannot run).
  std::vector<bool> attentions, grid_attentions{spec.fused_attention};
  if (!spec.fused_attention || options.fused_attention_1d) {
    attentions.push_back(spec.fused_attention);
  }
  if (options.try_fused_attention && !spec.fused_attention) {
    if (options.fused_attention_1d) attentions.push_back(true);
    grid_attentions.push_back(true);
  }
  std::vector<Shape> shapes;
  // A shape costed with the fused attention or not: its bound, the slower of its first and last
  // pipeline stage.
  auto add_shape = [&](const RunLayout& run, bool fused) {
    const core::ModelSpec& sp = fused ? fused_spec : spec;
    const int p = run.pipeline;
    double bound = 0.0;
    for (int r : {0, p - 1}) {
      const RankLayout l = run.tensor_mode == core::TensorMode::d1 ? rank_layout(run, r)
                                                                   : grid_rank_layout(sp, run, r);
      const TimePrediction tp = predict_time(sp, l, cluster.hw);
      bound = std::max(bound, tp.compute + tp.tensor_comm + tp.pipeline_comm + tp.bubble);
    }
    shapes.push_back(Shape{run, bound, fused});
  };
  // The fields every candidate sets from the search's arguments and its own sizes.
  auto layout = [&](int micro_batch, int data, int tensor) {
    RunLayout run;
    run.global_batch = global_batch;
    run.micro_batch = micro_batch;
    run.seq_len = seq_len;
    run.bf16 = bf16;
    run.data = data;
    run.tensor = tensor;
    run.bucket_mb = options.bucket_mb;
    run.bf16_reduce = options.bf16_reduce;
    run.bf16_weight_copy = options.bf16_weight_copy;
    run.bf16_products = options.bf16_products;
    run.bf16_operands = options.bf16_products;  // 1d; the grids below store fp32
    run.device = options.device;
    return run;
  };
  for (int t : divisors(G)) {
    if (t > cluster.hw.devices_per_node || spec.heads % t != 0 || spec.ffn_hidden % t != 0) continue;
    if (spec.llama() && spec.key_value_heads() % t != 0) continue;  // whole query groups
    for (int s = 1; s <= options.max_sequence && t * s <= G; s *= 2) {
      if ((G / t) % s != 0 || seq_len % s != 0 || (s > 1 && spec.fused_attention)) continue;
      for (int p : divisors(G / (t * s))) {
        if (p > spec.layers) continue;
        const int d = G / (t * s * p);
        if (global_batch % d != 0) continue;
        for (int b : options.micro_batches) {
          if ((global_batch / d) % b != 0) continue;
          const int m = global_batch / (d * b);
          using parallel::PipelineSchedule;
          std::vector<std::pair<PipelineSchedule, int>> schedules{
              {PipelineSchedule::one_f_one_b, 1}};
          if (p > 1 && m % p == 0) {
            for (int v = 2; v <= options.max_chunks && p * v <= spec.layers; ++v) {
              schedules.emplace_back(PipelineSchedule::interleaved, v);
            }
          }
          for (bool split : {false, true}) {
            if (split && (t == 1 || seq_len % t != 0)) continue;
            for (const auto& [schedule, v] : schedules) {
              RunLayout run = layout(b, d, t);
              run.sequence = s;
              run.pipeline = p;
              run.sequence_split = split;
              run.schedule = schedule;
              run.chunks = v;
              if (!invalid(spec, run).empty()) continue;
              run.layers = balanced_layers(spec, run);
              for (bool fused : attentions) {
                // Ring attention: dense only.
                if (fused && !invalid(fused_spec, run).empty()) continue;
                add_shape(run, fused);
              }
            }
          }
        }
      }
    }
  }
  // 2d, 2.5d and 3d grids inside a node: data parallelism and pipeline stages (1F1B or
  // interleaved) on top (their models run no sequence parallelism or ZeRO 3 yet).
  if (options.tensor_modes && !bf16 && !spec.llama()) {
    for (int t : divisors(G)) {
      if (t < 4 || t > cluster.hw.devices_per_node) continue;
      using core::TensorMode;
      std::vector<std::pair<TensorMode, int>> grids{{TensorMode::d2, 1}, {TensorMode::d3, 1}};
      for (int depth : divisors(t)) {
        if (depth > 1 && depth < t) grids.emplace_back(TensorMode::d2_5, depth);
      }
      for (const auto& [mode, depth] : grids) {
        for (int p : divisors(G / t)) {
          for (int b : options.micro_batches) {
            // 1F1B, and with stages the interleaved schedule over 2 .. max_chunks chunks a rank.
            for (int v = 1; v <= (p > 1 ? options.max_chunks : 1); ++v) {
              RunLayout run = layout(b, G / (t * p), t);
              run.tensor_mode = mode;
              run.bf16_operands = false;
              run.depth = depth;
              run.pipeline = p;
              run.chunks = v;
              if (v > 1) run.schedule = parallel::PipelineSchedule::interleaved;
              if (!invalid_tensor_mode(spec, run).empty()) continue;
              run.layers = balanced_layers(spec, run);
              for (bool fused : grid_attentions) add_shape(run, fused);
            }
          }
        }
      }
    }
  }
  if (options.count_only) {  // whether any layout exists: each shape is at least one candidate
    result.candidates = shapes.size();
    return result;
  }
  std::stable_sort(shapes.begin(), shapes.end(),
                   [](const Shape& a, const Shape& b) { return a.bound < b.bound; });
  for (const Shape& shape : shapes) {
    const bool d1 = shape.run.tensor_mode == core::TensorMode::d1;
    // The ranks ZeRO shards over: 1d's data x sequence ranks; a grid's data ranks (each depth
    // layer of 2.5d / 3d holds its own share of the grid's blocks).
    const int D = d1 ? shape.run.data * shape.run.sequence : shape.run.data;
    // One data rank shards nothing, so there a ZeRO stage only matters for what it offloads:
    // stage 1 the optimizer states, stage 3 (1d) the parameter shard too. The grids' models run
    // ZeRO 1 and 2.
    const int deepest = d1 ? 3 : 2;
    const int top = !options.zero ? 0 : D > 1 ? deepest : options.offload ? (d1 ? 3 : 1) : 0;
    bool zero_fits = false, zero_recomputes = false;  // ZeRO 0 without offload
    for (int z = 0; z <= top; ++z) {
      // One data rank: offload only where ZeRO 0 did not fit, or only by recomputing.
      if (D == 1 && z > 0 && (z == 2 || (zero_fits && !zero_recomputes))) continue;
      // This stage without offload: whether it fit, and whether only by recomputing (rotor). With
      // one data rank ZeRO 0's (the stages shard nothing).
      bool fits_kept = D == 1 && zero_fits, kept_recomputes = D == 1 && zero_recomputes;
      for (bool offload : {false, true}) {
        if (offload && (z == 0 || !options.offload)) continue;
        if (D == 1 && z > 0 && !offload) continue;
        ++result.candidates;
        if (options.prune && shape.bound >= bar()) {
          ++result.pruned;
          continue;
        }
        ++result.evaluated;
        RunLayout run = shape.run;
        run.zero_stage = z;
        run.offload_optimizer = offload;
        auto evaluate = [&](double fraction) {
          run.offload_fraction = fraction;
          ++result.evaluations;
          return evaluate_plan(shape.fused ? fused_spec : spec, run, cluster, std::nullopt, 0, {},
                               0.0, options.memory_slots);
        };
        // The fewest 64ths of each shard's optimizer state the device needs, as offload.policy:
        // auto moves them; each one more needs more of the host's memory.
        auto fewest_optimizer_chunks = [&] {
          return evaluate(core::offload_fraction(core::fewest_offload_chunks(
              [&](int k) { return evaluate(core::offload_fraction(k)).device_fits; })));
        };
        Plan plan = evaluate(1.0);
        bool fewest_chunks = false;  // plan already offloads the fewest chunks the device needs
        if (!plan.device_fits && offload && z == 3 && d1) {
          // Not even with every optimizer chunk on the host: ZeRO 3 can move the parameter
          // shards too, the fewest 64ths of them that fit (as offload.policy: auto does).
          auto with_params = [&](int chunks) {
            run.offload_params = true;
            run.offload_params_fraction = core::offload_fraction(chunks);
            return evaluate(1.0);
          };
          // The device's memory decides the fewest chunks; each one more needs more of the
          // host's, so if the fewest do not fit there, none does.
          plan = with_params(core::kOffloadChunks);  // if not even this fits: the closest
          if (plan.device_fits) {
            plan = with_params(core::fewest_offload_chunks(
                [&](int k) { return with_params(k).device_fits; }));
          }
        } else if (!plan.fits && plan.device_fits && offload) {
          // The device holds it but the host cannot hold every optimizer chunk: the fewest
          // chunks the device needs are the least the host must hold.
          plan = fewest_optimizer_chunks();
          fewest_chunks = true;
        }
        if (!plan.fits) {
          ++result.infeasible;
          if (result.closest.memory.total() == 0.0 ||
              plan.memory.against(cluster.hw) < result.closest.memory.against(cluster.hw)) {
            result.closest = plan;
          }
          continue;
        }
        if (!offload) {
          fits_kept = true;
          kept_recomputes = plan.policy == core::CheckpointPolicy::rotor;
          if (z == 0) std::tie(zero_fits, zero_recomputes) = std::pair(fits_kept, kept_recomputes);
        }
        keep_best(plan);
        // Offload that the memory needs (the stage did not fit without it, or only by
        // recomputing): also the fewest 64ths of each shard's optimizer state that fit, as
        // offload.policy: auto moves them (the device's share updates beside the host's, so
        // fewer is faster on a GPU node).
        if (offload && !fewest_chunks && !run.offload_params && (!fits_kept || kept_recomputes)) {
          const Plan fewer = fewest_optimizer_chunks();
          // Less on the host than all chunks, so it fits there too.
          if (fewer.fits && fewer.run.offload_fraction < 1.0) keep_best(fewer);
        }
      }
    }
  }
  // Why each runner-up lost to the best: its largest extra cost.
  if (!result.best.empty()) {
    const TimePrediction& w = result.best.front().time;
    for (std::size_t i = 1; i < result.best.size(); ++i) {
      const TimePrediction& l = result.best[i].time;
      const std::pair<double, const char*> parts[] = {
          {l.compute - l.recompute - (w.compute - w.recompute), "compute"},
          {l.recompute - w.recompute, "recomputation"},
          {l.tensor_comm - w.tensor_comm, "tensor/sequence collectives"},
          {l.pipeline_comm - w.pipeline_comm, "pipeline sends"},
          {l.bubble - w.bubble, "pipeline bubble"},
          {l.shared_cores - w.shared_cores, "cores shared by more threads than there are"},
          {l.data_comm - l.hidden_comm - (w.data_comm - w.hidden_comm),
           "gradient reduction / ZeRO gathers"},
          {l.optimizer - w.optimizer, "optimizer"}};
      const auto worst = *std::max_element(std::begin(parts), std::end(parts));
      char why[160];
      std::snprintf(why, sizeof why, "%+.1f%% step time, mostly %s (%+.3f s)",
                    100.0 * (l.step / w.step - 1.0), worst.second, worst.first);
      result.best[i].why = why;
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

namespace {
// " + offload", or " + offload 23/64" for a share of each shard's optimizer state; then
// " + params" or " + params 51/64" for the parameter shards.
std::string offload_text(const RunLayout& r) {
  auto share = [](double fraction) {
    return fraction >= 1.0 ? std::string()
                           : " " + std::to_string(core::offload_chunks(fraction)) + "/" +
                                 std::to_string(core::kOffloadChunks);
  };
  return " + offload" + share(r.offload_fraction) +
         (r.offload_params ? " + params" + share(r.offload_params_fraction) : std::string());
}
// The optimizer_fraction and params_fraction keys' values (they read back exactly).
std::string fraction_text(const RunLayout& r) {
  return core::format_number(r.offload_optimizer ? r.offload_fraction : 1.0);
}
std::string params_fraction_text(const RunLayout& r) {
  return core::format_number(r.offload_params ? r.offload_params_fraction : 1.0);
}
}  // namespace

std::string format_plan(const Plan& p) {
  const RunLayout& r = p.run;
  char line[512];
  std::string layers;
  for (int n : r.layers) layers += (layers.empty() ? "" : ",") + std::to_string(n);
  std::snprintf(line, sizeof line,
                "data %d x tensor %d%s%s x sequence %d x pipeline %d (%s%s, layers [%s]) | "
                "micro-batch %d x %d | ZeRO %d%s | checkpointing %s%s",
                r.data, r.tensor, r.sequence_split ? " (split)" : "",
                r.tensor_mode == core::TensorMode::d1 ? ""
                : r.tensor_mode == core::TensorMode::d2_5
                    ? (" (2.5d, depth " + std::to_string(r.depth) + ")").c_str()
                    : (std::string(" (") + core::tensor_mode_name(r.tensor_mode) + ")").c_str(),
                r.sequence, r.pipeline, parallel::pipeline_schedule_name(r.schedule),
                r.chunks > 1 ? (" x" + std::to_string(r.chunks) + " chunks").c_str() : "",
                layers.c_str(), r.micro_batch, r.micro_batches(), r.zero_stage,
                r.offload_optimizer ? offload_text(r).c_str() : "",
                core::checkpoint_policy_name(p.policy),
                p.fused_attention ? " | fused attention" : "");
  std::string out = line;
  char waiting[64] = "";
  if (p.time.shared_cores > 0) {
    std::snprintf(waiting, sizeof waiting, " (%.4f s waiting for cores)", p.time.shared_cores);
  }
  std::snprintf(line, sizeof line,
                "\n    step %.4f s%s, %.0f tokens/s, %.2f TFLOP/s per device, MFU %.1f%%; memory "
                "per device %s\n",
                p.step_time, waiting, p.tokens_per_s, p.tflops_per_device, 100.0 * p.mfu,
                p.memory.format().c_str());
  out += line;
  if (p.host_bytes > 0.0) {
    out += "    host memory per node (its ranks' offloaded bytes): " +
           core::format_bytes(p.host_bytes) + "\n";
  }
  return out;
}

std::string format_search(const SearchResult& r, const Cluster& cluster) {
  std::string out;
  char line[256];
  // The hardware's name may be a hardware file's path: not through the fixed buffer.
  out += "searched " + std::to_string(r.candidates) + " layouts for " +
         std::to_string(cluster.devices) + (cluster.devices == 1 ? " device (" : " devices (") +
         cluster.hw.name + ", " + core::format_bytes(cluster.hw.memory_bytes) + " per device): ";
  std::snprintf(line, sizeof line,
                "%zu costed (%zu predictions, offload shares included), %zu pruned by bounds, "
                "%zu over memory; %.3f s\n\n",
                r.evaluated, r.evaluations, r.pruned, r.infeasible, r.seconds);
  out += line;
  if (cluster.oversubscribed() && cluster.pinned) {
    std::snprintf(line, sizeof line,
                  "%d ranks x %d thread(s) share %d cores, pinned round-robin: each step "
                  "simulated, one rank's piece at a time per core\n\n",
                  cluster.devices, std::max(1, cluster.hw.threads), cluster.cores);
    out += line;
  } else if (cluster.oversubscribed()) {
    std::snprintf(line, sizeof line,
                  "%d ranks x %d thread(s) share %d cores: a step lasts at least the ranks' work "
                  "over the cores\n\n",
                  cluster.devices, std::max(1, cluster.hw.threads), cluster.cores);
    out += line;
  }
  for (std::size_t i = 0; i < r.best.size(); ++i) {
    out += (i == 0 ? "best:   " : "#" + std::to_string(i + 1) + ":     ") + format_plan(r.best[i]);
    if (i > 0) out += "    lost by " + r.best[i].why + "\n";
  }
  return out;
}

std::vector<std::string> plan_overrides(const Plan& p) {
  const RunLayout& r = p.run;
  std::string layers;
  for (int n : r.layers) layers += (layers.empty() ? "" : ", ") + std::to_string(n);
  std::vector<std::string> o = {
      "parallel.data=" + std::to_string(r.data),
      "parallel.tensor.size=" + std::to_string(r.tensor),
      std::string("parallel.tensor.mode=") + core::tensor_mode_name(r.tensor_mode),
      "parallel.tensor.depth=" + std::to_string(core::tensor_depth(r.tensor_mode, r.depth)),
      "parallel.tensor.sequence_split=" + std::string(r.sequence_split ? "true" : "false"),
      "parallel.sequence=" + std::to_string(r.sequence),
      "parallel.pipeline.size=" + std::to_string(r.pipeline),
      std::string("parallel.pipeline.schedule=") +
          parallel::pipeline_schedule_name(r.schedule),
      "parallel.pipeline.chunks=" + std::to_string(r.chunks),
      "parallel.pipeline.layers=[" + (r.pipeline > 1 ? layers : std::string()) + "]",
      "parallel.zero.stage=" + std::to_string(r.zero_stage),
      "parallel.zero.offload.optimizer=" + std::string(r.offload_optimizer ? "true" : "false"),
      "parallel.zero.offload.optimizer_fraction=" +
          fraction_text(r),
      "parallel.zero.offload.params=" + std::string(r.offload_params ? "true" : "false"),
      "parallel.zero.offload.params_fraction=" + params_fraction_text(r),
      "train.micro_batch=" + std::to_string(r.micro_batch),
      std::string("checkpointing.policy=") + core::checkpoint_policy_name(p.policy),
      "model.fused_attention=" + std::string(p.fused_attention ? "true" : "false")};
  if (p.policy == core::CheckpointPolicy::rotor) {
    char budget[64];
    std::snprintf(budget, sizeof budget, "checkpointing.memory_budget=%.6f",
                  p.budget_bytes / (1024.0 * 1024.0 * 1024.0));
    o.push_back(budget);
  }
  return o;
}

std::string plan_yaml(const Plan& p) {
  const RunLayout& r = p.run;
  std::string layers;
  for (int n : r.layers) layers += (layers.empty() ? "" : ", ") + std::to_string(n);
  char text[1024];
  std::snprintf(
      text, sizeof text,
      "parallel:\n  data: %d\n  tensor: {size: %d, mode: %s, depth: %d, sequence_split: %s}\n"
      "  sequence: %d\n"
      "  pipeline: {size: %d, layers: [%s], schedule: %s, chunks: %d}\n"
      "  zero: {stage: %d, offload: {optimizer: %s, optimizer_fraction: %s, params: %s, "
      "params_fraction: %s}}\n"
      "  bucket_mb: %g\n"
      "  grad_reduce: %s\n"
      "checkpointing: {policy: %s%s}\n",
      r.data, r.tensor, core::tensor_mode_name(r.tensor_mode),
      core::tensor_depth(r.tensor_mode, r.depth),
      r.sequence_split ? "true" : "false", r.sequence, r.pipeline,
      r.pipeline > 1 ? layers.c_str() : "", parallel::pipeline_schedule_name(r.schedule), r.chunks,
      r.zero_stage, r.offload_optimizer ? "true" : "false",
      fraction_text(r).c_str(), r.offload_params ? "true" : "false",
      params_fraction_text(r).c_str(), r.bucket_mb,
      r.bf16_reduce ? "bf16" : "fp32",
      core::checkpoint_policy_name(p.policy),
      p.policy == core::CheckpointPolicy::rotor
          ? (", memory_budget: " + std::to_string(p.budget_bytes / (1024.0 * 1024.0 * 1024.0))).c_str()
          : "");
  // The attention is a model: key; the blocks above are parallel: and checkpointing:.
  if (p.fused_attention) return text + std::string("# and in model: fused_attention: true\n");
  return text;
}

std::string plan_json(const Plan& p) {
  const RunLayout& r = p.run;
  std::string layers, schedules;
  for (int n : r.layers) layers += (layers.empty() ? "" : ", ") + std::to_string(n);
  for (const std::string& s : p.schedules) schedules += (schedules.empty() ? "\"" : ", \"") + s + "\"";
  std::string memory;
  for (int c = 0; c < int(core::MemCategory::count); ++c) {
    char item[96];
    std::snprintf(item, sizeof item, "%s\"%s\": %.0f", memory.empty() ? "" : ", ",
                  core::category_name(core::MemCategory(c)), p.memory.bytes[std::size_t(c)]);
    memory += item;
  }
  char text[2048];
  std::snprintf(
      text, sizeof text,
      "{\"layout\": {\"data\": %d, \"tensor\": %d, \"tensor_mode\": \"%s\", \"depth\": %d, "
      "\"sequence_split\": %s, "
      "\"sequence\": %d, \"pipeline\": %d, \"schedule\": \"%s\", \"chunks\": %d, \"layers\": [%s], "
      "\"micro_batch\": %d, \"micro_batches\": %d, \"zero_stage\": %d, \"offload_optimizer\": %s, "
      "\"offload_fraction\": %.17g, "
      "\"offload_params\": %s, \"offload_params_fraction\": %.17g, "
      "\"checkpointing\": \"%s\", \"checkpoint_schedules\": [%s], \"fused_attention\": %s}, "
      "\"prediction\": {\"fits\": %s, \"step_time_s\": %.6g, \"tokens_per_s\": %.6g, "
      "\"tflops_per_device\": %.6g, \"mfu\": %.6g, \"memory_bytes_per_device\": {%s, \"total\": %.0f}, "
      "\"host_bytes_per_node\": %.0f}}",
      r.data, r.tensor, core::tensor_mode_name(r.tensor_mode),
      core::tensor_depth(r.tensor_mode, r.depth),
      r.sequence_split ? "true" : "false", r.sequence, r.pipeline,
      parallel::pipeline_schedule_name(r.schedule), r.chunks, layers.c_str(), r.micro_batch,
      r.micro_batches(), r.zero_stage, r.offload_optimizer ? "true" : "false",
      r.offload_optimizer ? r.offload_fraction : 1.0, r.offload_params ? "true" : "false",
      r.offload_params ? r.offload_params_fraction : 1.0,
      core::checkpoint_policy_name(p.policy), schedules.c_str(),
      p.fused_attention ? "true" : "false", p.fits ? "true" : "false", p.step_time,
      p.tokens_per_s, p.tflops_per_device, p.mfu,
      memory.c_str(), p.memory.total(), p.host_bytes);
  return text;
}

std::string why_no_layout(const core::ModelSpec& spec, int global_batch, int seq_len, bool bf16,
                          const Cluster& cluster, const SearchOptions& options) {
  // A quick necessary test of a device count: some tensor x sequence x pipeline x data = g whose
  // sizes the model takes, or a grid's tensor size (4 or more in a node) dividing it; the
  // search's enumeration (count_only, nothing costed) confirms it below.
  auto splits = [&](int g) {
    for (int t : divisors(g)) {
      if (options.tensor_modes && t >= 4 && t <= cluster.hw.devices_per_node) return true;
      if (t > cluster.hw.devices_per_node || spec.heads % t != 0 || spec.ffn_hidden % t != 0 ||
          (spec.llama() && spec.key_value_heads() % t != 0)) {
        continue;
      }
      for (int s = 1; s <= options.max_sequence && g % (t * s) == 0; s *= 2) {
        if (seq_len % s != 0 || (s > 1 && spec.fused_attention)) continue;
        for (int p : divisors(g / (t * s))) {
          if (p <= spec.layers && global_batch % (g / (t * s * p)) == 0) return true;
        }
      }
    }
    return false;
  };
  const int G = cluster.devices;
  // No layout uses more devices than data (a divisor of the batch) x tensor (within a node) x
  // sequence x pipeline (at most the layers) allow, so the counts tried stop there.
  const int64_t most = int64_t(global_batch) * std::max(1, cluster.hw.devices_per_node) *
                       std::max(1, options.max_sequence) * std::max(1, spec.layers);
  std::vector<int> nearest;
  SearchOptions quick = options;
  quick.count_only = true;
  for (int64_t step = std::max<int64_t>(1, G - most); step < 4 * int64_t(G) && nearest.size() < 2;
       ++step) {
    for (int64_t g : {G - step, G + step}) {
      if (g < 1 || g > most || nearest.size() >= 2 || !splits(int(g))) continue;
      Cluster other = cluster;
      other.devices = int(g);
      if (search_plans(spec, global_batch, seq_len, bf16, other, quick).candidates > 0) {
        nearest.push_back(int(g));
      }
    }
  }
  std::string text =
      "no layout splits " + std::to_string(G) + " devices for this model: they are data x "
      "tensor x pipeline x sequence (or a 2d / 2.5d / 3d grid), where data divides "
      "train.global_batch (" + std::to_string(global_batch) + "), tensor divides the heads (" +
      std::to_string(spec.heads) + ") and model.ffn_hidden (" + std::to_string(spec.ffn_hidden) +
      ")" + (spec.llama() ? " and model.kv_heads (" + std::to_string(spec.key_value_heads()) + ")"
                          : std::string()) +
      " within a node (" + std::to_string(cluster.hw.devices_per_node) +
      " devices), pipeline is at most model.layers (" + std::to_string(spec.layers) +
      ") and sequence a power of 2 up to " + std::to_string(options.max_sequence) +
      " dividing train.seq_len (" + std::to_string(seq_len) + ", and 1 with " +
      "model.fused_attention)";
  if (nearest.empty()) return text;
  std::sort(nearest.begin(), nearest.end());
  text += "; ";
  for (std::size_t i = 0; i < nearest.size(); ++i) {
    text += (i ? " or " : "") + std::to_string(nearest[i]);
  }
  return text + " devices have layouts";
}

}  // namespace colossal::planner
