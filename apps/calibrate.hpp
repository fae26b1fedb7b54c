// colossal_plan --calibrate: this host's rates measured with the real kernels, for the cost model.
#pragma once

#include "parallel/communicator.hpp"
#include "planner/hardware.hpp"

namespace colossal::apps {

// Runs GEMMs of several sizes (fp32, and bf16 on the two largest: bf16_flops), both attention
// cores, layernorm + GELU (memory-bound work counted as the step graph counts it) and an AdamW
// update where the build runs its kernels, and, with two or more ranks in `world`, a ping-pong
// between ranks 0 and 1 for the link's latency and bandwidth (one rank: a memory copy stands in
// for the bandwidth). On a GPU build (CUDA Kokkos) the kernels ran on the device, and it also
// measures the device's memory and count, the host link (pinned copies each way), the host's
// AdamW for ZeRO offload, and the ranks' link as all-reduces of device buffers over the transport
// the trainer would choose (NCCL at one rank per GPU); comm_overlap is the GPU presets' 0.5.
// About 5-10 s. Every rank must call it.
planner::HardwareSpec calibrate_host(parallel::Communicator& world,
                                     const std::string& gemm_backend = "openblas");

}  // namespace colossal::apps
