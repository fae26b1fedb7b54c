#include "core/grid_model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/kernels.hpp"
#include "core/sharded_detail.hpp"

namespace colossal::core {

GridBlockFloats grid_block_floats(const ModelSpec& spec, TensorMode mode, int batch, int seq_len,
                                  int q) {
  const int64_t row_split = mode == TensorMode::d3 ? int64_t(q) * q : q;
  const int64_t T = seq_len, R = int64_t(batch) * T / row_split;
  const int64_t c = spec.hidden / q, f = spec.ffn_hidden / q;
  const int64_t att = int64_t(batch) / row_split * (spec.heads / q) * T * T;
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

float* GridModel::allocate_activations(MemoryTracker& tracker, const GridBlockFloats& block,
                                       const std::vector<Keep>& keep, bool selective, int64_t R,
                                       int64_t c, int64_t f, int64_t head_floats) {
  recompute_plan_ = sharded::block_recompute(keep, spec_.layers, selective);
  const GridActivationFloats sizes = grid_activation_floats(recompute_plan_, block);
  acts_ = DeviceArray<float>(tracker, MemCategory::activations,
                             std::size_t(sizes.kept + head_floats));
  if (sizes.arena > 0) {
    recompute_ = DeviceArray<float>(tracker, MemCategory::temporaries, std::size_t(sizes.arena));
  }
  if (sizes.selective > 0) {
    selective_att_ =
        DeviceArray<float>(tracker, MemCategory::temporaries, std::size_t(sizes.selective));
  }
  return sharded::carve_blocks(layer_acts_, recompute_plan_, acts_.data(), recompute_.data(), R,
                               c, f, block.att, selective_att_.data());
}

void GridModel::no_stages() const {
  throw std::logic_error("the 2d / 2.5d / 3d tensor-parallel models run the whole model on one "
                         "pipeline stage: they have no stage boundary buffers");
}

int64_t GridModel::stage_floats(int) const { no_stages(); }
float* GridModel::stage_input(int) { no_stages(); }
const float* GridModel::stage_output(int) { no_stages(); }
float* GridModel::output_gradient() { no_stages(); }
const float* GridModel::input_gradient() const { no_stages(); }

GridModel::GridModel(const ModelSpec& spec, int batch, std::size_t unit_multiple)
    : spec_(spec), batch_(batch), unit_multiple_(unit_multiple) {
  if (unit_multiple == 0 || unit_multiple % 16 != 0) {
    throw std::invalid_argument("parameter padding of " + std::to_string(unit_multiple) +
                                " floats is not a multiple of 16");
  }
}

std::size_t GridModel::append_param(const std::string& name, ParamRole role, std::size_t count) {
  const std::size_t begin = unit_ends_.empty() ? 0 : unit_ends_.back();
  return sharded::append_param(table_, name, role, count, begin, int(unit_ends_.size()));
}

void GridModel::end_unit() {
  const std::size_t begin = unit_ends_.empty() ? 0 : unit_ends_.back();
  const std::size_t end = std::max(begin, sharded::table_end(table_));
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
  Kokkos::fence();
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
  Kokkos::fence();  // the store may reduce what the kernels wrote
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
  if (batch != batch_ || slot != 0) {
    throw std::invalid_argument("this 2d / 2.5d / 3d model was built for micro-batches of " +
                                std::to_string(batch_) + " sequences in one activation slot; " +
                                "got " + std::to_string(batch) + " sequences in slot " +
                                std::to_string(slot));
  }
}

}  // namespace colossal::core
