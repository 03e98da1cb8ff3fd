// The runner under MPI: each process is one rank; rank 0 gathers the results in global order,
// runs P = 1 on its own, and compares with the oracle.
#define _POSIX_C_SOURCE 200809L // nanosleep
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctxpar_backend.h"
#include "ctxpar_mpi.h"
#include "runner_internal.h"
#include "runner_mpi.h"

int cpt_run_mpi_launched(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

// Rank 0 receives every rank's local copy of tensor i and places it.
static ctxpar_status gather_tensor(const cpt_run_config *cfg, int rank, int P, int i,
                                   const cpt_rank_report *mine, cpt_run_outputs *global) {
    size_t bytes = mine->out.bytes[i];
    if (!mine->out.t[i])
        return CTXPAR_OK;
    if (bytes > (size_t)1 << 30)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "a local %s of %zu bytes is too large to "
                                                      "gather for checking",
                            cpt_run_tensor_name((cpt_run_tensor)i), bytes);
    if (rank != 0) {
        MPI_Send(mine->out.t[i], (int)bytes, MPI_BYTE, 0, 100 + i, MPI_COMM_WORLD);
        return CTXPAR_OK;
    }
    cpt_rank_outputs one = {{0}, {0}, NULL};
    ctxpar_status st = CTXPAR_OK;
    for (int r = 0; st == CTXPAR_OK && r < P; r++) {
        // Shards may be uneven: each rank's size comes with its message.
        int n = (int)bytes;
        if (r > 0) {
            MPI_Status probe;
            MPI_Probe(r, 100 + i, MPI_COMM_WORLD, &probe);
            MPI_Get_count(&probe, MPI_BYTE, &n);
        }
        free(one.t[i]);
        one.t[i] = malloc(n > 0 ? (size_t)n : 1);
        if (!one.t[i])
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %d bytes", n);
        if (r == 0)
            memcpy(one.t[i], mine->out.t[i], bytes);
        else
            MPI_Recv(one.t[i], n, MPI_BYTE, r, 100 + i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        st = cpt_run_outputs_place(cfg, r, P, &one, global);
    }
    free(one.t[i]);
    return st;
}

// Rank 0 receives every rank's dsinks and places it (compared with its own).
static ctxpar_status gather_dsinks(const cpt_run_config *cfg, int rank, int P,
                                   const cpt_rank_report *mine, cpt_run_outputs *global) {
    if (!mine->out.dsinks)
        return CTXPAR_OK;
    const int n = (int)cfg->heads;
    if (rank != 0) {
        MPI_Send(mine->out.dsinks, n, MPI_FLOAT, 0, 120, MPI_COMM_WORLD);
        return CTXPAR_OK;
    }
    cpt_rank_outputs one = {{0}, {0}, malloc((size_t)n * sizeof(float))};
    if (!one.dsinks)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate dsinks");
    ctxpar_status st = CTXPAR_OK;
    for (int r = 0; st == CTXPAR_OK && r < P; r++) {
        if (r == 0)
            memcpy(one.dsinks, mine->out.dsinks, (size_t)n * sizeof(float));
        else
            MPI_Recv(one.dsinks, n, MPI_FLOAT, r, 120, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        st = cpt_run_outputs_place(cfg, r, P, &one, global);
    }
    free(one.dsinks);
    return st;
}

int cpt_run_mpi_quiet_barrier(void) {
    MPI_Request req;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS)
        return -1;
    // Blocking MPI calls spin; a sleeping poll leaves the cores to whoever is still working
    // (rank 0 timing the single-rank baseline, or computing the oracle).
    for (;;) {
        int done = 0;
        if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return -1;
        if (done)
            return 0;
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
    }
}

int cpt_run_mpi_gather_bytes(const void *mine, size_t bytes, void **all_out,
                                size_t *total_out) {
    int rank = 0, P = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    unsigned long long n = bytes, *counts = NULL;
    char *all = NULL;
    size_t total = 0;
    int ok = 1;
    if (rank == 0) {
        counts = calloc((size_t)P, sizeof *counts);
        ok = counts != NULL;
    }
    // Everybody learns whether rank 0 can take the data before anything is sent.
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok)
        return -1;
    MPI_Gather(&n, 1, MPI_UNSIGNED_LONG_LONG, counts, 1, MPI_UNSIGNED_LONG_LONG, 0,
               MPI_COMM_WORLD);
    if (rank == 0) {
        for (int r = 0; r < P; r++)
            total += (size_t)counts[r];
        all = malloc(total ? total : 1);
        ok = all != NULL;
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok) {
        free(counts);
        return -1;
    }
    // Point to point, in pieces of at most 2^30 bytes (MPI counts are int).
    const size_t piece = (size_t)1 << 30;
    if (rank == 0) {
        memcpy(all, mine, bytes);
        size_t off = bytes;
        for (int r = 1; r < P; r++) {
            for (size_t done = 0; done < counts[r]; done += piece) {
                size_t len = counts[r] - done < piece ? counts[r] - done : piece;
                MPI_Recv(all + off + done, (int)len, MPI_BYTE, r, 98, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            }
            off += (size_t)counts[r];
        }
    } else {
        for (size_t done = 0; done < bytes; done += piece) {
            size_t len = bytes - done < piece ? bytes - done : piece;
            MPI_Send((const char *)mine + done, (int)len, MPI_BYTE, 0, 98, MPI_COMM_WORLD);
        }
    }
    free(counts);
    *all_out = all;
    *total_out = total;
    return 0;
}

static void run_this_rank(const cpt_run_config *cfg, cpt_rank_report *rep) {
    ctxpar_device *dev = NULL;
    ctxpar_comm *comm = NULL;
    ctxpar_status st =
        cpt_run_device_create(cfg, cpt_run_threads_per_rank(cfg, cfg->ranks), &dev);
    ctxpar_comm_world *world = NULL;
    if (st == CTXPAR_OK)
        st = ctxpar_comm_world_create("mpi", cfg->ranks, &world);
    if (st == CTXPAR_OK)
        st = ctxpar_comm_world_comm(world, 0, NULL, &comm);
    if (st == CTXPAR_OK) {
        cpt_run_rank(cfg, dev, comm, rep);
    } else {
        rep->status = st;
        snprintf(rep->message, sizeof rep->message, "%s", ctxpar_last_error());
    }
    ctxpar_comm_destroy(comm);
    ctxpar_comm_world_destroy(world);
    ctxpar_device_destroy(dev);
}

static ctxpar_status run_mpi(const cpt_run_config *cfg, cpt_run_result *res);

ctxpar_status cpt_run_mpi(const cpt_run_config *cfg_in, cpt_run_result *res) {
    memset(res, 0, sizeof *res);
    cpt_run_config cfg;
    int32_t *cu = NULL;
    // Every rank makes the same documents (a function of seed, seq and their number).
    CTXPAR_CHECK(cpt_run_resolve_docs(cfg_in, &cfg, &cu));
    ctxpar_status st = run_mpi(&cfg, res);
    if (st != CTXPAR_OK) // the caller frees only results it was given
        cpt_run_outputs_free(&res->outputs);
    free(cu);
    return st;
}

static ctxpar_status run_mpi(const cpt_run_config *cfg, cpt_run_result *res) {
    int rank = 0, P = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    if (cfg->ranks != P)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "--ranks (%d) != number of MPI processes (%d)",
                            cfg->ranks, P);
    CTXPAR_CHECK(cpt_run_check_config(cfg));
    if (cfg->backend != CPT_RUN_CPU)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "the MPI comm moves host memory: backend "
                                                      "'%s' runs with the local comm only",
                            cpt_run_backend_name(cfg->backend));
    cpt_rank_report *rep = calloc(1, sizeof *rep);
    if (!rep)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a rank report");
    run_this_rank(cfg, rep);

    // Which rank failed first, and its message, for everybody.
    int failed = rep->status != CTXPAR_OK ? rank : P, first_failed = P;
    MPI_Allreduce(&failed, &first_failed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    ctxpar_status st = CTXPAR_OK;
    if (first_failed < P) {
        int code = rep->status;
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rep->message);
        MPI_Bcast(&code, 1, MPI_INT, first_failed, MPI_COMM_WORLD);
        MPI_Bcast(msg, sizeof msg, MPI_CHAR, first_failed, MPI_COMM_WORLD);
        res->status = (ctxpar_status)code;
        snprintf(res->message, sizeof res->message, "%s", msg);
        goto done;
    }
    MPI_Reduce(&rep->time_s, &res->time_s, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&rep->time_fwd_s, &res->time_fwd_s, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&rep->time_min_s, &res->time_min_s, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&rep->time_max_s, &res->time_max_s, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&rep->time_fwd_min_s, &res->time_fwd_min_s, 1, MPI_DOUBLE, MPI_MAX, 0,
               MPI_COMM_WORLD);
    MPI_Reduce(&rep->time_fwd_max_s, &res->time_fwd_max_s, 1, MPI_DOUBLE, MPI_MAX, 0,
               MPI_COMM_WORLD);
    unsigned long long peak = rep->stats.peak_bytes, max_peak = 0;
    MPI_Reduce(&peak, &max_peak, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
    res->peak_bytes_per_rank = (size_t)max_peak;
    cpt_run_rank_stats all[64];
    int nstats = P < 64 ? P : 64;
    if (rank < nstats && rank != 0)
        MPI_Send(&rep->stats, sizeof rep->stats, MPI_BYTE, 0, 99, MPI_COMM_WORLD);
    if (rank == 0) {
        all[0] = rep->stats;
        for (int r = 1; r < nstats; r++)
            MPI_Recv(&all[r], sizeof all[r], MPI_BYTE, r, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        memcpy(res->rank, all, (size_t)nstats * sizeof all[0]);
        res->algo = rep->algo;
        snprintf(res->device, sizeof res->device, "%s", rep->device);
        st = cpt_run_outputs_alloc(cfg, &res->outputs);
    }
    for (int i = 0; i < CPT_RUN_TENSORS && st == CTXPAR_OK; i++)
        st = gather_tensor(cfg, rank, P, i, rep, &res->outputs);
    if (st == CTXPAR_OK)
        st = gather_dsinks(cfg, rank, P, rep, &res->outputs);
    if (rank == 0 && st == CTXPAR_OK)
        st = cpt_run_finish(cfg, res);
done:
    // Everybody leaves with rank 0's verdict, after waiting for it without spinning.
    if (cpt_run_mpi_quiet_barrier() != 0 && st == CTXPAR_OK)
        st = CTXPAR_ERROR(CTXPAR_ERR_COMM, "MPI_Ibarrier failed");
    int verdict[3] = {st, res->status, res->ok};
    MPI_Bcast(verdict, 3, MPI_INT, 0, MPI_COMM_WORLD);
    res->ok = verdict[2];
    if (rank != 0) {
        res->status = (ctxpar_status)verdict[1];
        st = (ctxpar_status)verdict[0];
    }
    cpt_rank_outputs_free(&rep->out);
    free(rep);
    return st;
}
