// What the cost model knows about a device and its links: peak and achieved rates per kind of
// work, memory, and alpha-beta (latency, bandwidth) of the links inside and between nodes.
// Presets carry vendor peak numbers; `colossal_plan --calibrate` measures this host's rates with
// the real kernels and writes them as a hardware YAML that `hardware.file` reads back.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace colossal::planner {

struct LinkSpec {
  double latency_s = 0.0;      // alpha: seconds per message
  double bandwidth_Bps = 0.0;  // beta: bytes per second per direction
};

// The attention core's forms, as the cost model prices them: the dense (B,H,T,T) path, the fused
// (tiled online-softmax) one in fp32, and the fused one with q/k/v in bf16.
enum class AttentionForm { dense, fused, fused_bf16 };

// One measured shape of an attention form: the length of the query and key blocks its products
// multiply (T; a ring attention's local block), the head width, and the achieved FLOP/s of
// forward + backward counted as the step graph counts them (12 x pairs x head width).
struct AttentionPoint {
  double seq = 0.0;
  double head_dim = 0.0;
  double flops = 0.0;
};

struct HardwareSpec {
  std::string name;
  // Peak GEMM FLOP/s per device by dtype (MFU is reported against the precision's peak).
  double fp32_flops = 0.0;
  double bf16_flops = 0.0;
  // Achieved GEMM FLOP/s as a function of one call's FLOPs (measured; sorted by FLOPs). Empty:
  // gemm_efficiency * peak for every call.
  std::vector<std::pair<double, double>> gemm_curve;
  double gemm_efficiency = 0.7;
  // Achieved FLOP/s of the attention core (dense: two batched GEMMs and a softmax; fused: the
  // tiled online-softmax kernel), forward and backward.
  double attention_flops = 0.0;
  double fused_attention_flops = 0.0;
  // The fused core with q/k/v in bf16 (train.precision: bf16): on a GPU the tensor-core kernels
  // (core/attention_tc.hpp), on a host the same tiled path as fp32. 0: fused_attention_flops.
  double fused_attention_bf16_flops = 0.0;
  // The same rates by shape (colossal_plan --calibrate: a grid of sequence lengths x head
  // widths, every pair measured; its rate rises with the sequence and the head width, since
  // short blocks and thin heads make small products and the softmax a larger share). Empty:
  // the scalar rate above for every shape.
  std::vector<AttentionPoint> attention_curve;
  std::vector<AttentionPoint> fused_attention_curve;
  std::vector<AttentionPoint> fused_attention_bf16_curve;
  // Effective bytes/s of memory-bound kernels (layernorm, activation, embedding, loss) counted as
  // the step graph counts their bytes, and of the optimizer step (28 bytes per parameter).
  double memory_bandwidth = 0.0;
  double optimizer_bandwidth = 0.0;
  double memory_bytes = 0.0;   // per device
  // ZeRO offload: the host link (PCIe) each way and the host's AdamW rate per device; 0 link
  // bandwidth means host and device share memory (a CPU rank): offload costs no transfer.
  double host_link_bandwidth = 0.0;
  double host_optimizer_bandwidth = 0.0;
  // The host memory of one node, which its ranks' offloaded (pinned) bytes share. 0: not known,
  // not checked. Only where the device has a host link of its own: on a CPU rank offloaded
  // bytes already count against memory_bytes.
  double host_memory_bytes = 0.0;
  // The share of a started (non-blocking) data-parallel collective's time that runs beside the
  // compute: 0.5 on the GPU presets (NCCL moves it on its own stream but takes SMs and bandwidth
  // from the kernels beside it; planner/README.md), 0 where it moves only inside MPI calls (host
  // Open MPI, which the executor pokes at unit boundaries). It follows the preset, not the
  // transport: a GPU run over staged MPI is priced as if on NCCL.
  double comm_overlap = 0.0;
  // Where there is a host link, whether pipeline messages cross it twice around an MPI send, as
  // the staged transport (ranks sharing a GPU) sends them. False, the default, prices them as
  // direct device-to-device sends: NCCL's point-to-point, which the executor groups per
  // schedule step (parallel::pipeline_exchanges), as Megatron-LM runs them. Not a hardware YAML
  // key: it is the executor's (colossal_train sets it when its pipeline group is staged).
  bool pipeline_staged = false;
  int devices_per_node = 1;
  int threads = 0;             // host: threads per rank the rates were measured with (0: n/a)
  LinkSpec intra_node, inter_node;

  // Achieved GEMM FLOP/s for one call of `flops` in this precision (log-log interpolation of the
  // curve, clamped at its ends; the bf16 peak scales it when the curve is fp32).
  double gemm_rate(double flops, bool bf16 = false) const;
  // Achieved FLOP/s of an attention form at a block length and head width: log-log bilinear
  // interpolation of its curve, clamped at the grid's edges; without a curve its scalar rate.
  // fused_bf16 without a rate of its own (curve or scalar) is priced as fused.
  double attention_rate(AttentionForm form, double seq, double head_dim) const;
  double peak_flops(bool bf16 = false) const { return bf16 && bf16_flops > 0 ? bf16_flops : fp32_flops; }
};

// Names accepted by hardware.preset and --hardware.
std::vector<std::string> hardware_presets();
// Throws std::invalid_argument listing the presets for an unknown name.
HardwareSpec hardware_preset(const std::string& name);
// The preset of a GPU by its CUDA device name ("NVIDIA H100 80GB HBM3" -> "h100"; the PCIe and
// NVL H100s get the SXM one), or "" where none fits (a GH200's memory differs from both
// Hoppers', other GPUs have no preset): `colossal_plan --calibrate` measures those.
std::string preset_for_gpu(std::string_view device_name);

// The hardware YAML (docs in planner/README.md). read throws std::runtime_error naming the file
// and the key on a missing or bad value.
HardwareSpec read_hardware(const std::string& path);
std::string hardware_yaml(const HardwareSpec& spec);

// Rates per rank when `threads` host threads run it instead of the calibrated spec.threads:
// compute scales with threads, memory bandwidth does not.
HardwareSpec scaled_to_threads(const HardwareSpec& spec, int threads);

}  // namespace colossal::planner
