/*
 * runner_mpi.h - the runner with this process as one rank of MPI_COMM_WORLD (under mpirun).
 */
#ifndef CPT_TESTING_RUNNER_MPI_H
#define CPT_TESTING_RUNNER_MPI_H

#include "runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether this process was started by an MPI launcher (mpirun/srun environment variables). */
int cpt_run_mpi_launched(void);

/* Every rank calls it (MPI initialised); cfg->ranks must equal the world size. Rank 0 gathers
 * the outputs and evaluates them: its result is complete. Other ranks get status, message and
 * ok (broadcast from rank 0), so that every process can exit with the same code. */
ctxpar_status cpt_run_mpi(const cpt_run_config *cfg, cpt_run_result *result);

/* Collective: a barrier that waits by polling with short sleeps instead of spinning, so that a
 * rank still working (rank 0 alone, timing or checking) keeps the cores. 0 on success. */
int cpt_run_mpi_quiet_barrier(void);

/* Collective: rank 0 receives every rank's `bytes` bytes at `mine`, concatenated in rank order,
 * into *all_out (malloc'ed, rank 0 frees) of *total_out bytes; other ranks get NULL and 0.
 * Returns 0, or -1 on every rank when rank 0 cannot allocate. */
int cpt_run_mpi_gather_bytes(const void *mine, size_t bytes, void **all_out,
                                size_t *total_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_RUNNER_MPI_H */
