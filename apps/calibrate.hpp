// colossal_plan --calibrate: this host's rates measured with the real kernels, for the cost model.
#pragma once

#include "parallel/communicator.hpp"
#include "planner/hardware.hpp"

namespace colossal::apps {

// Runs GEMMs of several sizes, both attention cores, layernorm + GELU (memory-bound work counted
// as the step graph counts it) and an AdamW update on this rank's threads, and, with two or more
// ranks in `world`, a ping-pong between ranks 0 and 1 for the link's latency and bandwidth (one
// rank: a memory copy stands in for the bandwidth). About 5-10 s. Every rank must call it.
planner::HardwareSpec calibrate_host(parallel::Communicator& world,
                                     const std::string& gemm_backend = "openblas");

}  // namespace colossal::apps
