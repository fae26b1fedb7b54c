#include "parallel/comm_choice.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "core/kokkos_compat.hpp"
#include "parallel/local_device.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/staged_communicator.hpp"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's MPIX_CUDA_AWARE_SUPPORT and MPIX_Query_cuda_support
#endif

#ifdef COLOSSAL_HAVE_CUDA
#include <cuda_runtime.h>

#include "parallel/nccl_communicator.hpp"
#endif

namespace colossal::parallel {

const char* comm_request_name(CommRequest request) {
  switch (request) {
    case CommRequest::automatic: return "auto";
    case CommRequest::nccl: return "nccl";
    case CommRequest::mpi: return "mpi";
  }
  return "?";
}

std::optional<CommRequest> parse_comm_request(std::string_view name) {
  for (CommRequest r : {CommRequest::automatic, CommRequest::nccl, CommRequest::mpi}) {
    if (name == comm_request_name(r)) return r;
  }
  return std::nullopt;
}

const char* transport_name(Transport transport) {
  switch (transport) {
    case Transport::host_mpi: return "host MPI";
    case Transport::nccl: return "NCCL";
    case Transport::cuda_aware_mpi: return "CUDA-aware MPI";
    case Transport::staged_mpi: return "MPI through pinned host staging";
  }
  return "?";
}

std::string CommChoice::describe() const {
  return std::string(transport_name(transport)) + " (" + reason + ")";
}

namespace {

[[noreturn]] void refuse(CommRequest requested, const std::string& rule, const std::string& fix) {
  throw std::invalid_argument(std::string("parallel.comm: ") + comm_request_name(requested) +
                              " cannot work: " + rule + "; " + fix);
}

std::string sharing(const CommFacts& f) {
  return std::to_string(f.ranks_per_gpu) + " ranks of one node share a GPU";
}

}  // namespace

CommChoice choose_comm(const CommFacts& f, CommRequest requested) {
  const std::string by = requested == CommRequest::automatic ? "parallel.comm: auto, "
                                                             : std::string("parallel.comm: ") +
                                                                   comm_request_name(requested) +
                                                                   ", ";
  if (!f.device_memory) {
    if (requested == CommRequest::nccl) {
      refuse(requested, "NCCL needs a CUDA build (this build keeps every buffer in host memory)",
             "set parallel.comm: auto or mpi, or build with ./setup.sh --cuda");
    }
    return {Transport::host_mpi, by + "this build keeps buffers in host memory"};
  }
  const bool nccl_possible = f.nccl_built && f.every_rank_has_gpu && f.ranks_per_gpu <= 1;
  if (requested == CommRequest::nccl) {
    if (!f.nccl_built) {
      refuse(requested, "this build has no NCCL", "set parallel.comm: auto or mpi");
    }
    if (!f.every_rank_has_gpu) {
      refuse(requested, "NCCL needs a CUDA device on every rank and some rank has none",
             "run on GPU nodes or set parallel.comm: mpi");
    }
    if (f.ranks_per_gpu > 1) {
      refuse(requested,
             "NCCL refuses two ranks of one communicator on the same GPU and " + sharing(f),
             "start one rank per GPU, or set parallel.comm: mpi (or auto) to go through "
             "pinned host staging");
    }
    return {Transport::nccl, by + "one GPU per rank"};
  }
  if (requested == CommRequest::automatic && nccl_possible && f.ranks > 1) {
    return {Transport::nccl, by + "device buffers and one GPU per rank"};
  }
  std::string why = by + "device buffers";
  if (requested == CommRequest::automatic) {
    why += f.ranks == 1             ? ", one rank (nothing crosses ranks: no NCCL set-up)"
           : !f.nccl_built          ? ", no NCCL in this build"
           : !f.every_rank_has_gpu ? ", a rank without a GPU"
                                   : ", " + sharing(f) + " (NCCL refuses that)";
  }
  if (f.mpi_cuda_aware) return {Transport::cuda_aware_mpi, why + ", and the MPI is CUDA-aware"};
  return {Transport::staged_mpi, why + ", and the MPI is not CUDA-aware"};
}

bool staged_comm_forced() {
  const char* v = std::getenv("COLOSSAL_TEST_STAGED_COMM");
  return v != nullptr && std::string_view(v) == "1";
}

namespace {

bool mpi_is_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;  // Open MPI built without CUDA, or an MPI that cannot say: assume not
#endif
}

void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) {
    throw std::runtime_error(std::string("colossal::parallel: ") + call +
                             " failed while choosing the communicator");
  }
}

}  // namespace

CommFacts gather_comm_facts() {
  CommFacts f;
  f.device_memory = core::device_memory_v<Kokkos::DefaultExecutionSpace>;
#ifdef COLOSSAL_HAVE_CUDA
  f.nccl_built = true;
#endif
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &f.ranks), "MPI_Comm_size");
  // This node's ranks and their GPUs: how many use the same GPU as this one.
  const GpuIdentity gpu = current_gpu_identity();
  const int sharing = ranks_sharing_this_gpu();
  const bool has_gpu = !gpu.bus_id.empty();
  // Agreed over the world: every rank decides from the same facts.
  int mine[3] = {sharing, has_gpu ? 0 : 1, mpi_is_cuda_aware() ? 0 : 1}, all[3] = {};
  check_mpi(MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  f.ranks_per_gpu = all[0];
  f.every_rank_has_gpu = all[1] == 0;
  f.mpi_cuda_aware = all[2] == 0;
  return f;
}

RunCommunicator make_run_communicator(std::string_view requested) {
  const std::optional<CommRequest> request = parse_comm_request(requested);
  if (!request) {
    throw std::invalid_argument("parallel.comm: invalid value '" + std::string(requested) +
                                "' (one of auto, nccl, mpi)");
  }
  RunCommunicator run;
  auto mpi = make_world_communicator();
  if (staged_comm_forced()) {
    if (*request == CommRequest::nccl) {
      throw std::invalid_argument("parallel.comm: nccl cannot work with "
                                  "COLOSSAL_TEST_STAGED_COMM=1 (it forces the staged MPI path)");
    }
    run.choice = {Transport::staged_mpi,
                  "forced by COLOSSAL_TEST_STAGED_COMM=1: every float buffer is copied through "
                  "the staging buffers, host memory standing in for the device"};
    run.world = std::make_unique<StagedCommunicator>(std::move(mpi), host_staging_ops());
    return run;
  }
  run.choice = choose_comm(gather_comm_facts(), *request);
  switch (run.choice.transport) {
    case Transport::host_mpi:
      run.world = std::move(mpi);
      break;
    case Transport::cuda_aware_mpi:
      mpi->set_device_buffers(true);  // reduce-scatters through MPI, not the host-side ring
      run.world = std::move(mpi);
      break;
    case Transport::staged_mpi:
#ifdef COLOSSAL_HAVE_CUDA
      run.world = std::make_unique<StagedCommunicator>(std::move(mpi), cuda_staging_ops());
#else
      throw std::logic_error("staged MPI chosen in a build without CUDA");
#endif
      break;
    case Transport::nccl:
#ifdef COLOSSAL_HAVE_CUDA
      run.world = std::make_unique<NcclCommunicator>(*mpi, current_gpu_identity().ordinal);
#else
      throw std::logic_error("NCCL chosen in a build without CUDA");
#endif
      break;
  }
  return run;
}

}  // namespace colossal::parallel
