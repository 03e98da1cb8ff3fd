// The portable kernel table: GCC vector extensions of 4 floats (SSE2 on any x86-64, NEON
// elsewhere); a multiply and an add where the other tables fuse them.
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(16)));
typedef uint32_t vi __attribute__((vector_size(16)));
typedef int32_t vmask __attribute__((vector_size(16))); // what comparisons return
#define VL 4
#define MR 2
#define NR 4

static inline vf v_load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void v_store(float *p, vf v) {
    memcpy(p, &v, sizeof v);
}
static inline vf v_set1(float x) {
    return (vf){x, x, x, x};
}
static inline vf v_fma(vf a, vf b, vf c) {
    return a * b + c;
}
static inline vf v_select(vmask m, vf a, vf b) {
    return (vf)((m & (vmask)a) | (~m & (vmask)b));
}
static inline vf v_max(vf a, vf b) {
    return v_select(a > b, a, b);
}
static inline vf v_min(vf a, vf b) {
    return v_select(a < b, a, b);
}

#define KERNELS_TABLE ctxpar_cpu_kernels_generic
#define KERNELS_LABEL "generic"
#include "backends/cpu/cpu_kernels_impl.h"
