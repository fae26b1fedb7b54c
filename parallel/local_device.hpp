// Which GPU a process uses: its rank on its node, as the launcher tells it (srun: SLURM_LOCALID,
// mpirun: OMPI_COMM_WORLD_LOCAL_RANK, MPICH/Intel MPI: MPI_LOCALRANKID, MVAPICH:
// MV2_COMM_WORLD_LOCAL_RANK), else its rank among the MPI processes sharing its memory, modulo
// the number of devices it can see (CUDA_VISIBLE_DEVICES, as Slurm's --gpus-per-task sets it,
// included). Without CUDA nothing is selected; the choice is only reported.
#pragma once

#include <functional>
#include <string>

namespace colossal::parallel {

struct LocalRank {
  int rank = -1;       // -1: the launcher set none of the variables
  std::string source;  // the variable it came from, e.g. "SLURM_LOCALID"
};

// From the environment (`get` replaces std::getenv in tests). A malformed value is skipped.
LocalRank local_rank_from_env(const std::function<const char*(const char*)>& get = {});

struct DeviceChoice {
  int local_rank = 0;   // the rank used
  std::string source;   // where it came from: a variable name, or "MPI shared-memory split"
  int devices = 0;      // visible CUDA devices (0 without CUDA or without a GPU)
  int device = -1;      // chosen and made current: local_rank % devices; -1 when none
  bool cuda_built = false;
  std::string describe() const;  // one line for the start-up log
};

// The pure rule: local_rank % devices, -1 when there is no device.
int device_for(int local_rank, int devices);

// Chooses this process's device and, in a CUDA build with a device visible, makes it current
// (cudaSetDevice), before any cuBLAS handle or NCCL communicator exists. `mpi_local_rank` is used
// when the environment names no local rank.
DeviceChoice select_local_device(int mpi_local_rank);

}  // namespace colossal::parallel
