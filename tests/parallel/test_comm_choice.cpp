// parallel::choose_comm: every combination of the facts and the request, against the table in
// parallel/comm_choice.hpp, written out here as its own rules; and the refusals' messages.
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "parallel/comm_choice.hpp"

namespace {

using colossal::parallel::choose_comm;
using colossal::parallel::CommFacts;
using colossal::parallel::CommRequest;
using colossal::parallel::Transport;

// The table, row by row; nullopt: refused.
std::optional<Transport> expected(const CommFacts& f, CommRequest r) {
  if (!f.device_memory) {
    if (r == CommRequest::nccl) return std::nullopt;
    return Transport::host_mpi;
  }
  const bool own_gpu = f.every_rank_has_gpu && f.ranks_per_gpu == 1;
  const Transport mpi = f.mpi_cuda_aware ? Transport::cuda_aware_mpi : Transport::staged_mpi;
  switch (r) {
    case CommRequest::nccl:
      if (f.nccl_built && own_gpu) return Transport::nccl;
      return std::nullopt;
    case CommRequest::mpi:
      return mpi;
    case CommRequest::automatic:
      if (f.nccl_built && own_gpu && f.ranks > 1) return Transport::nccl;
      return mpi;  // one rank never needs NCCL's set-up
  }
  return std::nullopt;
}

TEST(CommChoice, EveryCombinationFollowsTheTable) {
  int cases = 0, refused = 0;
  for (bool device : {false, true}) {
    for (bool nccl : {false, true}) {
      for (bool aware : {false, true}) {
        for (bool gpus : {false, true}) {
          for (int sharing : {1, 2, 4}) {
            for (int ranks : {1, 2, 8}) {
              for (CommRequest r : {CommRequest::automatic, CommRequest::nccl, CommRequest::mpi}) {
                const CommFacts f{.device_memory = device, .nccl_built = nccl,
                                  .mpi_cuda_aware = aware, .every_rank_has_gpu = gpus,
                                  .ranks_per_gpu = sharing, .ranks = ranks};
                const std::string what = std::string("device ") + (device ? "1" : "0") +
                                         " nccl " + (nccl ? "1" : "0") + " aware " +
                                         (aware ? "1" : "0") + " gpus " + (gpus ? "1" : "0") +
                                         " sharing " + std::to_string(sharing) + " request " +
                                         colossal::parallel::comm_request_name(r);
                ++cases;
                const std::optional<Transport> want = expected(f, r);
                if (!want) {
                  ++refused;
                  try {
                    choose_comm(f, r);
                    ADD_FAILURE() << what << ": accepted";
                  } catch (const std::invalid_argument& e) {
                    EXPECT_NE(std::string(e.what()).find("parallel.comm: nccl cannot work"),
                              std::string::npos) << what << ": " << e.what();
                  }
                  continue;
                }
                const auto choice = choose_comm(f, r);
                EXPECT_EQ(choice.transport, *want) << what << ": " << choice.describe();
                EXPECT_NE(choice.reason.find("parallel.comm: "), std::string::npos) << what;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 2 * 2 * 2 * 3 * 3 * 3);
  EXPECT_GT(refused, 0);
}

TEST(CommChoice, RefusalsNameTheRule) {
  const auto message = [](const CommFacts& f) {
    try {
      choose_comm(f, CommRequest::nccl);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string cpu = message(CommFacts{});
  EXPECT_NE(cpu.find("needs a CUDA build"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("set parallel.comm: auto or mpi"), std::string::npos) << cpu;
  const CommFacts shared{.device_memory = true, .nccl_built = true, .every_rank_has_gpu = true,
                         .ranks_per_gpu = 2, .ranks = 2};
  const std::string two = message(shared);
  EXPECT_NE(two.find("NCCL refuses two ranks of one communicator on the same GPU"),
            std::string::npos) << two;
  EXPECT_NE(two.find("2 ranks of one node share a GPU"), std::string::npos) << two;
  EXPECT_NE(two.find("parallel.comm: mpi"), std::string::npos) << two;
  CommFacts no_nccl = shared;
  no_nccl.nccl_built = false;
  no_nccl.ranks_per_gpu = 1;
  EXPECT_NE(message(no_nccl).find("this build has no NCCL"), std::string::npos);
  CommFacts no_gpu = shared;
  no_gpu.every_rank_has_gpu = false;
  EXPECT_NE(message(no_gpu).find("some rank has none"), std::string::npos);
}

TEST(CommChoice, AutoSaysWhyItDidNotPickNccl) {
  const CommFacts f{.device_memory = true, .nccl_built = true, .every_rank_has_gpu = true,
                    .ranks_per_gpu = 4, .ranks = 4};
  const auto choice = choose_comm(f, CommRequest::automatic);
  EXPECT_EQ(choice.transport, Transport::staged_mpi);
  EXPECT_EQ(choice.describe(),
            "MPI through pinned host staging (parallel.comm: auto, device buffers, 4 ranks of one "
            "node share a GPU (NCCL refuses that), and the MPI is not CUDA-aware)");
  const CommFacts one{.device_memory = true, .nccl_built = true, .every_rank_has_gpu = true,
                      .ranks_per_gpu = 1, .ranks = 1};
  EXPECT_EQ(choose_comm(one, CommRequest::automatic).describe(),
            "MPI through pinned host staging (parallel.comm: auto, device buffers, one rank "
            "(nothing crosses ranks: no NCCL set-up), and the MPI is not CUDA-aware)");
  EXPECT_EQ(choose_comm(one, CommRequest::nccl).transport, Transport::nccl);  // asked for
  EXPECT_EQ(choose_comm(CommFacts{}, CommRequest::automatic).describe(),
            "host MPI (parallel.comm: auto, this build keeps buffers in host memory)");
}

TEST(CommChoice, RequestNamesParse) {
  using colossal::parallel::parse_comm_request;
  EXPECT_EQ(parse_comm_request("auto"), CommRequest::automatic);
  EXPECT_EQ(parse_comm_request("nccl"), CommRequest::nccl);
  EXPECT_EQ(parse_comm_request("mpi"), CommRequest::mpi);
  EXPECT_FALSE(parse_comm_request("gloo"));
  EXPECT_FALSE(parse_comm_request("NCCL"));
}

}  // namespace
