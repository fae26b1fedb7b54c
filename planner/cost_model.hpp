// The cost of one rank's training step without running it: memory by category (everything the
// trainer's tracker counts, from closed forms and the step graph) and time (roofline per op from a
// hardware spec, alpha-beta collectives, the pipeline bubble, the optimizer).
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "core/keep.hpp"
#include "core/memory.hpp"
#include "core/tensor_mode.hpp"
#include "core/model_spec.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "planner/hardware.hpp"
#include "planner/step_graph.hpp"

namespace colossal::planner {

// One rank's place in a run: what sets its memory and its step time.
struct RankLayout {
  int micro_batch = 1;
  int seq_len = 1024;            // the whole sequence
  int micro_batches = 1;         // per optimizer step on this rank (gradient accumulation)
  bool bf16 = false;
  bool bf16_operands = false;       // RunLayout::bf16_operands
  // colossal_train's train.precision: bf16 (any tensor mode): the matrix products run at the
  // bf16 GEMM rate (HardwareSpec::gemm_rate), whatever the arrays are stored in. bf16 implies it.
  bool bf16_products = false;
  // The GEMM keeps a bf16 copy of the weights it holds (core::Gemm::keeps_stable_copy: bf16 on
  // cuBLAS or oneDNN): 2 bytes per float of the most any chunk holds at once (its whole flat
  // buffer, or under ZeRO-3 the LM head on the head stage, tensor 1), in the temporaries.
  bool bf16_weight_copy = false;
  bool device = false;              // RunLayout::device
  // Whether the products run at the bf16 GEMM rate (the planner's bf16, or bf16_products).
  bool bf16_gemm() const { return bf16 || bf16_products; }
  int data = 1;                  // data-parallel ranks
  int tensor = 1;
  bool sequence_split = false;
  int sequence = 1;              // ring self-attention ranks
  int pipeline = 1;              // pipeline stages (ranks)
  int zero_stage = 0;
  bool offload_optimizer = false, offload_params = false;
  double offload_fraction = 1.0;  // with offload_optimizer: the share of each shard's
                                  // states on the host (core::offloaded_states)
  double offload_params_fraction = 1.0;  // with offload_params: the share of each stage-3
                                         // parameter shard in host memory
  double bucket_mb = 25.0;       // stages 0-1: gradient all-reduce buckets, MiB (infinity: one)
  bool bf16_reduce = false;      // the data-parallel gradient sums travel as bf16 (a bf16 copy of
                                 // what is in flight: the flat buffer at stages 0-1, the work
                                 // units' at 2-3, which then need no spare)
  std::vector<core::Keep> keep{};  // per op of the whole model (empty: keep all)
  bool selective = false;
  // colossal_eval / colossal_generate (apps::Trainer's inference mode): parameters without
  // gradients, moments or gradient-sync buffers, one activation slot per chunk (rank_layout).
  // The ZeRO fields are then the store's (stage 3 or 0, apps::inference_config), and predict_time
  // is a training step's, not an evaluation's.
  bool inference = false;
  // colossal_generate (apps::TrainerOptions::decode, 1d only): each chunk's incremental-decoding
  // state on top (core::decode_sizes: the key/value cache as activations, the rows' buffers as
  // temporaries).
  bool decode = false;
  // 1d, or a 2d / 2.5d / 3d grid of `tensor` ranks (`depth` 2.5D layers): core::Model2D /
  // Model3D under apps::Trainer (pipeline stages, one chunk a rank or interleaved, no sequence
  // parallelism; ZeRO 0-2, the optimizer offloaded or not; activation checkpointing read at
  // block granularity over the stage's blocks: sharded::stage_recompute), each chunk's stage
  // and slots from `chunks` (a model each: their bytes and times add up). predict_memory and
  // predict_time then take the grid's closed forms: memory by category exactly as the models allocate it (next to the models; dropped
  // blocks leave the activations, the arena and selective's buffer join the temporaries), time
  // the model FLOPs over the q^2 (q^3) ranks of a grid (cube) at the GEMM rate of one local MLP
  // product and the attention rate, the memory-bound kernels at the memory bandwidth, every
  // collective of the models' closed forms as a ring (broadcasts as pipelined trees) on the link
  // that spans the tensor group, the gradient reduction over the data ranks (and the depth),
  // recomputation and AdamW; with stages, the stage's blocks (the head on the last), the
  // boundary sends, the fill-and-drain bubble and the tied embedding's sum. micro_batch is per
  // depth layer, micro_batches per step.
  core::TensorMode tensor_mode = core::TensorMode::d1;
  int depth = 1;
  int grid_side() const;  // q of the grid (1 in 1d; 0 when `tensor` is not such a grid)
  // The model chunks this rank runs (one, or several under the interleaved schedule).
  struct Chunk {
    core::StageRange stage{};
    int virtual_stage = 0;
    int slots = 1;               // micro-batches in flight (the schedule's peak)
    // In the chunk's schedule: backwards right after a forward (F B) and forwards right after a
    // backward (B F). ZeRO-3 keeps the unit a pass ended on in its buffer, so there the next
    // pass finds it (the top unit at F B, the first block at B F). -1: one stage's
    // F B F B ... (micro_batches and micro_batches - 1).
    int forward_turns = -1, backward_turns = -1;
  };
  std::vector<Chunk> chunks{Chunk{}};
  // The step graph of one chunk's micro-batch.
  Layout graph_layout(const Chunk& chunk) const;
};

// The side q of a 2d / 2.5d / 3d grid of `tensor` ranks (`depth` 2.5D layers); 0 when `tensor`
// has no such shape.
int grid_side(core::TensorMode mode, int tensor, int depth);

struct MemoryPrediction {
  std::array<double, int(core::MemCategory::count)> bytes{};
  double total() const;
  double device() const;  // all but the offloaded (host) bytes
  // The bytes that count against hw.memory_bytes: device() where the device has a host link of
  // its own (a GPU: offloaded bytes live elsewhere), total() where the device is the host.
  double against(const HardwareSpec& hw) const;
  double& operator[](core::MemCategory c) { return bytes[std::size_t(c)]; }
  double operator[](core::MemCategory c) const { return bytes[std::size_t(c)]; }
  std::string format() const;  // "params 12.4 MiB, grads ..., total ..."
};

// Bytes per category, exactly as core::Model, zero::ShardedAdamW and apps::Trainer allocate them
// (tests/test_cost_model.cpp checks it against the tracker of real runs).
MemoryPrediction predict_memory(const core::ModelSpec& spec, const RankLayout& layout);

// Seconds of one op, forward, backward (and recompute in backward), and its collectives.
struct OpTime {
  double forward = 0.0, backward = 0.0, recompute = 0.0, communication = 0.0;
  double total() const { return forward + backward + recompute + communication; }
};
OpTime op_time(const Op& op, const RankLayout& layout, const HardwareSpec& hw,
               bool fused_attention);

struct TimePrediction {
  double compute = 0.0;         // forward + backward + recompute, all micro-batches and chunks
  double recompute = 0.0;       // of which recomputation
  double tensor_comm = 0.0;     // tensor and sequence collectives inside the layers
  double pipeline_comm = 0.0;   // stage-boundary sends
  double bubble = 0.0;          // pipeline fill and drain
  double data_comm = 0.0;       // gradient reduction and ZeRO gathers (their whole time)
  double hidden_comm = 0.0;     // of which running beside compute (HardwareSpec::comm_overlap;
                                // parameter offload's prefetched uploads)
  double optimizer = 0.0;
  double gradient_norm = 0.0;   // of optimizer: the norm's read of the gradients (which the
                                // trainer's profile counts with the gradient reduction)
  double shared_cores = 0.0;    // waiting for cores shared by more threads (see share_cores)
  double step = 0.0;            // the sum, less hidden_comm
  double flops = 0.0;           // model FLOPs of this rank's step (recompute excluded)
  // compute by the step graph's op kind (gemm, attention, layernorm, activation, embedding,
  // loss: the profiler's core::work_kind_key names), forward + backward + recompute over all
  // micro-batches and chunks. 1d layouts; the grid forms' closed form leaves it empty.
  std::map<std::string, double> kind_compute;
  // Per model chunk, one micro-batch's forward and backward (recompute, the layers' collectives
  // and the stage-boundary sends included): the pieces pinned_step schedules.
  std::vector<double> micro_forward, micro_backward;
};
TimePrediction predict_time(const core::ModelSpec& spec, const RankLayout& layout,
                            const HardwareSpec& hw);

// The seconds a rank occupies its threads in a step: all of its own step, the pipeline bubble
// included, since a rank waiting in MPI keeps polling (OpenMPI yields when oversubscribed but
// stays runnable). Measured on 2 cores, 4 ranks: a 4-stage pipeline ran 0.38 s against 0.55
// predicted this way and 0.32 with the bubble free, while data-parallel layouts, which have no
// bubble, ran within 8% of their prediction and fastest; counting the bubble steers the planner
// to those.
double busy_seconds(const TimePrediction& t);
// Ranks of a host that together run more threads than it has cores take turns on them (mpirun
// --oversubscribe): the step lasts at least the node's thread-seconds (the sum of busy_seconds x
// threads over its ranks) over its cores. Raises `t.step` to that, recording the difference in
// `t.shared_cores`.
void share_cores(TimePrediction& t, double node_thread_seconds, int cores);
// Raises `t.step` (a rank's own prediction) to what the shared cores allow, `shared_step`,
// recording the difference in `t.shared_cores` (0 when the rank's own step is longer).
void stretch_step(TimePrediction& t, double shared_step);

// One step of ranks pinned round-robin to shared cores (a node's i-th rank on its core i mod
// `cores`, nodes holding consecutive ranks, as colossal_train pins ranks that outnumber the cores;
// apps/cli.cpp), simulated: every pipeline
// rank's schedule (parallel::pipeline_schedule) runs its micro-batch forwards and backwards in
// order once their inputs have arrived; a core runs one piece at a time, to its end, taking the
// pieces in the order their ranks became runnable (a rank waiting in MPI leaves its core to the
// others); the tensor x sequence ranks of a stage replica move together and hold all their
// cores; each replica's gradient reduction and optimizer step (data_comm + optimizer) follow on
// its cores. Measured on 2 cores, 4 ranks: data 2 x pipeline 2 0.318 s against 0.330 simulated,
// a 4-stage pipeline 0.360 against 0.397, where counting the bubble as busy (share_cores) gave
// 0.43 and 0.50. `stages[p]`: pipeline rank p's prediction (micro_forward, micro_backward,
// data_comm, optimizer). Returns the step's seconds; throws std::invalid_argument unless there
// is one prediction per stage, with its pieces for every chunk, and at least one core.
struct SharedCoresLayout {
  int data = 1, tensor = 1, sequence = 1, pipeline = 1, chunks = 1, micro_batches = 1;
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::one_f_one_b;
  int cores = 1;           // per node
  int ranks_per_node = 0;  // 0: every rank on one node
  int threads = 1;         // per rank
  bool pinned = false;     // pinned round-robin (pinned_step), or left to the OS (share_cores)
};
double pinned_step(const SharedCoresLayout& layout, const std::vector<TimePrediction>& stages);
// The one rule for ranks sharing a node's cores, for the planner and the trainer alike: `t` (a
// rank's own prediction) stretched to pinned_step's step where the ranks are pinned, else to
// every rank's busy_seconds x threads over the cores (share_cores). `stages[p]`: pipeline rank
// p's own prediction.
void share_node_cores(TimePrediction& t, const SharedCoresLayout& layout,
                      const std::vector<TimePrediction>& stages);

// The per-op table colossal_plan --profile prints (op, kind, GFLOP forward and backward with
// recomputation, MB moved, MiB saved, predicted ms forward and backward, collective) and totals.
std::string format_profile(const StepGraph& graph, const RankLayout& layout, const HardwareSpec& hw,
                           bool fused_attention);

}  // namespace colossal::planner
