// main() of a GoogleTest binary that every rank runs under mpirun: only rank 0 prints GoogleTest's
// report; other ranks print their failures, tagged with the rank; the exit code is a failure if
// any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
  public:
    explicit RankFailurePrinter(int rank) : rank_(rank) {}
    void OnTestPartResult(const ::testing::TestPartResult &r) override {
        if (r.failed())
            std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                         r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    }

  private:
    int rank_;
};

} // namespace

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) {
        ::testing::TestEventListeners &listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter(rank));
    }
    int failed = RUN_ALL_TESTS() != 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && any && !failed)
        std::fprintf(stderr, "another rank failed (see its [rank N] lines)\n");
    MPI_Finalize();
    return any;
}
