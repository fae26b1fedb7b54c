#include "apps/model_factory.hpp"

#include <stdexcept>

#include "core/model2d.hpp"

namespace colossal::apps {

BuiltModel make_stage_model(const io::Config& config, int seq_len, core::MemoryTracker& tracker,
                            core::Gemm& gemm, const core::ModelOptions& options,
                            const parallel::TensorGridGroups* grid_groups) {
  const core::ModelSpec& spec = config.model;
  const auto& par = config.parallel;
  const int batch = config.train.micro_batch;
  BuiltModel built;
  if (par.tensor_mode == core::TensorMode::d1) {
    built.model = std::make_unique<core::Model>(spec, batch, seq_len, tracker, gemm, options);
    return built;
  }
  if (grid_groups == nullptr) {
    throw std::invalid_argument(std::string("parallel.tensor.mode ") +
                                core::tensor_mode_name(par.tensor_mode) +
                                " needs the tensor group's sub-grid groups");
  }
  const parallel::TensorGridGroups& g = *grid_groups;
  using G = parallel::TensorGridGroup;
  const parallel::TensorSubGrid sub_grid(par.tensor_mode, par.tensor, par.tensor_depth);
  const std::string q = std::to_string(sub_grid.q());
  if (par.tensor_mode == core::TensorMode::d3) {
    built.cube = std::make_unique<core::Cube3DGroups>(core::Cube3DGroups{
        g[G::input], g[G::weight], g[G::output], g[G::plane_l], g[G::plane_j]});
    built.model = std::make_unique<core::Model3D>(spec, batch, seq_len, *built.cube, gemm,
                                                  tracker, options.unit_multiple, options.keep,
                                                  options.selective, options.grid_store,
                                                  options.stage, options.slots,
                                                  options.grid_first_unit_floats);
    built.grid_text = q + " x " + q + " x " + q + " cube";
    return built;
  }
  built.grid = std::make_unique<core::Grid2D>(core::Grid2D{g[G::row], g[G::col]});
  core::TensorGroup* depth = g.has(G::depth) ? &g[G::depth] : nullptr;
  built.model = std::make_unique<core::Model2D>(spec, batch, seq_len, *built.grid, gemm, tracker,
                                                depth, options.unit_multiple, options.keep,
                                                options.selective, options.grid_store,
                                                options.stage, options.slots,
                                                options.grid_first_unit_floats);
  built.grid_text = q + " x " + q + " grid" +
                    (sub_grid.depth() > 1
                         ? " x " + std::to_string(sub_grid.depth()) + " depth layers"
                         : std::string());
  return built;
}

}  // namespace colossal::apps
