// parallel.tensor.mode as a value: how the tensor-parallel group splits a block's matrices.
// Parsed once from the config (io/config.cpp); everything below compares the enum. The names are
// the config's words, so the plan, YAML and error texts read them back unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace colossal::core {

// d1: Megatron column/row-parallel linears; d2: SUMMA on a q x q grid; d2_5: Tesseract, q x q x
// depth; d3: the q x q x q cube.
enum class TensorMode : uint8_t { d1, d2, d2_5, d3 };

// "1d", "2d", "2.5d", "3d".
inline const char* tensor_mode_name(TensorMode mode) {
  switch (mode) {
    case TensorMode::d1: return "1d";
    case TensorMode::d2: return "2d";
    case TensorMode::d2_5: return "2.5d";
    case TensorMode::d3: return "3d";
  }
  return "?";
}

// The mode a name stands for; nullopt for any other text.
inline std::optional<TensorMode> parse_tensor_mode(std::string_view name) {
  for (TensorMode m : {TensorMode::d1, TensorMode::d2, TensorMode::d2_5, TensorMode::d3}) {
    if (name == tensor_mode_name(m)) return m;
  }
  return std::nullopt;
}

// Depth layers the mode runs: `depth` under 2.5d, 1 otherwise.
inline int tensor_depth(TensorMode mode, int depth) { return mode == TensorMode::d2_5 ? depth : 1; }

// The grid of a tensor group of `size` ranks in tensor mode `mode` (2d, 2.5d with `depth`
// layers, 3d): the largest side q with q^2 x depth (q^3 in 3d) <= size, and whether the
// group is exactly that grid with q >= 2. One place for the config, the planner and the trainer
// (core/sharded_detail.cpp).
struct TensorGrid {
  int q = 1;
  bool exact = false;
  int ranks(int side) const;  // the group size of a grid of `side` (q^2 x depth or q^3)
  int depth = 1, power = 2;
};
TensorGrid tensor_grid(TensorMode mode, int size, int depth = 1);
// What model.hidden, model.ffn_hidden and train.micro_batch must be multiples of on a grid of
// side q (model.heads: of q): q in 2d and 2.5d, q^2 in 3d.
int tensor_grid_multiple(TensorMode mode, int q);

}  // namespace colossal::core
