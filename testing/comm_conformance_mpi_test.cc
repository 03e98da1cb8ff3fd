// The comm conformance suite on the MPI comm: run by every rank under mpirun (testing/mpi_run.sh,
// with 4, 3 and 1 ranks); main() is testing/mpi_gtest_main.cc.
#include <mpi.h>

#include "ctxpar_mpi.h"
#include "testing/comm_conformance.h"

namespace cpt_commconf {

// A fresh comm over MPI_COMM_WORLD for each case; the ranks line up again after it.
std::vector<CommWorld> CommWorlds() {
    return {{"mpi", [](const CommBody &body) -> std::string {
                 int rank = 0, size = 1;
                 MPI_Comm_rank(MPI_COMM_WORLD, &rank);
                 MPI_Comm_size(MPI_COMM_WORLD, &size);
                 ctxpar_comm *comm = nullptr;
                 if (ctxpar_comm_create_mpi(MPI_COMM_WORLD, &comm) != CTXPAR_OK)
                     return std::string("cannot create the MPI comm: ") + ctxpar_last_error();
                 EXPECT_OK(ctxpar_comm_set_timeout(comm, 30));
                 body(rank, size, comm, nullptr);
                 ctxpar_comm_destroy(comm);
                 MPI_Barrier(MPI_COMM_WORLD);
                 return "";
             }}};
}

} // namespace cpt_commconf
