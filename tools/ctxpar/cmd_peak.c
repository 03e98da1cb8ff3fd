// The cores' FP32 FMA peak for `ctxpar bench`: measured by the CPU backend's probe, printed by
// --peak, and the denominator of every "% of peak".
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "commands.h"
#include "reference/runner_mpi.h"

static int measure_all(cpt_session *s, int all_cores, cpt_peak_info *peak);

static int measure(cpt_session *s, int threads, ctxpar_cpu_peak *out) {
    ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
    opt.num_threads = threads;
    // The core class the bench's devices use (runner_device.c takes the same variable): the
    // peak reports it. The instruction set stays the best the CPU has: the peak is the machine's.
    const char *uarch = getenv("CTXPAR_CPU_UARCH");
    ctxpar_status st = CTXPAR_OK;
    if (uarch && *uarch)
        st = ctxpar_cpu_uarch_parse(uarch, &opt.uarch);
    ctxpar_device *dev = NULL;
    if (st == CTXPAR_OK)
        st = ctxpar_device_create_cpu(&opt, &dev);
    if (st == CTXPAR_OK) {
        ctxpar_cpu_peak p = CTXPAR_CPU_PEAK_INIT;
        st = ctxpar_cpu_measure_peak(dev, &p);
        if (st == CTXPAR_OK)
            *out = p;
    }
    if (st != CTXPAR_OK)
        cpt_session_error(s, "peak probe: %s", cpt_cli_message(ctxpar_last_error()));
    ctxpar_device_destroy(dev);
    return st == CTXPAR_OK ? 0 : -1;
}

// Rank 0 measures while the other ranks of an MPI job wait in a barrier that sleeps: a rank that
// spins, or probes at the same time, takes cycles from the probe where ranks share cores (and
// on virtual machines even its per-thread CPU time reads low).
int cpt_peak_measure(cpt_session *s, int all_cores, cpt_peak_info *peak) {
    int rc = s->rank == 0 ? measure_all(s, all_cores, peak) : -1;
    if (s->mpi && cpt_run_mpi_quiet_barrier() != 0)
        rc = -1;
    return rc;
}

static int measure_all(cpt_session *s, int all_cores, cpt_peak_info *peak) {
    cpt_peak_info p = {0};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    p.cores = cores > 0 ? (int)cores : 1;
    if (measure(s, 1, &p.core) != 0)
        return -1;
    p.have = 1;
    if (all_cores) {
        if (measure(s, p.cores, &p.all) != 0)
            return -1;
        p.have_all = 1;
    }
    *peak = p;
    return 0;
}

double cpt_peak_flops(const cpt_peak_info *peak, int ranks, int threads) {
    if (!peak->have)
        return NAN;
    const long used = (long)ranks * threads;
    return peak->core.flops_per_core * (double)(used < peak->cores ? used : peak->cores);
}

void cpt_peak_json_members(FILE *f, const cpt_peak_info *peak) {
    fputs("\"peak_kernels\":", f);
    if (peak->have)
        cpt_json_string(f, peak->core.kernels);
    else
        fputs("null", f);
    fprintf(f, ",\"peak_vector_lanes\":%d,\"peak_flops_per_core\":",
            peak->have ? peak->core.vector_lanes : 0);
    cpt_json_num(f, peak->have ? peak->core.flops_per_core : NAN);
    fprintf(f, ",\"cores\":%d,\"cpu_uarch\":", peak->cores);
    if (peak->have)
        cpt_json_string(f, peak->core.uarch);
    else
        fputs("null", f);
    fputs(",\"cpu_tiles\":", f);
    if (peak->have)
        cpt_json_string(f, peak->core.tiles);
    else
        fputs("null", f);
}

void cpt_peak_print(FILE *f, const cpt_peak_info *peak, int json) {
    const ctxpar_cpu_peak *c = &peak->core, *a = &peak->all;
    if (json) {
        fputc('{', f);
        cpt_peak_json_members(f, peak);
        fputs(",\"all_cores_flops\":", f);
        cpt_json_num(f, peak->have_all ? a->flops_all_threads : NAN);
        fputs(",\"all_cores_flops_per_core\":", f);
        cpt_json_num(f, peak->have_all ? a->flops_per_core : NAN);
        fputs("}\n", f);
        return;
    }
    fprintf(f,
            "ctxpar bench --peak: FP32 fused multiply-add peak, measured with the CPU kernels'\n"
            "                     instructions (%s, %d lanes per vector)\n"
            "  core class %s: the kernels' register tiles are %s (vectors x rows)\n\n",
            c->kernels, c->vector_lanes, c->uarch, c->tiles);
    fprintf(f, "  one core                %8.1f GFLOP/s   (per second of the thread's CPU time)\n",
            c->flops_per_core * 1e-9);
    if (peak->have_all)
        fprintf(f,
                "  %2d cores at once        %8.1f GFLOP/s   (wall clock, all together; %.1f per "
                "core per CPU-second)\n",
                a->threads, a->flops_all_threads * 1e-9, a->flops_per_core * 1e-9);
    fprintf(f, "\n  One core's figure is the denominator of bench's \"%% of peak\" (times the "
               "cores in use).\n");
}
