/*
 * ctxpar_mpi_testing.h - test hooks of the MPI comm (not part of the public API).
 */
#ifndef CTXPAR_MPI_TESTING_H
#define CTXPAR_MPI_TESTING_H

#include <stddef.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the largest single MPI message of an MPI comm (default and maximum 1 GiB; buffers above
 * it go as several messages), so that tests exercise the multi-message path of buffers larger
 * than INT_MAX bytes with small buffers. Every rank must set the same value before any op. */
ctxpar_status ctxpar_mpi_set_max_message(ctxpar_comm *comm, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_MPI_TESTING_H */
