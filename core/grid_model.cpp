#include "core/grid_model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/grid_kernels_team.hpp"
#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/layers.hpp"
#include "core/model2d.hpp"
#include "core/model3d.hpp"
#include "core/sharded_detail.hpp"

namespace colossal::core {

GridBlockFloats grid_block_floats(const ModelSpec& spec, TensorMode mode, int batch, int seq_len,
                                  int q) {
  const int64_t row_split = mode == TensorMode::d3 ? int64_t(q) * q : q;
  const int64_t T = seq_len, R = int64_t(batch) * T / row_split;
  const int64_t c = spec.hidden / q, f = spec.ffn_hidden / q;
  // model.fused_attention keeps each row's log-sum-exp instead of its probabilities.
  const int64_t att = int64_t(batch) / row_split * (spec.heads / q) * T *
                      (spec.fused_attention ? 1 : T);
  return {sharded::layer_act_floats(R, c, f, att), R * c, att};
}

GridActivationFloats grid_activation_floats(const sharded::BlockRecompute& plan,
                                            const GridBlockFloats& block) {
  GridActivationFloats a;
  const int blocks = int(plan.start.size());
  for (int b = 0; b < blocks; ++b) {
    if (!plan.dropped(b)) {
      a.kept += block.set - (plan.selective ? block.att : 0);
    } else if (plan.start[std::size_t(b)] == b) {
      a.kept += block.input;
    }
  }
  a.arena = plan.longest * block.set;
  if (plan.selective && plan.dropped_blocks() < blocks) a.selective = block.att;
  return a;
}

void GridModel::allocate_activations(MemoryTracker& tracker, const GridBlockFloats& block,
                                     const std::vector<Keep>& keep, bool selective, int64_t R,
                                     int64_t c, int64_t f, int64_t logits) {
  recompute_plan_ = sharded::stage_recompute(keep, spec_, stage_, selective);
  const GridActivationFloats sizes = grid_activation_floats(recompute_plan_, block);
  const int64_t per_slot = sizes.kept + sharded::head_act_floats(R, c, logits, stage_.head);
  acts_ = DeviceArray<float>(tracker, MemCategory::activations, std::size_t(per_slot * slots_));
  if (sizes.arena > 0) {
    recompute_ = DeviceArray<float>(tracker, MemCategory::temporaries, std::size_t(sizes.arena));
  }
  if (sizes.selective > 0) {
    selective_att_ =
        DeviceArray<float>(tracker, MemCategory::temporaries, std::size_t(sizes.selective));
  }
  slot_acts_.resize(std::size_t(slots_));
  heads_.resize(std::size_t(slots_));
  for (int s = 0; s < slots_; ++s) {
    float* head = sharded::carve_blocks(slot_acts_[std::size_t(s)], recompute_plan_,
                                        acts_.data() + s * per_slot, recompute_.data(), R, c, f,
                                        block.att, selective_att_.data());
    sharded::carve_head(heads_[std::size_t(s)], head, R, c, logits, stage_.head);
  }
  boundary_floats_ = R * c;
  use_slot(0);
}

void GridModel::attention_core_forward(Gemm& gemm, sharded::LayerActs& A, float* work, int B,
                                       int T, int c, int H) {
  if (spec_.fused_attention) {
    model_fused_attention_forward(gemm, A.att, A.atty, GemmOperand(A.qkv), work, B, T, c, H);
  } else {
    attention_forward(gemm, A.att, A.atty, A.qkv, B, T, c, H);
  }
}

void GridModel::attention_core_backward(Gemm& gemm, float* dqkv, float* work, const float* datty,
                                        const sharded::LayerActs& A, int B, int T, int c, int H) {
  if (spec_.fused_attention) {
    model_fused_attention_backward(gemm, dqkv, datty, A.atty, GemmOperand(A.qkv), A.att, work, B,
                                   T, c, H);
  } else {
    attention_backward(gemm, dqkv, work, datty, A.qkv, A.att, B, T, c, H);
  }
}

int64_t grid_attention_work_floats(const ModelSpec& spec, int seq_len, int q) {
  return spec.fused_attention ? int64_t(fused_attention_work_floats())
                              : int64_t(spec.heads / q) * seq_len * seq_len;
}

std::size_t grid_first_unit_floats(const ModelSpec& spec, TensorMode mode, int q,
                                   std::size_t unit_multiple, const StageRange& stage,
                                   int zero_stage) {
  if (zero_stage != 2 || stage.embeds == stage.head) return 0;
  return mode == TensorMode::d3 ? Model3D::unit_floats(spec, q, unit_multiple).front()
                                : Model2D::unit_floats(spec, q, unit_multiple).front();
}

void GridModel::require_boundary() const {
  if (stage_.embeds && stage_.head) {
    throw std::logic_error("this 2d / 2.5d / 3d model was built as the whole model, not a "
                           "stage: it has no stage boundary buffers");
  }
}

int64_t GridModel::stage_floats(int batch) const {
  require_boundary();
  check_micro_batch(batch, 0);
  return boundary_floats_;
}
float* GridModel::stage_input(int slot) {
  require_boundary();
  check_micro_batch(batch_, slot);
  return slot_acts_[std::size_t(slot)].front().x;
}
const float* GridModel::stage_output(int slot) {
  require_boundary();
  check_micro_batch(batch_, slot);
  return heads_[std::size_t(slot)].x_final;
}
float* GridModel::output_gradient() {
  require_boundary();
  return gradient_;
}
const float* GridModel::input_gradient() const {
  require_boundary();
  return gradient_;
}

GridModel::GridModel(const ModelSpec& spec, int batch, std::size_t unit_multiple,
                     StageRange stage, int slots)
    : spec_(spec), batch_(batch), stage_(stage), slots_(slots), unit_multiple_(unit_multiple) {
  if (unit_multiple == 0 || unit_multiple % 16 != 0) {
    throw std::invalid_argument("parameter padding of " + std::to_string(unit_multiple) +
                                " floats is not a multiple of 16");
  }
  const int end = stage.layer_end < 0 ? spec.layers : stage.layer_end;
  if (stage.layer_begin < 0 || stage.layer_begin >= end || end > spec.layers || slots < 1 ||
      stage.embeds != (stage.layer_begin == 0) || stage.head != (end == spec.layers)) {
    throw std::invalid_argument("a 2d / 2.5d / 3d pipeline stage needs at least one of the " +
                                std::to_string(spec.layers) + " blocks and one slot, the "
                                "embeddings exactly when it starts at block 0 and the head "
                                "exactly when it ends at the last; got blocks [" +
                                std::to_string(stage.layer_begin) + ", " +
                                std::to_string(end) + ") and " +
                                std::to_string(slots) + " slots");
  }
}

std::size_t GridModel::append_param(const std::string& name, ParamRole role, std::size_t count) {
  const std::size_t begin = unit_ends_.empty() ? 0 : unit_ends_.back();
  return sharded::append_param(table_, name, role, count, begin, int(unit_ends_.size()));
}

void GridModel::end_unit(std::size_t at_least) {
  const std::size_t begin = unit_ends_.empty() ? 0 : unit_ends_.back();
  const std::size_t end = std::max({begin, sharded::table_end(table_), begin + at_least});
  unit_ends_.push_back(sharded::round_up(end, unit_multiple_));
}

void GridModel::make_store(MemoryTracker& tracker, const StoreFactory& make_store) {
  params_end_ = sharded::table_end(table_);
  if (unit_ends_.empty() || unit_ends_.back() < params_end_) end_unit();
  std::vector<ParamUnit> units;
  std::size_t begin = 0;
  for (std::size_t end : unit_ends_) {
    units.push_back(ParamUnit{begin, end});
    begin = end;
  }
  const std::size_t flat = begin;
  if (make_store) {
    store_ = make_store(std::move(units), flat);
  } else {
    store_ = std::make_unique<FullParameterStore>(std::move(units), flat, tracker);
  }
  if (tracker.dry_run()) return;  // counted, never allocated (a --memory-plan trainer)
  kernels::fill(store_->full_params(), int64_t(flat), 0.0f);
  store_->zero_gradients();
  fence_kernels();
}

void GridModel::open_gradients(int unit) {
  float* buffer = store_->gradients(unit);
  if (unit == 0) {
    open_[0] = buffer;
    return;
  }
  if (open_unit_ != -1) {
    throw std::logic_error("grid model: gradients of unit " + std::to_string(unit) +
                           " opened while unit " + std::to_string(open_unit_) + " is open");
  }
  open_[1] = buffer;
  open_unit_ = unit;
}

void GridModel::close_gradients(int unit) {
  fence_kernels();  // the store may reduce what the kernels wrote
  store_->gradients_done(unit);
  if (unit == 0) {
    open_[0] = nullptr;
  } else {
    open_[1] = nullptr;
    open_unit_ = -1;
  }
}

float* GridModel::grad(std::size_t offset) const {
  const std::vector<ParamUnit>& units = store_->units();
  if (offset < units[0].end) {
    if (open_[0] == nullptr) throw std::logic_error("grid model: unit 0's gradients are not open");
    return open_[0] + offset;
  }
  if (open_unit_ < 0 || offset < units[std::size_t(open_unit_)].begin ||
      offset >= units[std::size_t(open_unit_)].end) {
    throw std::logic_error("grid model: gradient element " + std::to_string(offset) +
                           " is not in an open unit");
  }
  return open_[1] + (offset - units[std::size_t(open_unit_)].begin);
}

void GridModel::check_micro_batch(int batch, int slot) const {
  if (batch != batch_ || slot < 0 || slot >= slots_) {
    throw std::invalid_argument("this 2d / 2.5d / 3d model was built for micro-batches of " +
                                std::to_string(batch_) + " sequences in " +
                                std::to_string(slots_) + " activation slots; " +
                                "got " + std::to_string(batch) + " sequences in slot " +
                                std::to_string(slot));
  }
}

void grid_embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t rs,
                            int64_t cs, const float* wpe, int64_t BT, int T, int64_t c,
                            int64_t v0, int64_t vb, int64_t offset, int64_t p0, int64_t pb) {
  using Exec = kernels::Exec;
  if constexpr (team_kernels_v<Exec>) {  // one item per element
    team::grid_embedding_forward<Exec>(out, tokens, wte, rs, cs, wpe, BT, T, int(c), v0, vb,
                                       offset, p0, pb);
  } else {
    Kokkos::parallel_for(
        "colossal::core::grid_embedding_forward", Kokkos::RangePolicy<Exec>(0, BT),
        KOKKOS_LAMBDA(int64_t n) {
          const int64_t tok = int64_t(tokens[n]) - v0, p = int64_t(n % T) + offset - p0;
          float* o = out + n * c;
          for (int64_t s = 0; s < c; ++s) {
            float v = 0.0f;
            if (tok >= 0 && tok < vb) v += wte[tok * rs + s * cs];
            if (p >= 0 && p < pb) v += wpe[p * c + s];
            o[s] = v;
          }
        });
  }
}

void grid_embedding_backward(float* dwte, int64_t rs, int64_t cs, float* dwpe, const float* dout,
                             const int32_t* tokens, int64_t BT, int batch, int T, int64_t c,
                             int64_t v0, int64_t vb, int64_t offset, int64_t p0, int64_t pb) {
  using Exec = kernels::Exec;
  if constexpr (team_kernels_v<Exec>) {
    // The token rows through team::embedding_backward_tokens' bucket sort, the position rows
    // one work item per element adding over the batch in order.
    team::embedding_backward_tokens<Exec>(dwte, rs, cs, dout, tokens, int(BT), int(c), v0, vb, 0);
    team::grid_position_backward<Exec>(dwpe, dout, batch, T, int(c), offset, p0, pb);
  } else {
    Kokkos::parallel_for(
        "colossal::core::grid_embedding_backward", Kokkos::RangePolicy<Exec>(0, c),
        KOKKOS_LAMBDA(int64_t s) {
          for (int64_t n = 0; n < BT; ++n) {
            const int64_t tok = int64_t(tokens[n]) - v0, p = int64_t(n % T) + offset - p0;
            if (tok >= 0 && tok < vb) dwte[tok * rs + s * cs] += dout[n * c + s];
            if (p >= 0 && p < pb) dwpe[p * c + s] += dout[n * c + s];
          }
        });
  }
}

}  // namespace colossal::core
