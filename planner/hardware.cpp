#include "planner/hardware.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <stdexcept>

namespace colossal::planner {

double HardwareSpec::gemm_rate(double flops, bool bf16) const {
  const double scale = bf16 && bf16_flops > 0 && fp32_flops > 0 ? bf16_flops / fp32_flops : 1.0;
  if (gemm_curve.empty()) return gemm_efficiency * peak_flops(bf16);
  if (flops <= gemm_curve.front().first) return gemm_curve.front().second * scale;
  if (flops >= gemm_curve.back().first) return gemm_curve.back().second * scale;
  for (std::size_t i = 1; i < gemm_curve.size(); ++i) {
    const auto [f1, r1] = gemm_curve[i];
    if (flops > f1) continue;
    const auto [f0, r0] = gemm_curve[i - 1];
    const double w = std::log(flops / f0) / std::log(f1 / f0);
    return std::exp(std::log(r0) + w * (std::log(r1) - std::log(r0))) * scale;
  }
  return gemm_curve.back().second * scale;
}

namespace {
// Where x lies between the sorted, distinct values xs: the bracketing indices and the weight of
// the upper one in log space (clamped at both ends).
struct Bracket {
  std::size_t lo = 0, hi = 0;
  double w = 0.0;
};
Bracket bracket(const std::vector<double>& xs, double x) {
  if (xs.size() < 2 || x <= xs.front()) return {0, 0, 0.0};
  if (x >= xs.back()) return {xs.size() - 1, xs.size() - 1, 0.0};
  std::size_t hi = 1;
  while (xs[hi] < x) ++hi;
  return {hi - 1, hi, std::log(x / xs[hi - 1]) / std::log(xs[hi] / xs[hi - 1])};
}

std::vector<double> distinct(const std::vector<AttentionPoint>& curve,
                             double AttentionPoint::*field) {
  std::vector<double> v;
  for (const AttentionPoint& p : curve) v.push_back(p.*field);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// The rate at grid point (seq, head_dim); 0 where the grid lacks it (read_hardware refuses that).
double grid_rate(const std::vector<AttentionPoint>& curve, double seq, double head_dim) {
  for (const AttentionPoint& p : curve) {
    if (p.seq == seq && p.head_dim == head_dim) return p.flops;
  }
  return 0.0;
}
}  // namespace

double HardwareSpec::attention_rate(AttentionForm form, double seq, double head_dim) const {
  if (form == AttentionForm::fused_bf16 && fused_attention_bf16_curve.empty() &&
      fused_attention_bf16_flops <= 0) {
    form = AttentionForm::fused;
  }
  const std::vector<AttentionPoint>& curve = form == AttentionForm::dense ? attention_curve
                                             : form == AttentionForm::fused
                                                 ? fused_attention_curve
                                                 : fused_attention_bf16_curve;
  const double scalar = form == AttentionForm::dense ? attention_flops
                        : form == AttentionForm::fused ? fused_attention_flops
                                                       : fused_attention_bf16_flops;
  if (curve.empty()) return scalar;
  const std::vector<double> seqs = distinct(curve, &AttentionPoint::seq);
  const std::vector<double> dims = distinct(curve, &AttentionPoint::head_dim);
  const Bracket s = bracket(seqs, seq), d = bracket(dims, head_dim);
  auto at = [&](std::size_t i, std::size_t j) {
    return std::log(std::max(grid_rate(curve, seqs[i], dims[j]), 1.0));
  };
  const double low = (1 - d.w) * at(s.lo, d.lo) + d.w * at(s.lo, d.hi);
  const double high = (1 - d.w) * at(s.hi, d.lo) + d.w * at(s.hi, d.hi);
  return std::exp((1 - s.w) * low + s.w * high);
}

namespace {
constexpr double G = 1e9, T = 1e12, GiB = 1024.0 * 1024.0 * 1024.0;

// A data-centre GPU from its datasheet: dense peaks (fp32 on the tensor cores as TF32, and on
// the CUDA cores), HBM bandwidth and capacity, NVLink per direction, one InfiniBand port per GPU.
// Achieved rates are fixed fractions of the peaks (GEMM 70%, dense attention 50%, memory-bound
// kernels 80% of HBM bandwidth): refine them by calibrating. The fused attention's rates count
// the dense core's FLOPs, as the step graph does, so skipping the causal half counts double:
// fp32 (Kokkos team kernels, plain FMAs from shared memory) 25% of the CUDA cores' peak, bf16
// (WMMA tensor cores) 30% of the bf16 peak. Both are estimates until a GPU's --calibrate.
HardwareSpec gpu(const char* name, double fp32_tflops, double cuda_core_fp32_tflops,
                 double bf16_tflops, double hbm_tbs, double memory_gb, double nvlink_gbs,
                 double ib_gbits, double pcie_gbs, double host_memory_gib) {
  HardwareSpec h;
  h.name = name;
  h.fp32_flops = fp32_tflops * T;
  h.bf16_flops = bf16_tflops * T;
  h.gemm_efficiency = 0.7;
  h.attention_flops = 0.5 * h.fp32_flops;
  h.fused_attention_flops = 0.25 * cuda_core_fp32_tflops * T;
  h.fused_attention_bf16_flops = 0.3 * h.bf16_flops;
  h.memory_bandwidth = 0.8 * hbm_tbs * T;
  h.optimizer_bandwidth = 0.8 * hbm_tbs * T;
  h.memory_bytes = memory_gb * 1e9;
  h.host_link_bandwidth = pcie_gbs * G;
  h.host_optimizer_bandwidth = 5 * G;  // a node's CPU AdamW shared by its 8 GPUs
  h.host_memory_bytes = host_memory_gib * GiB;
  h.devices_per_node = 8;
  // NCCL moves started collectives on its own stream, but takes SMs and HBM bandwidth from the
  // kernels beside it: half its time hidden. Fitted to Megatron-LM (2021) Table 2's ZeRO-3 rows
  // (tests/test_planner.cpp): none hidden predicts them 15-34% slow, all hidden 33% fast,
  // half 5-21% slow.
  h.comm_overlap = 0.5;
  h.intra_node = {3e-6, nvlink_gbs * G};
  h.inter_node = {8e-6, ib_gbits / 8 * G};
  return h;
}

// This development machine (2 cores of an AMD EPYC with AVX-512 and AVX512-BF16) as
// `colossal_plan --calibrate` measured it on 2026-12-06 with 2 threads in one rank and the
// default hardware.gemm (OpenBLAS; OPENBLAS_CORETYPE unset, as a user's environment leaves it):
// with them the cost model predicted gpt2-124m's step (B=4, T=256) within 6% and the
// quickstart's within 8%, where the numbers of 2026-11-30 (taken before the host kernels were
// vectorised and threaded: layernorm, attention and AdamW 4-9x slower) predicted +95% and +76%.
// `colossal_plan --calibrate` measures another machine; MFU on a CPU is against its peak
// measured at start-up (apps::job_peak_flops), not against these.
HardwareSpec host() {
  HardwareSpec h;
  h.name = "host";
  h.gemm_curve = {{2.10e6, 230 * G}, {1.68e7, 362 * G}, {2.68e8, 467 * G}, {1.07e9, 455 * G},
                  {2.42e9, 490 * G}, {9.66e9, 474 * G}, {3.44e10, 499 * G}};
  for (const auto& point : h.gemm_curve) h.fp32_flops = std::max(h.fp32_flops, point.second);
  // [sequence length, head width, GFLOP/s] of each attention form, forward and backward; bf16
  // with the default GEMM is the emulation, slower than fp32.
  const auto grid = [](std::initializer_list<double> rates) {
    std::vector<AttentionPoint> points;
    auto rate = rates.begin();
    for (double seq : {128.0, 512.0, 2048.0}) {
      for (double width : {32.0, 64.0, 128.0}) points.push_back({seq, width, *rate++ * G});
    }
    return points;
  };
  h.attention_curve = grid({105, 145, 160, 177, 282, 374, 159, 256, 355});
  h.fused_attention_curve = grid({148, 191, 239, 241, 324, 403, 293, 388, 230});
  h.fused_attention_bf16_curve = grid({52, 83, 130, 83, 137, 214, 97, 158, 107});
  // The scalar rates (a hardware YAML's *_gflops) as --calibrate writes them: T = 512, width 64.
  h.attention_flops = h.attention_rate(AttentionForm::dense, 512, 64);
  h.fused_attention_flops = h.attention_rate(AttentionForm::fused, 512, 64);
  h.fused_attention_bf16_flops = h.attention_rate(AttentionForm::fused_bf16, 512, 64);
  h.memory_bandwidth = 25 * G;
  h.optimizer_bandwidth = 69 * G;
  h.memory_bytes = 24 * GiB;
  h.threads = 2;
  // Between two ranks of this machine (Open MPI's shared memory; --calibrate under mpirun -np 2,
  // ping-pong between ranks 0 and 1); between nodes still the estimate of 2026-11-30.
  h.intra_node = {0.15e-6, 8.7 * G};
  h.inter_node = {2e-6, 5 * G};
  return h;
}
}  // namespace

std::vector<std::string> hardware_presets() {
  return {"host", "a100-40g", "a100-80g", "h100", "h200", "v100"};
}

std::string preset_for_gpu(std::string_view name) {
  const auto has = [&](std::string_view part) { return name.find(part) != std::string_view::npos; };
  if (has("GH200")) return "";
  if (has("H200")) return "h200";
  if (has("H100")) return "h100";
  if (has("A100")) return has("80GB") ? "a100-80g" : "a100-40g";
  if (has("V100")) return "v100";
  return "";
}

HardwareSpec hardware_preset(const std::string& name) {
  // fp32 is the TF32 tensor-core peak on A100/H100/H200 (what cuBLAS uses for fp32 GEMMs with
  // TF32 enabled); V100 has no TF32 and runs fp32 on CUDA cores.
  if (name == "host") return host();
  // Links at the bus bandwidth NCCL reaches on them (nccl-tests all-reduce busbw: about 230 GB/s
  // on A100 NVSwitch of a 300 GB/s per-direction NVLink, 360 on H100/H200 of 450, 130 on V100 of
  // 150) and about 92% of the InfiniBand line rate.
  // Host memory per node as NVIDIA's 8-GPU systems ship it: DGX A100 1 TB (40 GB GPUs) or 2 TB
  // (80 GB), DGX H100 and H200 2 TB, DGX-1 (V100) 512 GB; a cluster's own nodes may have less,
  // which host_memory_gib in a hardware file (or --calibrate's MemTotal) says.
  // CUDA-core fp32 peaks: A100 19.5, H100/H200 SXM 67, V100 15.7 TFLOP/s.
  if (name == "a100-40g") return gpu("a100-40g", 156, 19.5, 312, 1.555, 40, 230, 0.92 * 200, 25, 1024);
  if (name == "a100-80g") return gpu("a100-80g", 156, 19.5, 312, 2.039, 80, 230, 0.92 * 200, 25, 2048);
  if (name == "h100") return gpu("h100", 494, 67, 989, 3.35, 80, 360, 0.92 * 400, 50, 2048);
  if (name == "h200") return gpu("h200", 494, 67, 989, 4.8, 141, 360, 0.92 * 400, 50, 2048);
  if (name == "v100") {
    // No bf16 tensor cores (WMMA's bf16 needs sm_80): bf16 runs' fused attention at fp32's rate.
    HardwareSpec h = gpu("v100", 15.7, 15.7, 125, 0.9, 32, 130, 0.92 * 100, 12, 512);
    h.fused_attention_bf16_flops = 0.0;
    return h;
  }
  std::string names;
  for (const std::string& n : hardware_presets()) names += (names.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown hardware preset '" + name + "' (known: " + names +
                              "); or give a calibrated file with hardware.file");
}

HardwareSpec scaled_to_threads(const HardwareSpec& spec, int threads) {
  if (spec.threads <= 0 || threads <= 0 || threads == spec.threads) return spec;
  HardwareSpec h = spec;
  const double k = double(threads) / spec.threads;
  h.fp32_flops *= k;
  h.bf16_flops *= k;
  for (auto& point : h.gemm_curve) point.second *= k;
  h.attention_flops *= k;
  h.fused_attention_flops *= k;
  h.fused_attention_bf16_flops *= k;
  for (auto* curve :
       {&h.attention_curve, &h.fused_attention_curve, &h.fused_attention_bf16_curve}) {
    for (AttentionPoint& point : *curve) point.flops *= k;
  }
  h.threads = threads;
  return h;
}

namespace {
// Keys of the YAML, with the unit each is written in.
using Rate = double HardwareSpec::*;  // an alias: nvcc's host pass warns on the bare declarator
struct Field {
  const char* key;
  Rate value;
  double unit;
};
const Field kFields[] = {
    {"fp32_tflops", &HardwareSpec::fp32_flops, T},
    {"bf16_tflops", &HardwareSpec::bf16_flops, T},
    {"gemm_efficiency", &HardwareSpec::gemm_efficiency, 1.0},
    {"attention_gflops", &HardwareSpec::attention_flops, G},
    {"fused_attention_gflops", &HardwareSpec::fused_attention_flops, G},
    {"fused_attention_bf16_gflops", &HardwareSpec::fused_attention_bf16_flops, G},
    {"memory_bandwidth_gbs", &HardwareSpec::memory_bandwidth, G},
    {"optimizer_bandwidth_gbs", &HardwareSpec::optimizer_bandwidth, G},
    {"memory_gib", &HardwareSpec::memory_bytes, GiB},
    {"host_link_gbs", &HardwareSpec::host_link_bandwidth, G},
    {"host_optimizer_gbs", &HardwareSpec::host_optimizer_bandwidth, G},
    {"host_memory_gib", &HardwareSpec::host_memory_bytes, GiB},
    {"comm_overlap", &HardwareSpec::comm_overlap, 1.0},
};

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// The attention curves: key, and the member holding each.
using Curve = std::vector<AttentionPoint> HardwareSpec::*;
struct CurveField {
  const char* key;
  Curve curve;
};
const CurveField kAttentionCurves[] = {
    {"attention_curve", &HardwareSpec::attention_curve},
    {"fused_attention_curve", &HardwareSpec::fused_attention_curve},
    {"fused_attention_bf16_curve", &HardwareSpec::fused_attention_bf16_curve},
};
}  // namespace

std::string hardware_yaml(const HardwareSpec& h) {
  std::string out = "# colossal hardware spec (planner/README.md): rates per device (per rank on a host)\n";
  out += "name: \"" + h.name + "\"\n";
  for (const Field& f : kFields) out += std::string(f.key) + ": " + number(h.*(f.value) / f.unit) + "\n";
  out += "devices_per_node: " + std::to_string(h.devices_per_node) + "\n";
  out += "threads: " + std::to_string(h.threads) + "\n";
  out += "gemm_curve:   # [FLOPs of one call, achieved GFLOP/s]\n";
  for (const auto& [flops, rate] : h.gemm_curve) out += "  - [" + number(flops) + ", " + number(rate / G) + "]\n";
  if (h.gemm_curve.empty()) out += "  []\n";
  for (const CurveField& c : kAttentionCurves) {
    const std::vector<AttentionPoint>& curve = h.*(c.curve);
    if (curve.empty()) continue;
    out += std::string(c.key) + ":   # [sequence length, head width, achieved GFLOP/s]\n";
    for (const AttentionPoint& p : curve) {
      out += "  - [" + number(p.seq) + ", " + number(p.head_dim) + ", " + number(p.flops / G) +
             "]\n";
    }
  }
  auto link = [&](const char* key, const LinkSpec& l) {
    out += std::string(key) + ": {latency_us: " + number(l.latency_s * 1e6) +
           ", bandwidth_gbs: " + number(l.bandwidth_Bps / G) + "}\n";
  };
  link("intra_node", h.intra_node);
  link("inter_node", h.inter_node);
  return out;
}

HardwareSpec read_hardware(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw std::runtime_error("hardware file " + path + ": " + e.what() +
                             "; write one with colossal_plan --calibrate --out " + path);
  }
  auto bad = [&](const std::string& key, const std::string& what) {
    return std::runtime_error("hardware file " + path + ": " + key + " " + what +
                              " (see planner/README.md for the format)");
  };
  auto positive = [&](const YAML::Node& node, const std::string& key) {
    if (!node) throw bad(key, "is missing");
    double v = 0;
    try {
      v = node.as<double>();
    } catch (const YAML::Exception&) {
      throw bad(key, "must be a number");
    }
    if (!(v >= 0) || !std::isfinite(v)) throw bad(key, "must be a finite number >= 0");
    return v;
  };
  HardwareSpec h;
  h.name = root["name"] ? root["name"].as<std::string>() : path;
  for (const Field& f : kFields) {
    // The offload keys, comm_overlap and the bf16 fused attention came later: absent means a
    // CPU host (no transfer, the device's rate, collectives progressed only inside MPI calls)
    // and the fp32 fused attention's rate.
    const bool optional = std::string(f.key).rfind("host_", 0) == 0 ||
                          std::string(f.key) == "comm_overlap" ||
                          std::string(f.key) == "fused_attention_bf16_gflops";
    if (optional && !root[f.key]) continue;
    h.*(f.value) = positive(root[f.key], f.key) * f.unit;
  }
  if (h.host_optimizer_bandwidth == 0.0) h.host_optimizer_bandwidth = h.optimizer_bandwidth;
  h.devices_per_node = int(positive(root["devices_per_node"], "devices_per_node"));
  h.threads = root["threads"] ? int(positive(root["threads"], "threads")) : 0;
  if (h.fp32_flops <= 0) throw bad("fp32_tflops", "must be > 0");
  if (h.devices_per_node < 1) throw bad("devices_per_node", "must be >= 1");
  if (h.comm_overlap > 1) throw bad("comm_overlap", "must be a share between 0 and 1");
  if (const YAML::Node curve = root["gemm_curve"]; curve && curve.IsSequence()) {
    for (std::size_t i = 0; i < curve.size(); ++i) {
      const std::string key = "gemm_curve[" + std::to_string(i) + "]";
      if (!curve[i].IsSequence() || curve[i].size() != 2) throw bad(key, "must be [flops, gflops]");
      h.gemm_curve.emplace_back(positive(curve[i][0], key), positive(curve[i][1], key) * G);
    }
    std::sort(h.gemm_curve.begin(), h.gemm_curve.end());
  }
  // The attention curves came later and are optional; each is a full grid (every sequence
  // length with every head width), so the rate interpolates between measured points only.
  for (const CurveField& c : kAttentionCurves) {
    const YAML::Node curve = root[c.key];
    if (!curve || curve.IsNull()) continue;
    if (!curve.IsSequence()) throw bad(c.key, "must be a list of [seq, head_dim, gflops]");
    std::vector<AttentionPoint>& points = h.*(c.curve);
    for (std::size_t i = 0; i < curve.size(); ++i) {
      const std::string key = std::string(c.key) + "[" + std::to_string(i) + "]";
      if (!curve[i].IsSequence() || curve[i].size() != 3) {
        throw bad(key, "must be [sequence length, head width, gflops]");
      }
      AttentionPoint p{positive(curve[i][0], key), positive(curve[i][1], key),
                       positive(curve[i][2], key) * G};
      if (p.seq <= 0 || p.head_dim <= 0 || p.flops <= 0) throw bad(key, "must be > 0");
      if (grid_rate(points, p.seq, p.head_dim) > 0) {
        throw bad(key, "repeats sequence length " + number(p.seq) + " and head width " +
                           number(p.head_dim));
      }
      points.push_back(p);
    }
    const std::vector<double> seqs = distinct(points, &AttentionPoint::seq);
    const std::vector<double> dims = distinct(points, &AttentionPoint::head_dim);
    if (points.size() != seqs.size() * dims.size()) {
      throw bad(c.key, "must measure every sequence length with every head width (" +
                           std::to_string(seqs.size()) + " x " + std::to_string(dims.size()) +
                           " points, " + std::to_string(points.size()) + " given)");
    }
  }
  auto link = [&](const char* key) {
    const YAML::Node node = root[key];
    if (!node || !node.IsMap()) throw bad(key, "must be {latency_us: .., bandwidth_gbs: ..}");
    return LinkSpec{positive(node["latency_us"], std::string(key) + ".latency_us") * 1e-6,
                    positive(node["bandwidth_gbs"], std::string(key) + ".bandwidth_gbs") * G};
  };
  h.intra_node = link("intra_node");
  h.inter_node = link("inter_node");
  return h;
}

}  // namespace colossal::planner
