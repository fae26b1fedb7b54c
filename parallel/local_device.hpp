// Which GPU a process uses: its rank on its node, as the launcher tells it (mpirun:
// OMPI_COMM_WORLD_LOCAL_RANK, MPICH/Intel MPI: MPI_LOCALRANKID, MVAPICH:
// MV2_COMM_WORLD_LOCAL_RANK, srun: SLURM_LOCALID), else its rank among the MPI processes sharing
// its memory, modulo the number of devices it can see (CUDA_VISIBLE_DEVICES, as Slurm's
// --gpus-per-task sets it, included). The MPI launchers' variables come first: mpirun inside an
// sbatch job hands every rank the batch step's SLURM_LOCALID (0). And a launcher's numbers that
// do not number a node's ranks 0..n-1 are not used at all (node_local_rank). Without CUDA nothing
// is selected; the choice is only reported.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

namespace colossal::parallel {

struct LocalRank {
  int rank = -1;       // -1: the launcher set none of the variables
  std::string source;  // the variable it came from, e.g. "SLURM_LOCALID"
};

// The launchers' local-rank variables, in the order they are read.
inline constexpr const char* kLauncherLocalRankVariables[] = {
    "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};

// From the environment (`get` replaces std::getenv in tests). A malformed value is skipped.
LocalRank local_rank_from_env(const std::function<const char*(const char*)>& get = {});

// This rank's local rank for choosing its GPU, over `node` (the ranks sharing its memory, in an
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) communicator; collective over it): the launcher's
// (local_rank_from_env) when they number the node's ranks 0..n-1, else the rank in `node`, with
// a source that says why ("MPI shared-memory split (the launcher's local ranks, SLURM_LOCALID
// here, do not number this node's 3 ranks 0..2)").
LocalRank node_local_rank(MPI_Comm node);
// The rule under it: `env` (each rank's launcher local rank, -1 for none, in node order) is used
// when it holds each of 0..n-1 once.
bool env_local_ranks_usable(const std::vector<int>& env);

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

// A GPU as every process of a node names it, whatever each one's CUDA_VISIBLE_DEVICES: under
// Slurm's --gpus-per-task=1 every task sees its own GPU as device 0, so device ordinals cannot
// tell whether two ranks share one. The PCI bus id is what NCCL compares to refuse two ranks of
// a communicator on one GPU; the UUID is a MIG instance's own, so slices of one GPU, each with
// memory of its own, stay apart where memory is counted.
struct GpuIdentity {
  std::string bus_id;  // e.g. "0000:3B:00.0"; empty: no GPU
  std::string uuid;    // 32 hex digits; empty: no GPU
  int ordinal = -1;    // this process's CUDA device number (for messages only)
};

// The CUDA current device's identity; empty (ordinal -1) without CUDA or a device.
GpuIdentity current_gpu_identity();
// The CUDA current device's name ("NVIDIA H100 80GB HBM3"); empty without CUDA or a device.
std::string current_gpu_name();

// Every rank of `comm` gets every rank's identity, in rank order.
std::vector<GpuIdentity> all_gather_gpu_identities(MPI_Comm comm, const GpuIdentity& mine);

// For each entry of `keys` (one per rank of a node: bus ids or UUIDs, empty for no GPU), how
// many entries name the same GPU (a rank without one counts 1).
std::vector<int> ranks_on_same_gpu(const std::vector<std::string>& keys);

// How many of this node's ranks use the same GPU as this one, by PCI bus id (collective over
// MPI_COMM_WORLD; 1 for a rank without a GPU, or where MPI is not initialised).
int ranks_sharing_this_gpu();

// The ranks of a node grouped by GPU (indices into `keys`, each group in order, groups in the
// order of their first rank); ranks without a GPU are left out.
std::vector<std::vector<int>> group_by_gpu(const std::vector<std::string>& keys);

// Chooses this process's device and, in a CUDA build with a device visible, makes it current
// (cudaSetDevice), before any cuBLAS handle or NCCL communicator exists; `local` from
// node_local_rank.
DeviceChoice select_local_device(const LocalRank& local);

}  // namespace colossal::parallel
