/*
 * ctxpar_mpi.h - a comm over MPI (host memory), for ranks as separate processes.
 */
#ifndef CTXPAR_MPI_H
#define CTXPAR_MPI_H

#include <mpi.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Duplicates `mpi_comm` (so ctxpar's traffic never matches the caller's) and sets
 * MPI_ERRORS_RETURN on the duplicate. MPI must be initialised (MPI_THREAD_SERIALIZED or more if
 * other threads use MPI). Collective over mpi_comm. Destroy with ctxpar_comm_destroy before
 * MPI_Finalize. */
CTXPAR_API ctxpar_status ctxpar_comm_create_mpi(MPI_Comm mpi_comm, ctxpar_comm **comm_out);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_MPI_H */
