// What the cost model knows about a device and its links: peak and achieved rates per kind of
// work, memory, and alpha-beta (latency, bandwidth) of the links inside and between nodes.
// Presets carry vendor peak numbers; `colossal_plan --calibrate` measures this host's rates with
// the real kernels and writes them as a hardware YAML that `hardware.file` reads back.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace colossal::planner {

struct LinkSpec {
  double latency_s = 0.0;      // alpha: seconds per message
  double bandwidth_Bps = 0.0;  // beta: bytes per second per direction
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
  int devices_per_node = 1;
  int threads = 0;             // host: threads per rank the rates were measured with (0: n/a)
  LinkSpec intra_node, inter_node;

  // Achieved GEMM FLOP/s for one call of `flops` in this precision (log-log interpolation of the
  // curve, clamped at its ends; the bf16 peak scales it when the curve is fp32).
  double gemm_rate(double flops, bool bf16 = false) const;
  double peak_flops(bool bf16 = false) const { return bf16 && bf16_flops > 0 ? bf16_flops : fp32_flops; }
};

// Names accepted by hardware.preset and --hardware.
std::vector<std::string> hardware_presets();
// Throws std::invalid_argument listing the presets for an unknown name.
HardwareSpec hardware_preset(const std::string& name);

// The hardware YAML (docs in planner/README.md). read throws std::runtime_error naming the file
// and the key on a missing or bad value.
HardwareSpec read_hardware(const std::string& path);
std::string hardware_yaml(const HardwareSpec& spec);

// Rates per rank when `threads` host threads run it instead of the calibrated spec.threads:
// compute scales with threads, memory bandwidth does not.
HardwareSpec scaled_to_threads(const HardwareSpec& spec, int threads);

}  // namespace colossal::planner
