// The AVX-512 kernel table (16 lanes), chosen at run time when the CPU has AVX512F.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdint.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")

typedef __m512 vf;
typedef uint32_t vi __attribute__((vector_size(64)));
#define VL 16
#define MR 2
#define NR 8

static inline vf v_load(const float *p) {
    return _mm512_loadu_ps(p);
}
static inline void v_store(float *p, vf v) {
    _mm512_storeu_ps(p, v);
}
static inline vf v_set1(float x) {
    return _mm512_set1_ps(x);
}
static inline vf v_fma(vf a, vf b, vf c) {
    return _mm512_fmadd_ps(a, b, c);
}
static inline vf v_max(vf a, vf b) {
    return _mm512_max_ps(a, b);
}
static inline vf v_min(vf a, vf b) {
    return _mm512_min_ps(a, b);
}
static inline vf v_f16_to_f32_(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
#define v_f16_to_f32 v_f16_to_f32_

#define KERNELS_TABLE ctxpar_cpu_kernels_avx512
#define KERNELS_LABEL "avx512"
#include "backends/cpu/cpu_kernels_impl.h"

#pragma GCC pop_options
#else
typedef int ctxpar_cpu_kernels_avx512_not_built; // ISO C wants a non-empty translation unit
#endif
