// Building blocks of 2D tensor parallelism (Xu et al. 2021, "An Efficient 2D Method for Training
// Super-Large Deep Learning Models", the Optimus layout Colossal-AI's 2D mode follows): matrix
// products by SUMMA, layernorm and cross-entropy, over a q x q grid of ranks, each an explicit
// forward/backward with its communication written out.
//
// Grid: rank (i, j) sits in grid row i and grid column j. `row` is the group of the q ranks of
// row i ordered by j (row.rank() == j), `col` the q ranks of column j ordered by i
// (col.rank() == i).
// Blocks: a row-major R x S matrix X is cut into q x q blocks and rank (i, j) holds X_ij: rows
// [i R/q, (i+1) R/q), columns [j S/q, (j+1) S/q), row-major with leading dimension S/q. R and S
// are multiples of q. Activations (rows = tokens) and weights are both partitioned this way, so
// every rank holds 1/q^2 of each.
//
// Communication per rank, in floats, as the communicator's payload counters see it (x4 bytes; an
// all-gather counts its output, a reduce-scatter its input):
//   summa_ab   q row broadcasts of M K / q^2 and q column broadcasts of K N / q^2
//   summa_abt  a column all-gather of N K / q (q blocks of N K / q^2) and a row reduce-scatter
//              of M N / q (q partial blocks of M N / q^2)
//   summa_atb  a row all-gather of K M / q and a column reduce-scatter of M N / q
//   layernorm  two row all-reduces of R/q (forward: the mean, then the variance; backward: the
//              two row sums of the input gradient, as one all-reduce of 2 R/q)
//   cross-entropy  row all-reduces of R/q (max) and 2 R/q (sums)
#pragma once

#include <cstddef>
#include <cstdint>

namespace colossal::core {

class Gemm;
class Profiler;
class TensorGroup;

struct Grid2D {
  TensorGroup& row;  // the q ranks of this rank's grid row, by column index
  TensorGroup& col;  // the q ranks of this rank's grid column, by row index
  int q() const;
  int i() const;     // grid row
  int j() const;     // grid column
};

// C_ij = (A B)_ij for A (M x K), B (K x N), C (M x N), all blocked. SUMMA: for t = 0..q-1, rank
// (i, t) broadcasts A_it along row i, rank (t, j) broadcasts B_tj along column j, and every rank
// adds A_it B_tj to C_ij. Only one block of A and one of B are in flight at a time.
void summa_ab(Gemm& gemm, Grid2D& grid, const float* A, const float* B, float* C, int64_t M,
              int64_t N, int64_t K, float* work);

// C_ij = (A B^T)_ij for A (M x K), B (N x K): C_it = sum_j A_ij B_tj^T. Each rank all-gathers the
// blocks of B in its column (B_0j .. B_(q-1)j), forms the q partial products A_ij B_tj^T, and a
// reduce-scatter along the row sums partial t onto rank (i, t). The backward of summa_ab for A.
void summa_abt(Gemm& gemm, Grid2D& grid, const float* A, const float* B, float* C, int64_t M,
               int64_t N, int64_t K, float* work);

// C_ij = (A^T B)_ij for A (K x M), B (K x N): C_ml = sum_k A_km^T B_kl. Each rank all-gathers the
// blocks of A in its row (A_k0 .. A_k(q-1)), forms the q partials A_km^T B_kl, and a
// reduce-scatter along the column sums partial m onto rank (m, l). The backward of summa_ab for B.
void summa_atb(Gemm& gemm, Grid2D& grid, const float* A, const float* B, float* C, int64_t M,
               int64_t N, int64_t K, float* work);

// 2.5D (Tesseract, Wang et al. 2021): size q x q x d, d layers of q x q grids. The rows
// (tokens: the batch) are split across the depth, layer by layer, and each layer runs the 2D
// blocks above on its rows; weights are replicated across the depth. The weight gradient of
// Y = X W (X: rows x in, W: in x out) is therefore the layer's summa_atb, summed over the `depth`
// group (the d ranks at the same grid position): one all-reduce of in out / q^2 floats. `rows`
// is the layer's row count (the global rows / d).
void tesseract_weight_grad(Gemm& gemm, Grid2D& layer, TensorGroup& depth, const float* X,
                           const float* dY, float* dW, int64_t rows, int64_t in, int64_t out,
                           float* work);

// Floats of `work` any of the three products needs for these global sizes.
std::size_t summa_work_floats(int64_t M, int64_t N, int64_t K, int q);

// Layernorm over the `cols` columns of X (rows x cols), held as blocks X_ij of rows/q x cols/q
// with weight_j and bias_j (the block's columns of gamma and beta, replicated down the grid
// column). The mean, then the variance, are row sums all-reduced over the grid row (two passes,
// as the single-rank kernel, so results agree to rounding). Saves mean and rstd (rows/q).
// work: 2 * rows/q floats.
void layernorm2d_forward(Grid2D& grid, float* out, float* mean, float* rstd, const float* x,
                         const float* weight, const float* bias, int64_t rows, int64_t cols,
                         float eps, float* work);

// dx += the input gradient; dweight and dbias += this block's rows' part of the parameter
// gradients (the caller sums them down the grid column with the other gradients of parameters
// replicated there). The two row sums of the input gradient are one all-reduce over the row.
// work: 2 * rows/q floats.
void layernorm2d_backward(Grid2D& grid, float* dx, float* dweight, float* dbias, const float* dout,
                          const float* x, const float* weight, const float* mean,
                          const float* rstd, int64_t rows, int64_t cols, float* work);

// The same over any split of the columns: this rank holds r rows and c of their `cols` columns,
// the other columns being on the ranks of `across` (the grid row in 2D; in 3D the group that
// splits the layout's columns).
void layernorm_split_forward(TensorGroup& across, float* out, float* mean, float* rstd,
                             const float* x, const float* weight, const float* bias, int64_t r,
                             int64_t c, int64_t cols, float eps, float* work);
void layernorm_split_backward(TensorGroup& across, float* dx, float* dweight, float* dbias,
                              const float* dout, const float* x, const float* weight,
                              const float* mean, const float* rstd, int64_t r, int64_t c,
                              int64_t cols, float* work);

// Cross-entropy of logits held with rows blocked by grid row and vocabulary columns
// [v0, v0 + valid) on this rank (leading dimension ld; columns past `valid` are padding): the
// vocabulary-parallel cross-entropy over `group` (the grid row in 2D, the tensor group in 1D).
// losses (n rows) assigned; with grad_scale != 0 the logits become grad_scale (softmax - onehot).
// work: 3 n floats. With a profiler, the kernels count as loss and the collectives as
// communication.
void vocab_parallel_cross_entropy(TensorGroup& group, float* logits, float* losses,
                                  const int32_t* targets, int64_t n, int ld, int valid, int64_t v0,
                                  float grad_scale, float* work, Profiler* profiler = nullptr);

}  // namespace colossal::core
