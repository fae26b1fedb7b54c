// The GEMM-based layers (linear, causal self-attention) as explicit forward/backward pairs.
// Element-wise layers are in kernels.hpp; the model composes both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/gemm.hpp"

namespace colossal::core {

// How a linear layer's weight is stored: GPT-2's Conv1D keeps W[in, out] (Y = X W); nn.Linear,
// as in OPT, keeps W[out, in] (Y = X W^T). Parameters keep the Hugging Face layout, and the GEMM
// transposes as needed, so no weight is ever copied.
enum class WeightLayout { in_out, out_in };

// out(N, ld_out)[:, :out_features] += inp(N, ld_in) W. The caller fills out with the bias (and the
// residual, for projections into the residual stream) first, or passes accumulate = false (out
// = inp W) and adds the bias in an epilogue. inp may be stored in bf16 (Gemm::gemm_mixed), in
// linear_backward too.
void linear_forward(Gemm& gemm, WeightLayout layout,
                    float* out, int ld_out,          // (N, out_features)
                    GemmOperand inp, int ld_in,      // (N, in_features)
                    const float* weight,             // (in,out) or (out,in)
                    int in_features, int out_features, int64_t N, bool accumulate = true);

// dinp = dout W^T (or += when accumulate); dweight += ...; dbias += column sums of dout (dbias
// null: a linear without bias).
void linear_backward(Gemm& gemm, WeightLayout layout,
                     float* dinp, int ld_dinp,         // (N, in_features)
                     float* dweight, float* dbias,     // like weight, (out_features)
                     const float* dout, int ld_dout,   // (N, out_features)
                     GemmOperand inp, int ld_in,       // (N, in_features)
                     const float* weight, int in_features, int out_features, int64_t N,
                     bool accumulate);

// Causal multi-head self-attention. qkv holds Q, K, V as column blocks of each row (B,T,3C); head
// h uses columns [h*hs, (h+1)*hs) of each block. Saves the softmax probabilities att (B,H,T,T).
// qkv is read by matrix products only, so it may be stored in bf16 (Gemm::gemm_mixed), in the
// backward and in the fused forms too. With att_bf16 the probabilities are saved there as bf16
// patterns instead, and att is one sequence's (H,T,T) fp32 work buffer.
void attention_forward(Gemm& gemm,
                       float* att,        // (B,H,T,T) out: probabilities
                       float* atty,       // (B,T,C) out: heads side by side
                       GemmOperand qkv,   // (B,T,3C)
                       int B, int T, int C, int H, std::uint16_t* att_bf16 = nullptr);

// dqkv (B,T,3C) assigned; datt_scratch holds (H,T,T) floats.
void attention_backward(Gemm& gemm, float* dqkv, float* datt_scratch,
                        const float* datty,  // (B,T,C)
                        GemmOperand qkv,     // (B,T,3C)
                        GemmOperand att,     // (B,H,T,T), fp32 or bf16
                        int B, int T, int C, int H);

}  // namespace colossal::core

namespace colossal::core {

// Ring self-attention (Li et al. 2021, "Sequence Parallelism: Long Sequence Training from System
// Perspective"): the `ring` group of S ranks splits every sequence of T = S*Tl positions into
// contiguous chunks, rank s holding positions [s*Tl, (s+1)*Tl) of Q, K and V (qkv (B,Tl,3C)).
// Forward passes the key blocks around the ring (S-1 steps) to fill this rank's rows of the scores
// (B,H,Tl,T), applies the causal softmax by global position, then passes the value blocks to sum
// the output. Blocks after this rank's (all keys in the future) are skipped. Backward passes the
// value blocks (dP, and this rank's part of every block's dV), then the key blocks (dQ, and its
// part of every dK); the dK/dV parts are reduce-scattered to their owners. `ring_block` holds
// 2*B*Tl*C floats, `dkv_all` 2*S*B*Tl*C, `datt` B*H*Tl*T.
class TensorGroup;
void ring_attention_forward(Gemm& gemm, TensorGroup& ring, float* att, float* atty,
                            const float* qkv, float* ring_block, int B, int Tl, int C, int H);
void ring_attention_backward(Gemm& gemm, TensorGroup& ring, float* dqkv, float* datt,
                             const float* datty, const float* qkv, const float* att,
                             float* ring_block, float* dkv_all, int B, int Tl, int C, int H);

// Fused causal attention: the same result as attention_forward/backward without the (B,H,T,T)
// probability matrix (FlashAttention's algorithm, Dao et al. 2022, on the host). Each head's
// queries and keys are cut into tiles of `tile` positions; for a query tile, the key tiles at or
// before it (the causal mask skips the rest: about half the products of the dense path) each give
// a tile x tile block of scores by one GEMM, folded into the output by an online softmax (running
// row maximum and sum, the output rescaled when the maximum grows) and a second GEMM. Only the
// log-sum-exp of each row is saved; backward recomputes each block's probabilities from it and
// gets dV, dP, dQ and dK from four GEMMs per block. Activation memory is linear in T; the work
// buffer is fused_attention_work_floats(tile) floats whatever T is.
constexpr int kAttentionTile = 128;
constexpr std::size_t fused_attention_work_floats(int tile = kAttentionTile) {
  return 2 * std::size_t(tile) * tile + 2 * std::size_t(tile);
}
void fused_attention_forward(Gemm& gemm,
                             float* lse,        // (B,H,T) out: log-sum-exp of each row's scores
                             float* atty,       // (B,T,C) out
                             GemmOperand qkv,   // (B,T,3C)
                             float* work,       // fused_attention_work_floats(tile)
                             int B, int T, int C, int H, int tile = kAttentionTile);

// dqkv (B,T,3C) assigned.
void fused_attention_backward(Gemm& gemm, float* dqkv, const float* datty, const float* atty,
                              GemmOperand qkv, const float* lse, float* work, int B, int T,
                              int C, int H, int tile = kAttentionTile);

// The fused attention a model runs (`model.fused_attention: true`). Where Kokkos runs on a GPU:
// with q/k/v in bf16 the tensor-core kernels (core/attention_tc.hpp), in fp32 the Kokkos team
// kernels (core/attention_team.hpp), neither with a work buffer and each a few launches on
// Kokkos' stream; elsewhere fused_attention_forward/backward above. Same arguments.
void model_fused_attention_forward(Gemm& gemm, float* lse, float* atty, GemmOperand qkv,
                                   float* work, int B, int T, int C, int H);
void model_fused_attention_backward(Gemm& gemm, float* dqkv, const float* datty,
                                    const float* atty, GemmOperand qkv, const float* lse,
                                    float* work, int B, int T, int C, int H);
// Why `model.fused_attention` cannot run this head on this build (empty when it can): a GPU build
// runs bf16 q/k/v on the tensor cores, whose steps need a head size that is a multiple of 16.
std::string fused_attention_unsupported(int head_size, bool bf16_qkv);
// What `model.fused_attention: true` runs on this build for a head of `head_size` with q/k/v
// in bf16 or not, for the trainer's start-up lines (a GPU build asks the device for its tile).
std::string fused_attention_description(int head_size, bool bf16_qkv);

}  // namespace colossal::core
