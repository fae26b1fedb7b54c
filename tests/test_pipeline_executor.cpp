// The model-agnostic pipeline executor and its stage links (parallel/pipeline_executor.hpp,
// parallel/stage_link.hpp) on a toy model, rank against rank: every virtual stage v computes
// y = a_v * x + b_v element-wise, the last one's loss is the sum of y, and backward is written by
// hand. Under GPipe, 1F1B and interleaved 1F1B, on a pipeline of the whole world and on one with
// tensor pairs (scatter-gather of the boundary), every stage's loss and parameter gradients equal
// a single-process computation exactly (integers: exact in float whatever the order), each stage
// runs each micro-batch once, holds the micro-batches its schedule says and sends exactly its
// part of every boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "core/trace.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/pipeline_executor.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/stage_link.hpp"

using namespace colossal;

namespace {

constexpr int kRows = 2;   // sequences per micro-batch
constexpr int kWidth = 6;  // boundary floats per sequence

float weight_of(int v) { return v % 3 == 2 ? -1.0f : float(v % 3 + 1); }
float bias_of(int v) { return float(v - 2); }
// The first stage's input of micro-batch m, element i.
float input_of(int m, int i) { return float((m + 1) * 3 - i % 5); }

// One virtual stage of the toy model, holding `slots` micro-batches' inputs and outputs. Like
// core::Model it leaves its input gradient in the buffer its output gradient came in (dgrad_),
// so a link that sent that buffer while receiving the next gradient into it would be caught.
class ToyStage final : public parallel::PipelineStage {
 public:
  ToyStage(int v, int virtual_stages, int slots)
      : v_(v), last_(v + 1 == virtual_stages), a_(weight_of(v)), b_(bias_of(v)),
        in_(std::size_t(slots) * kRows * kWidth), out_(in_.size()), dgrad_(kRows * kWidth) {}

  void load(int micro, int slot) override {
    ++loads;
    if (v_ != 0) return;
    for (int i = 0; i < kRows * kWidth; ++i) in_[offset(slot) + i] = input_of(micro, i);
  }
  double forward(int /*micro*/, int slot) override { return run(slot, kRows); }
  void backward(int /*micro*/, int slot) override {
    EXPECT_TRUE(inside_) << "before_backward not called";
    for (int i = 0; i < kRows * kWidth; ++i) {
      const float g = last_ ? 1.0f : dgrad_[i];
      grad_a += g * in_[offset(slot) + i];
      grad_b += g;
      dgrad_[i] = a_ * g;
    }
  }
  void before_backward(int /*micro*/) override { inside_ = true; }
  void after_backward(int /*micro*/) override { inside_ = false; }
  double forward_only(int batch) override {
    if (v_ == 0) {
      for (int i = 0; i < batch * kWidth; ++i) in_[i] = input_of(0, i);
    }
    return run(0, batch);
  }
  std::size_t boundary_floats(int batch) const override { return std::size_t(batch) * kWidth; }
  float* stage_input(int slot) override { return in_.data() + offset(slot); }
  const float* stage_output(int slot) override { return out_.data() + offset(slot); }
  float* output_gradient() override { return dgrad_.data(); }
  const float* input_gradient() override { return dgrad_.data(); }

  float grad_a = 0.0f, grad_b = 0.0f;
  int loads = 0;

 private:
  static std::size_t offset(int slot) { return std::size_t(slot) * kRows * kWidth; }
  double run(int slot, int rows) {
    double loss = 0.0;
    for (int i = 0; i < rows * kWidth; ++i) {
      out_[offset(slot) + i] = a_ * in_[offset(slot) + i] + b_;
      loss += out_[offset(slot) + i];
    }
    return last_ ? loss : 0.0;
  }
  int v_;
  bool last_;
  float a_, b_;
  std::vector<float> in_, out_, dgrad_;
  bool inside_ = false;
};

struct Reference {
  double loss = 0.0;
  std::vector<float> grad_a, grad_b;
};

// The whole model on one process: each micro-batch forward through every stage, then backward.
Reference single_process(int virtual_stages, int micro, int rows) {
  Reference r{0.0, std::vector<float>(virtual_stages), std::vector<float>(virtual_stages)};
  for (int m = 0; m < micro; ++m) {
    std::vector<std::vector<float>> x(virtual_stages + 1, std::vector<float>(rows * kWidth));
    for (int i = 0; i < rows * kWidth; ++i) x[0][i] = input_of(m, i);
    for (int v = 0; v < virtual_stages; ++v) {
      for (int i = 0; i < rows * kWidth; ++i) x[v + 1][i] = weight_of(v) * x[v][i] + bias_of(v);
    }
    for (float y : x[virtual_stages]) r.loss += y;
    std::vector<float> g(rows * kWidth, 1.0f);
    for (int v = virtual_stages - 1; v >= 0; --v) {
      for (int i = 0; i < rows * kWidth; ++i) {
        r.grad_a[v] += g[i] * x[v][i];
        r.grad_b[v] += g[i];
        g[i] *= weight_of(v);
      }
    }
  }
  return r;
}

struct Layout {
  std::unique_ptr<parallel::Communicator> world, pipeline, tensor;
};

// Tensor groups of `tensor` adjacent ranks; pipelines across them.
Layout layout(int tensor) {
  Layout l;
  l.world = parallel::make_world_communicator();
  const int rank = l.world->rank();
  l.tensor = l.world->split(rank / tensor, rank);
  l.pipeline = l.world->split(rank % tensor, rank);
  return l;
}

// The link of virtual stage v for the toy stages' (kRows x kWidth) boundary.
std::unique_ptr<parallel::StageLink> toy_link(const Layout& l, int v, int virtual_stages,
                                              int slots, core::MemoryTracker& tracker) {
  return std::make_unique<parallel::StageLink>(
      parallel::StageLinkOptions{.pipeline = l.pipeline.get(),
                                 .tensor = l.tensor.get(),
                                 .virtual_stage = v,
                                 .virtual_stages = virtual_stages,
                                 .floats = kRows * kWidth,
                                 .slots = slots},
      tracker);
}

void check_schedule(const std::string& kind, int tensor, int micro, int chunks) {
  Layout l = layout(tensor);
  parallel::Communicator& pp = *l.pipeline;
  const int stages = pp.size(), virtual_stages = stages * chunks;
  SCOPED_TRACE(kind + ", " + std::to_string(stages) + " stages x " + std::to_string(chunks) +
               " chunks, tensor " + std::to_string(tensor) + ", " + std::to_string(micro) +
               " micro-batches");
  const auto schedule = parallel::pipeline_schedule(kind, stages, pp.rank(), micro, chunks);
  core::MemoryTracker tracker;
  std::vector<std::unique_ptr<ToyStage>> toys;
  std::vector<std::unique_ptr<parallel::StageLink>> links;
  std::vector<parallel::PipelineExecutor::Chunk> executed;
  std::size_t expected_send_bytes = 0;
  for (int c = 0; c < chunks; ++c) {
    std::vector<parallel::PipelineAction> mine;
    for (const auto& a : schedule) {
      if (a.chunk == c) mine.push_back(a);
    }
    const int slots = parallel::peak_in_flight(mine);
    const int v = c * stages + pp.rank();
    toys.push_back(std::make_unique<ToyStage>(v, virtual_stages, slots));
    links.push_back(toy_link(l, v, virtual_stages, slots, tracker));
    executed.push_back({toys.back().get(), links.back().get()});
    const std::size_t part = std::size_t(kRows * kWidth / tensor) * sizeof(float);
    if (v > 0) expected_send_bytes += std::size_t(micro) * part;                   // gradients
    if (v + 1 < virtual_stages) expected_send_bytes += std::size_t(micro) * part;  // activations
  }
  core::TraceRecorder trace;
  ASSERT_TRUE(trace.open(testing::TempDir() + "toy_trace_" + std::to_string(l.world->rank()) +
                         ".json"));
  // NCCL's rule (COLOSSAL_TEST_GROUPED_P2P=1 on MPI): each step's messages as one group.
  const bool grouped = pp.matches_in_issue_order();
  const parallel::PipelineSchedule kind_value = *parallel::parse_pipeline_schedule(kind);
  std::vector<std::vector<parallel::PipelineMessage>> exchanges;
  if (grouped) {
    EXPECT_TRUE(parallel::exchanges_complete(kind_value, stages, micro, chunks));
    exchanges = parallel::pipeline_exchanges(kind_value, stages, pp.rank(), micro, chunks);
  }
  parallel::PipelineExecutor executor(std::move(executed), schedule, nullptr, &trace, exchanges);
  EXPECT_EQ(executor.grouped(), grouped);
  pp.reset_stats();
  const double loss = executor.run_step();
  const double total = pp.all_reduce_sum_value(loss);

  const Reference ref = single_process(virtual_stages, micro, kRows);
  EXPECT_EQ(total, ref.loss);
  EXPECT_EQ(loss, pp.rank() == stages - 1 ? ref.loss : 0.0) << "the loss is the last stage's";
  for (int c = 0; c < chunks; ++c) {
    const int v = c * stages + pp.rank();
    EXPECT_EQ(toys[c]->grad_a, ref.grad_a[v]) << "virtual stage " << v;
    EXPECT_EQ(toys[c]->grad_b, ref.grad_b[v]) << "virtual stage " << v;
    EXPECT_EQ(toys[c]->loads, micro) << "one load before every forward";
  }
  EXPECT_EQ(executor.stats().forwards, int64_t(micro) * chunks);
  EXPECT_EQ(executor.stats().backwards, int64_t(micro) * chunks);
  EXPECT_EQ(executor.stats().peak_in_flight, parallel::peak_in_flight(schedule));
  EXPECT_EQ(pp.stats().send.payload_bytes, expected_send_bytes);
  EXPECT_EQ(pp.stats().recv.payload_bytes, expected_send_bytes) << "receives mirror sends";
  // One span per forward, backward and receive of this rank, named by chunk and micro-batch.
  int forwards = 0, backwards = 0, receives = 0;
  std::set<std::string> names;
  for (const auto& e : trace.events()) {
    const std::string category = e.category;
    forwards += category == "forward";
    backwards += category == "backward";
    receives += category == "receive";
    names.insert(e.name);
  }
  EXPECT_EQ(forwards, micro * chunks);
  EXPECT_EQ(backwards, micro * chunks);
  int expected_receives = 0;  // one span per receive, or per group that receives
  for (int c = 0; c < chunks && !grouped; ++c) {
    const int v = c * stages + pp.rank();
    expected_receives += (v > 0 ? micro : 0) + (v + 1 < virtual_stages ? micro : 0);
  }
  for (const auto& group : exchanges) {
    expected_receives += std::any_of(group.begin(), group.end(),
                                     [](const parallel::PipelineMessage& m) { return !m.send; });
  }
  EXPECT_EQ(receives, expected_receives);
  EXPECT_TRUE(names.count(chunks > 1 ? "F1.0" : "F0")) << "spans name the chunk when several";
  if (grouped) {
    EXPECT_EQ(names.count("exchange"), virtual_stages > 1 ? 1u : 0u) << "spans of groups, if any";
  } else {
    EXPECT_TRUE(names.count("wait sends"));
  }

  // A second step accumulates the same gradients again and reports the same loss.
  EXPECT_EQ(executor.run_step(), loss);
  for (int c = 0; c < chunks; ++c) {
    EXPECT_EQ(toys[c]->grad_a, 2.0f * ref.grad_a[c * stages + pp.rank()]);
  }
  EXPECT_EQ(executor.stats().forwards, 2 * int64_t(micro) * chunks);
}

int world_size() { return parallel::make_world_communicator()->size(); }

TEST(PipelineExecutor, GpipeAnd1f1bEqualOneProcess) {
  for (int tensor : {1, 2}) {
    if (world_size() % tensor != 0) continue;
    for (const std::string kind : {"gpipe", "1f1b"}) {
      for (int micro : {1, 3, 8}) check_schedule(kind, tensor, micro, 1);
    }
  }
}

TEST(PipelineExecutor, InterleavedEqualsOneProcess) {
  for (int tensor : {1, 2}) {
    if (world_size() % tensor != 0) continue;
    const int stages = world_size() / tensor;
    for (int micro : {stages, 2 * stages}) {
      check_schedule("interleaved", tensor, micro, 2);
      if (stages > 1) check_schedule("interleaved", tensor, micro, 3);
    }
  }
}

// The evaluation forward: a smaller batch than the micro-batch, tag 0, through every chunk.
TEST(PipelineExecutor, ForwardOnlyRunsEveryStageInTurn) {
  for (int tensor : {1, 2}) {
    if (world_size() % tensor != 0) continue;
    for (int chunks : {1, 2}) {
      Layout l = layout(tensor);
      parallel::Communicator& pp = *l.pipeline;
      const int stages = pp.size(), virtual_stages = stages * chunks;
      core::MemoryTracker tracker;
      std::vector<std::unique_ptr<ToyStage>> toys;
      std::vector<std::unique_ptr<parallel::StageLink>> links;
      std::vector<parallel::PipelineExecutor::Chunk> executed;
      for (int c = 0; c < chunks; ++c) {
        const int v = c * stages + pp.rank();
        toys.push_back(std::make_unique<ToyStage>(v, virtual_stages, 1));
        links.push_back(toy_link(l, v, virtual_stages, 1, tracker));
        executed.push_back({toys.back().get(), links.back().get()});
      }
      // A training schedule for the chunks (forward_only runs none of it).
      const auto kind = chunks > 1 ? parallel::PipelineSchedule::interleaved
                                   : parallel::PipelineSchedule::gpipe;
      const int micro = chunks > 1 ? stages : 1;
      std::vector<std::vector<parallel::PipelineMessage>> exchanges;
      if (pp.matches_in_issue_order()) {
        exchanges = parallel::pipeline_exchanges(kind, stages, pp.rank(), micro, chunks);
      }
      parallel::PipelineExecutor executor(
          std::move(executed), parallel::pipeline_schedule(kind, stages, pp.rank(), micro, chunks),
          nullptr, nullptr, exchanges);
      const double loss = executor.forward_only(1);
      const Reference ref = single_process(virtual_stages, 1, 1);
      EXPECT_EQ(pp.all_reduce_sum_value(loss), ref.loss) << "tensor " << tensor;
      EXPECT_EQ(loss, pp.rank() == stages - 1 ? ref.loss : 0.0);
      EXPECT_EQ(executor.stats().forwards, 0) << "evaluation is not counted as training";
    }
  }
}

TEST(StageLink, TagsAreDistinctAndPaired) {
  for (int virtual_stages : {1, 2, 4, 8}) {
    std::set<int> tags;
    for (int m = 0; m < 6; ++m) {
      for (int b = 0; b + 1 < virtual_stages; ++b) {
        const int f = parallel::StageLink::forward_tag(m, b, virtual_stages);
        const int g = parallel::StageLink::backward_tag(m, b, virtual_stages);
        EXPECT_EQ(f, 2 * (m * virtual_stages + b));
        EXPECT_EQ(g, f + 1);
        EXPECT_TRUE(tags.insert(f).second && tags.insert(g).second) << m << " " << b;
      }
    }
  }
}

TEST(StageLink, ScatterGatherPartsAndBadOptions) {
  Layout l = layout(world_size() % 2 == 0 ? 2 : 1);
  core::MemoryTracker tracker;
  parallel::StageLinkOptions options{.pipeline = l.pipeline.get(),
                                     .tensor = l.tensor.get(),
                                     .virtual_stage = l.pipeline->rank(),
                                     .virtual_stages = l.pipeline->size(),
                                     .floats = 12,
                                     .slots = 3};
  const std::size_t before = tracker.current(core::MemCategory::temporaries);
  parallel::StageLink link(options, tracker);
  const int t = l.tensor->size();
  const std::size_t share = std::size_t(12 / t);
  EXPECT_EQ(link.part(12), (std::pair<std::size_t, std::size_t>{share * l.tensor->rank(), share}));
  // Gradient send buffers: slots x floats, except on the first stage, which sends none.
  EXPECT_EQ(tracker.current(core::MemCategory::temporaries) - before,
            link.first() ? 0u : 3u * 12u * sizeof(float));
  const int p = l.pipeline->size();
  EXPECT_EQ(link.previous_rank(), (l.pipeline->rank() + p - 1) % p);
  EXPECT_EQ(link.next_rank(), (l.pipeline->rank() + 1) % p);
  // Without a tensor group the whole boundary travels.
  options.tensor = nullptr;
  EXPECT_EQ(parallel::StageLink(options, tracker).part(12),
            (std::pair<std::size_t, std::size_t>{0, 12}));
  auto bad = options;
  bad.slots = 0;
  EXPECT_THROW(parallel::StageLink(bad, tracker), std::invalid_argument);
  bad = options;
  bad.virtual_stage = options.virtual_stage + 1;  // another rank's
  if (l.pipeline->size() > 1) {
    EXPECT_THROW(parallel::StageLink(bad, tracker), std::invalid_argument);
  }
  bad = options;
  bad.virtual_stages = l.pipeline->size() + 1;
  if (l.pipeline->size() > 1) {
    EXPECT_THROW(parallel::StageLink(bad, tracker), std::invalid_argument);
  }
  bad = options;
  bad.pipeline = nullptr;
  EXPECT_THROW(parallel::StageLink(bad, tracker), std::invalid_argument);
}

TEST(TraceRecorder, WritesChromeTraceEvents) {
  const auto world = parallel::make_world_communicator();
  const std::string file =
      testing::TempDir() + "recorder_" + std::to_string(world->rank()) + ".json";
  core::TraceRecorder off;
  { core::TraceRecorder::Span span(&off, "F", "forward", 3); }
  EXPECT_TRUE(off.events().empty()) << "a recorder without a file keeps nothing";
  core::TraceRecorder trace;
  ASSERT_TRUE(trace.open(file));
  { core::TraceRecorder::Span span(&trace, "F", "forward", 3); }
  { core::TraceRecorder::Span span(&trace, "B", "backward", 2, 1); }
  ASSERT_EQ(trace.events().size(), 2u);
  EXPECT_EQ(trace.events()[0].name, "F3");
  EXPECT_EQ(trace.events()[1].name, "B1.2");
  EXPECT_GE(trace.events()[1].begin_us, trace.events()[0].begin_us);
  trace.write(7, "rank 7 (stage 0)");
  std::FILE* f = std::fopen(file.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  EXPECT_EQ(text.rfind("{\"traceEvents\": [\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 7, "
                       "\"args\": {\"name\": \"rank 7 (stage 0)\"}}",
                       0),
            0u)
      << text;
  EXPECT_NE(text.find("{\"name\": \"B1.2\", \"cat\": \"backward\", \"ph\": \"X\", \"ts\": "),
            std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");
  EXPECT_FALSE(core::TraceRecorder().open(testing::TempDir() + "no/such/dir/t.json"));
}

}  // namespace
