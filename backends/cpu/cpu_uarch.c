// The core's class (ctxpar_cpu_uarch) from CPUID, and the register tile each class gets.
#include <pthread.h>
#include <string.h>

#include "backends/cpu/cpu_uarch.h"

#ifdef CTXPAR_CPU_HAVE_X86_KERNELS
#include <cpuid.h>
#endif

static const char *const uarch_names[] = {"auto", "generic",    "avx2",      "zen4",
                                          "zen5", "intel-1fma", "intel-2fma"};

const char *ctxpar_cpu_uarch_name(ctxpar_cpu_uarch uarch) {
    return (unsigned)uarch < sizeof uarch_names / sizeof uarch_names[0] ? uarch_names[uarch] : NULL;
}

void ctxpar_cpu_id_read(ctxpar_cpu_id *id) {
    memset(id, 0, sizeof *id);
#ifdef CTXPAR_CPU_HAVE_X86_KERNELS
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return;
    memcpy(id->vendor, &b, 4);
    memcpy(id->vendor + 4, &d, 4);
    memcpy(id->vendor + 8, &c, 4);
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        const int base_family = (int)((a >> 8) & 0xf), base_model = (int)((a >> 4) & 0xf);
        id->family = base_family + (base_family == 0xf ? (int)((a >> 20) & 0xff) : 0);
        id->model = base_model |
                    (base_family == 0x6 || base_family == 0xf ? (int)((a >> 16) & 0xf) << 4 : 0);
        id->hypervisor = (int)((c >> 31) & 1);
    }
    // GCC's checks include the OS's (XGETBV): a hypervisor may hide the registers' state.
    __builtin_cpu_init();
    id->avx512f = __builtin_cpu_supports("avx512f") != 0;
    id->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
}

// Intel family 6 models with AVX-512 whose FMA units are known from the model alone. Skylake-SP
// and Cascade Lake (0x55) are not here: their Xeon Bronze, Silver and some Gold parts have one
// 512-bit FMA unit, the others two, under the same model number.
static const int intel_two_units[] = {
    0x6a, 0x6c, // Ice Lake-SP, -D
    0x8f,       // Sapphire Rapids
    0xcf,       // Emerald Rapids
    0xad, 0xae, // Granite Rapids
    0x57, 0x85, // Knights Landing, Knights Mill (two vector units)
};
static const int intel_one_unit[] = {
    0x66,       // Cannon Lake
    0x7d, 0x7e, // Ice Lake client
    0x8c, 0x8d, // Tiger Lake
    0xa7,       // Rocket Lake
    0x97, 0x9a, // Alder Lake (AVX-512 on early firmware only)
};

static int in_list(const int *list, size_t n, int model) {
    for (size_t i = 0; i < n; i++)
        if (list[i] == model)
            return 1;
    return 0;
}

ctxpar_cpu_uarch ctxpar_cpu_uarch_classify(const ctxpar_cpu_id *id, int (*two_fma_units)(void)) {
    if (!id->avx512f)
        return id->avx2 ? CTXPAR_CPU_UARCH_AVX2 : CTXPAR_CPU_UARCH_GENERIC;
    if (!strcmp(id->vendor, "AuthenticAMD") || !strcmp(id->vendor, "HygonGenuine")) {
        // Zen 4 (family 0x19) is the first AMD core with AVX-512; Zen 5 (0x1a) and later have
        // 512-bit data paths.
        return id->family <= 0x19 ? CTXPAR_CPU_UARCH_ZEN4 : CTXPAR_CPU_UARCH_ZEN5;
    }
    // A hypervisor reports the model it is told to (seen: Rocket Lake's 0xa7, a one-unit client
    // core, on a server core with AMX and two units): there the probe has the last word.
    if (!strcmp(id->vendor, "GenuineIntel") && id->family == 6 &&
        !(id->hypervisor && two_fma_units)) {
        if (in_list(intel_two_units, sizeof intel_two_units / sizeof *intel_two_units, id->model))
            return CTXPAR_CPU_UARCH_INTEL_2FMA;
        if (in_list(intel_one_unit, sizeof intel_one_unit / sizeof *intel_one_unit, id->model))
            return CTXPAR_CPU_UARCH_INTEL_1FMA;
    }
    // An AVX-512 core the tables do not know: measure.
    return two_fma_units && two_fma_units() ? CTXPAR_CPU_UARCH_INTEL_2FMA
                                            : CTXPAR_CPU_UARCH_INTEL_1FMA;
}

int ctxpar_cpu_two_fma512_probe(void) {
#ifdef CTXPAR_CPU_HAVE_X86_KERNELS
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx2") ||
        !__builtin_cpu_supports("fma"))
        return 0;
    // Alternated and best-of, per second of the thread's CPU time: another process taking the
    // core slows a round, never speeds one, so the best rounds compare the units themselves.
    double r512 = 0, r256 = 0;
    for (int i = 0; i < 2; i++) {
        double a = ctxpar_cpu_thread_fma_rate(&ctxpar_cpu_kernels_avx512, 3, 0.002);
        double b = ctxpar_cpu_thread_fma_rate(&ctxpar_cpu_kernels_avx2, 3, 0.002);
        r512 = a > r512 ? a : r512;
        r256 = b > r256 ? b : r256;
    }
    return r512 >= 1.5 * r256;
#else
    return 0;
#endif
}

static ctxpar_cpu_uarch detected;
static pthread_once_t detect_once = PTHREAD_ONCE_INIT;

static void detect(void) {
    ctxpar_cpu_id id;
    ctxpar_cpu_id_read(&id);
    detected = ctxpar_cpu_uarch_classify(&id, ctxpar_cpu_two_fma512_probe);
}

ctxpar_cpu_uarch ctxpar_cpu_uarch_detect(void) {
    pthread_once(&detect_once, detect);
    return detected;
}

// The register tile per class. Every tile fits the register file with the accumulators, the
// lane vectors and one broadcast (16 vector registers with AVX2, 32 with AVX-512), and the
// lane block (tile rows x lanes) divides the 64-row tiles of the drivers.
//  - avx2: 2 x 6 (12 accumulators, 8 loads per 12 FMAs) on every class: on an AVX2-only
//    core (Zen 3, measured: docs/performance.md) no other tile that fits was faster.
//  - avx512: 2 x 8 where a 512-bit FMA is issued at most once per cycle (Zen 4's split units,
//    one-unit Intel cores): 16 accumulators already cover the FMA latency. 4 x 4 (16
//    accumulators, 8 loads per 16 FMAs, a lane block of one whole 64-row tile) where two
//    full-width units issue two per cycle (Intel server cores, Zen 5). Measured on an Intel
//    server core (docs/performance.md): 4 x 4 beat 2 x 8 by 2 % in the forward and 8 % in the
//    backward, and 4 x 6 (24 accumulators) by as much: a 64-row tile is not a multiple of 6, so
//    4 x 6 computed 66 rows for 64, and its accumulators left no registers for the loads.
const ctxpar_cpu_kernels *ctxpar_cpu_kernels_for(const ctxpar_cpu_kernels *isa,
                                                 ctxpar_cpu_uarch uarch) {
#ifdef CTXPAR_CPU_HAVE_X86_KERNELS
    if (isa == &ctxpar_cpu_kernels_avx512 &&
        (uarch == CTXPAR_CPU_UARCH_INTEL_2FMA || uarch == CTXPAR_CPU_UARCH_ZEN5))
        return &ctxpar_cpu_kernels_avx512_4x4;
#endif
    (void)uarch;
    return isa;
}
