// Which transport the run's communicators use, decided in one place (`choose_comm`, pure), from
// facts about the build and the node (`gather_comm_facts`, collective) and the config key
// `parallel.comm: auto | nccl | mpi`. `make_run_communicator` builds the world communicator for
// the choice; every communicator split from it has the same transport.
//
//   build keeps buffers in  request  rule                                          transport
//   host memory (CPU)       auto/mpi                                               host MPI
//   host memory (CPU)       nccl     error: NCCL needs a CUDA build
//   device memory (CUDA)    nccl     error without NCCL, without a GPU, or with two ranks
//                                    on one GPU (NCCL refuses them); else          NCCL
//   device memory (CUDA)    mpi      CUDA-aware MPI if the MPI says so, else       staged MPI
//   device memory (CUDA)    auto     NCCL if built, several ranks, a GPU per rank and no GPU
//                                    shared by two ranks; else CUDA-aware MPI;
//                                    else                                          staged MPI
//                                    (one rank: in-place collectives are no-ops, Communicator)
//   device memory, no GPU   auto/mpi                                               staged MPI
//
// The facts are agreed over the world before deciding (the most ranks sharing one GPU, CUDA-aware
// only if every rank's MPI is, a GPU only if every rank has one), so every rank decides alike and
// an impossible request throws on every rank together.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "parallel/communicator.hpp"

namespace colossal::parallel {

enum class CommRequest { automatic, nccl, mpi };
enum class Transport { host_mpi, nccl, cuda_aware_mpi, staged_mpi };

const char* comm_request_name(CommRequest request);  // "auto", "nccl", "mpi"
std::optional<CommRequest> parse_comm_request(std::string_view name);
const char* transport_name(Transport transport);  // "host MPI", "NCCL", ...

struct CommFacts {
  bool device_memory = false;   // the build keeps model buffers in device memory (CUDA Kokkos)
  bool nccl_built = false;      // NcclCommunicator is compiled in (COLOSSAL_HAVE_CUDA)
  bool mpi_cuda_aware = false;  // MPI accepts device pointers (MPIX_Query_cuda_support)
  bool every_rank_has_gpu = false;
  int ranks_per_gpu = 1;        // the most ranks of one node using the same GPU
  int ranks = 1;                // world size
};

struct CommChoice {
  Transport transport = Transport::host_mpi;
  std::string reason;  // why, in words, for the start-up line
  std::string describe() const;  // "NCCL (reason)"
};

// The pure decision (the table above). A request that cannot work throws std::invalid_argument
// naming parallel.comm, the value and the rule.
CommChoice choose_comm(const CommFacts& facts, CommRequest requested);

// This build's and node's facts, agreed over MPI_COMM_WORLD (collective; MPI initialised). The
// calling rank's GPU is the CUDA current device (parallel::select_local_device set it).
CommFacts gather_comm_facts();

// The test switch: COLOSSAL_TEST_STAGED_COMM=1 forces the staged transport with host memory
// standing in for the device (every float buffer is copied through the staging buffers), so the
// CPU build exercises the staged path end to end.
bool staged_comm_forced();

struct RunCommunicator {
  std::unique_ptr<Communicator> world;
  CommChoice choice;
};

// The world communicator for `requested` (the value of parallel.comm; collective over
// MPI_COMM_WORLD). Throws std::invalid_argument for an unknown value or a choice that cannot work.
RunCommunicator make_run_communicator(std::string_view requested);

}  // namespace colossal::parallel
