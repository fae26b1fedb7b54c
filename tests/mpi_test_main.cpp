// GoogleTest main for MPI tests (registered by colossal_add_test with MPI_RANKS).
//
// Rank 0 prints the full GoogleTest report; other ranks print only their failures, each line
// prefixed with "[rank N]". The results are combined with an all-reduce, so a test that fails on
// any rank makes every rank (and so mpiexec and ctest) exit non-zero.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <string>
#include <vector>

namespace {

class FailurePrinter final : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : prefix_("[rank " + std::to_string(rank) + "] ") {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::string text = prefix_ + (result.file_name() ? result.file_name() : "unknown") + ":" +
                       std::to_string(result.line_number()) + ": Failure\n" + prefix_;
    for (const char* c = result.message(); *c != '\0'; ++c) {
      text += *c;
      if (*c == '\n' && c[1] != '\0') text += prefix_;
    }
    std::fprintf(stderr, "%s\n", text.c_str());  // one write, so ranks interleave by whole reports
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result() != nullptr && info.result()->Failed()) {
      std::fprintf(stderr, "%s[  FAILED  ] %s.%s\n", prefix_.c_str(), info.test_suite_name(),
                   info.name());
    }
  }

 private:
  std::string prefix_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  int failed = 0;
  {
    // Kokkos (and every communicator a test made) is gone before MPI_Finalize.
    ::testing::InitGoogleTest(&argc, argv);
    Kokkos::ScopeGuard kokkos(argc, argv);
    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new FailurePrinter(rank));  // owned by GoogleTest
    }
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  }

  std::vector<int> failed_by_rank(static_cast<std::size_t>(size), 0);
  MPI_Gather(&failed, 1, MPI_INT, failed_by_rank.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed) {
    std::string ranks;
    for (int r = 0; r < size; ++r) {
      if (failed_by_rank[static_cast<std::size_t>(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    std::fprintf(stderr, "[colossal] tests failed on rank(s) %s of %d\n", ranks.c_str(), size);
  }
  MPI_Finalize();
  return any_failed;
}
