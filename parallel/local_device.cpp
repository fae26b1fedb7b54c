#include "parallel/local_device.hpp"

#include <cstdlib>

#ifdef COLOSSAL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace colossal::parallel {

LocalRank local_rank_from_env(const std::function<const char*(const char*)>& get) {
  for (const char* name : {"SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                           "MV2_COMM_WORLD_LOCAL_RANK"}) {
    const char* value = get ? get(name) : std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(value, &end, 10);
    if (*end != '\0' || rank < 0 || rank > 1 << 20) continue;
    return {int(rank), name};
  }
  return {};
}

int device_for(int local_rank, int devices) {
  if (devices <= 0 || local_rank < 0) return -1;
  return local_rank % devices;
}

std::string DeviceChoice::describe() const {
  const std::string rank = "local rank " + std::to_string(local_rank) + " (" + source + ")";
  if (!cuda_built) return "none (built without CUDA); " + rank;
  if (devices == 0) return "none (no CUDA device visible); " + rank;
  return "CUDA device " + std::to_string(device) + " of " + std::to_string(devices) +
         " visible = " + rank + " mod " + std::to_string(devices);
}

DeviceChoice select_local_device(int mpi_local_rank) {
  DeviceChoice choice;
  const LocalRank env = local_rank_from_env();
  choice.local_rank = env.rank >= 0 ? env.rank : mpi_local_rank;
  choice.source = env.rank >= 0 ? env.source : "MPI shared-memory split";
#ifdef COLOSSAL_HAVE_CUDA
  choice.cuda_built = true;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error: a host without a GPU is not a failure here
    devices = 0;
  }
  choice.devices = devices;
  choice.device = device_for(choice.local_rank, devices);
  if (choice.device >= 0 && cudaSetDevice(choice.device) != cudaSuccess) {
    cudaGetLastError();
    choice.device = -1;
  }
#endif
  return choice;
}

}  // namespace colossal::parallel
