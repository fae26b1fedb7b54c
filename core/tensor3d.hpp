// Building blocks of 3D tensor parallelism (Bian et al. 2021, "Maximizing Parallelism in
// Distributed Training for Huge Neural Networks", Colossal-AI's 3D mode): the linear layer
// Y = X A over a q x q x q cube of ranks, forward and backward, with its communication written
// out.
//
// Cube: rank (i, j, l). Three groups of q ranks each pass through it:
//   input  group: (i, *, l), ordered by j     weight group: (*, j, l), ordered by i
//   output group: (i, j, *), ordered by l
// Layouts for X (M x K), A (K x N), Y (M x N), with M, K multiples of q^2 where cut in q^2:
//   X_ijl: rows block i q + j of q^2, columns block l of q   (M/q^2 x K/q)
//   A_lji: rows block l of q, columns block j q + i of q^2   (K/q x N/q^2)
//   Y_ijl: rows block i q + l of q^2, columns block j of q   (M/q^2 x N/q)
// so each rank holds 1/q^3 of the input, the weight and the output. Y's layout is X's with the
// roles of j and l exchanged: the next linear runs with the input and output groups swapped (as
// Colossal-AI alternates its parallel modes), and its input is already in place.
//
// Forward: all-gather X over the input group (-> X_il, M/q x K/q), all-gather A over the weight
// group (-> A_lj, K/q x N/q, as q column blocks), P = X_il A_lj, reduce-scatter P over the output
// group (sums over l; row sub-block l stays). Backward: all-gather dY over the output group
// (-> dY_ij); dX_il = dY_ij A_lj^T reduce-scattered over the input group; dA_lj = X_il^T dY_ij
// reduce-scattered over the weight group.
//
// Communication per rank, floats as the payload counters see them (all-gather: output;
// reduce-scatter: input):
//   forward   input all-gather M K / q^2, weight all-gather K N / q^2, output reduce-scatter
//             M N / q^2
//   backward  output all-gather M N / q^2, input reduce-scatter M K / q^2, weight
//             reduce-scatter K N / q^2, plus the forward's two all-gathers again (the gathered
//             input and weight are not kept between forward and backward: memory over traffic)
#pragma once

#include <cstddef>
#include <cstdint>

namespace colossal::core {

class Gemm;
class TensorGroup;

struct Cube3D {
  TensorGroup& input;   // (i, *, l)
  TensorGroup& weight;  // (*, j, l)
  TensorGroup& output;  // (i, j, *)
  int q() const;
};

// Floats of `work` the forward and the backward need.
std::size_t linear3d_work_floats(int64_t M, int64_t N, int64_t K, int q);

// Y_ijl = (X A)_ijl.
void linear3d_forward(Gemm& gemm, Cube3D& cube, const float* X, const float* A, float* Y,
                      int64_t M, int64_t N, int64_t K, float* work);

// dX_ijl and dA_lji (assigned) from dY_ijl, the saved X_ijl and A_lji.
void linear3d_backward(Gemm& gemm, Cube3D& cube, const float* dY, const float* X, const float* A,
                       float* dX, float* dA, int64_t M, int64_t N, int64_t K, float* work);

}  // namespace colossal::core
