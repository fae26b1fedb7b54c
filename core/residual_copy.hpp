// A second output of the layernorm kernels' pass over a row (kernels::layernorm_forward,
// team::layernorm_forward): out = inp (+ bias), the buffer the sub-layer's row-parallel product
// then accumulates into (the residual stream plus that product's bias), written while the row is
// loaded instead of in a pass of its own: the residual add fused with the layernorm that reads
// the same rows. out null: none.
#pragma once

namespace colossal::core {

struct ResidualCopy {
  float* out = nullptr;
  const float* bias = nullptr;  // (C) or null
};

}  // namespace colossal::core
