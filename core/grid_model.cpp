#include "core/grid_model.hpp"

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

void GridModel::no_stages() const {
  throw std::logic_error("the 2d / 2.5d / 3d tensor-parallel models run the whole model on one "
                         "pipeline stage: they have no stage boundary buffers");
}

int64_t GridModel::stage_floats(int) const { no_stages(); }
float* GridModel::stage_input(int) { no_stages(); }
const float* GridModel::stage_output(int) { no_stages(); }
float* GridModel::output_gradient() { no_stages(); }
const float* GridModel::input_gradient() const { no_stages(); }

void GridModel::make_store(MemoryTracker& tracker, std::size_t unit_multiple) {
  if (unit_multiple == 0 || unit_multiple % 16 != 0) {
    throw std::invalid_argument("parameter padding of " + std::to_string(unit_multiple) +
                                " floats is not a multiple of 16");
  }
  params_end_ = sharded::table_end(table_);
  const std::size_t flat = (params_end_ + unit_multiple - 1) / unit_multiple * unit_multiple;
  store_ = std::make_unique<FullParameterStore>(std::vector<ParamUnit>{ParamUnit{0, flat}}, flat,
                                                tracker);
  if (tracker.dry_run()) return;  // counted, never allocated (a --memory-plan trainer)
  kernels::fill(store_->full_params(), int64_t(flat), 0.0f);
  kernels::fill(store_->full_grads(), int64_t(flat), 0.0f);
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
