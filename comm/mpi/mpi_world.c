// The MPI comm's entry in the registry of comms by name: this process runs one rank, its rank of
// MPI_COMM_WORLD. MPI is the caller's to initialise and finalise (it owns the process's MPI).
#include <mpi.h>

#include "ctxpar_backend.h"
#include "ctxpar_mpi.h"

static ctxpar_status world_create(int nranks, void **impl_out, int *first_rank_out,
                                  int *count_out) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (!up || down)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_USAGE,
                            "the mpi comm needs MPI initialised (MPI_Init_thread) and not finalised");
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (nranks != 0 && nranks != size)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "nranks (%d) != the number of MPI processes (%d)", nranks, size);
    *impl_out = NULL;
    *first_rank_out = rank;
    *count_out = 1;
    return CTXPAR_OK;
}

static ctxpar_status world_comm(void *impl, int i, ctxpar_device *copy_device,
                                ctxpar_comm **comm_out) {
    (void)impl;
    (void)i; // the registry checked it: 0
    if (copy_device && !ctxpar_device_host_memory(copy_device))
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the mpi comm moves host memory: device memory needs another comm");
    return ctxpar_comm_create_mpi(MPI_COMM_WORLD, comm_out);
}

static void world_destroy(void *impl) { (void)impl; }

static const ctxpar_comm_world_ops ops = {world_create, world_comm, world_destroy};

__attribute__((constructor)) static void register_mpi(void) {
    if (ctxpar_comm_register("mpi", "one rank per process of MPI_COMM_WORLD (mpirun)", &ops) !=
        CTXPAR_OK)
        ctxpar_clear_error(); // already there: the first registration stands
}
