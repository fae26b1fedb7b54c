#include "parallel/local_device.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifdef COLOSSAL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace colossal::parallel {

LocalRank local_rank_from_env(const std::function<const char*(const char*)>& get) {
  for (const char* name : kLauncherLocalRankVariables) {
    const char* value = get ? get(name) : std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long rank = std::strtol(value, &end, 10);
    if (*end != '\0' || rank < 0 || rank > 1 << 20) continue;
    return {int(rank), name};
  }
  return {};
}

bool env_local_ranks_usable(const std::vector<int>& env) {
  std::vector<int> sorted = env;
  std::ranges::sort(sorted);
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] != int(i)) return false;
  }
  return !sorted.empty();
}

LocalRank node_local_rank(MPI_Comm node) {
  int rank = 0, size = 1;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, &size);
  const LocalRank env = local_rank_from_env();
  std::vector<int> all(static_cast<std::size_t>(size), -1);
  if (MPI_Allgather(&env.rank, 1, MPI_INT, all.data(), 1, MPI_INT, node) != MPI_SUCCESS) {
    throw std::runtime_error("colossal::parallel: MPI_Allgather of the node's local ranks failed");
  }
  if (env_local_ranks_usable(all)) return env;
  std::string source = "MPI shared-memory split";
  const auto missing = std::ranges::count(all, -1);
  if (missing == 0) {
    source += " (the launcher's local ranks, " + env.source + " here, do not number this node's " +
              std::to_string(size) + " ranks 0.." + std::to_string(size - 1) + ")";
  } else if (missing < size) {
    source += " (not every rank of this node has a launcher's local rank)";
  }
  return {rank, source};
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

#ifdef COLOSSAL_HAVE_CUDA
namespace {
// The CUDA current device and its properties; false (the sticky error cleared) without one.
bool current_device(int& device, cudaDeviceProp& prop) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 ||
      cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();  // no GPU here is not a failure
    return false;
  }
  return true;
}
}  // namespace
#endif

GpuIdentity current_gpu_identity() {
  GpuIdentity id;
#ifdef COLOSSAL_HAVE_CUDA
  int device = -1;
  cudaDeviceProp prop{};
  char bus[32] = {};
  if (!current_device(device, prop) ||
      cudaDeviceGetPCIBusId(bus, int(sizeof bus) - 1, device) != cudaSuccess) {
    cudaGetLastError();
    return id;
  }
  id.ordinal = device;
  id.bus_id = bus;
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(hex, sizeof hex, "%02x", unsigned(static_cast<unsigned char>(prop.uuid.bytes[i])));
    id.uuid += hex;
  }
#endif
  return id;
}

std::string current_gpu_name() {
#ifdef COLOSSAL_HAVE_CUDA
  int device = -1;
  cudaDeviceProp prop{};
  if (current_device(device, prop)) return std::string(prop.name, strnlen(prop.name, sizeof prop.name));
#endif
  return "";
}

std::vector<GpuIdentity> all_gather_gpu_identities(MPI_Comm comm, const GpuIdentity& mine) {
  // Fixed-width records: ordinal, then the bus id and the UUID NUL-padded.
  constexpr std::size_t kBus = 32, kUuid = 40, kRecord = sizeof(int) + kBus + kUuid;
  if (mine.bus_id.size() >= kBus || mine.uuid.size() >= kUuid) {
    throw std::invalid_argument("colossal::parallel: GPU bus id or UUID too long to gather");
  }
  char record[kRecord] = {};
  std::memcpy(record, &mine.ordinal, sizeof(int));
  std::memcpy(record + sizeof(int), mine.bus_id.data(), mine.bus_id.size());
  std::memcpy(record + sizeof(int) + kBus, mine.uuid.data(), mine.uuid.size());
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::vector<char> all(kRecord * std::size_t(size));
  if (MPI_Allgather(record, int(kRecord), MPI_CHAR, all.data(), int(kRecord), MPI_CHAR, comm) !=
      MPI_SUCCESS) {
    throw std::runtime_error("colossal::parallel: MPI_Allgather of the GPUs' identities failed");
  }
  std::vector<GpuIdentity> ids(static_cast<std::size_t>(size));
  for (std::size_t r = 0; r < ids.size(); ++r) {
    const char* at = all.data() + r * kRecord;
    std::memcpy(&ids[r].ordinal, at, sizeof(int));
    ids[r].bus_id = std::string(at + sizeof(int), strnlen(at + sizeof(int), kBus));
    ids[r].uuid = std::string(at + sizeof(int) + kBus, strnlen(at + sizeof(int) + kBus, kUuid));
  }
  return ids;
}

std::vector<int> ranks_on_same_gpu(const std::vector<std::string>& keys) {
  std::vector<int> counts(keys.size(), 1);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!keys[i].empty()) counts[i] = int(std::ranges::count(keys, keys[i]));
  }
  return counts;
}

int ranks_sharing_this_gpu() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return 1;
  const GpuIdentity gpu = current_gpu_identity();
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
      MPI_SUCCESS) {
    throw std::runtime_error("colossal::parallel: MPI_Comm_split_type (the node's ranks) failed");
  }
  int local = 0;
  MPI_Comm_rank(node, &local);
  std::vector<GpuIdentity> ids;
  try {
    ids = all_gather_gpu_identities(node, gpu);
  } catch (...) {
    MPI_Comm_free(&node);
    throw;
  }
  MPI_Comm_free(&node);
  std::vector<std::string> buses;
  for (const GpuIdentity& id : ids) buses.push_back(id.bus_id);
  return ranks_on_same_gpu(buses)[std::size_t(local)];
}

std::vector<std::vector<int>> group_by_gpu(const std::vector<std::string>& keys) {
  std::vector<std::vector<int>> groups;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty()) continue;
    const auto first = std::ranges::find(keys, keys[i]);
    if (first != keys.begin() + std::ptrdiff_t(i)) continue;  // grouped at its first rank
    std::vector<int>& group = groups.emplace_back();
    for (std::size_t j = i; j < keys.size(); ++j) {
      if (keys[j] == keys[i]) group.push_back(int(j));
    }
  }
  return groups;
}

DeviceChoice select_local_device(const LocalRank& local) {
  DeviceChoice choice;
  choice.local_rank = local.rank;
  choice.source = local.source;
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
