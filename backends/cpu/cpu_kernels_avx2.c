// The AVX2 + FMA kernel table (8 lanes), chosen at run time when the CPU has AVX2, FMA and F16C.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdint.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

typedef __m256 vf;
typedef uint32_t vi __attribute__((vector_size(32)));
#define VL 8
#define MR 2
#define NR 6

static inline vf v_load(const float *p) {
    return _mm256_loadu_ps(p);
}
static inline void v_store(float *p, vf v) {
    _mm256_storeu_ps(p, v);
}
static inline vf v_set1(float x) {
    return _mm256_set1_ps(x);
}
static inline vf v_fma(vf a, vf b, vf c) {
    return _mm256_fmadd_ps(a, b, c);
}
static inline vf v_max(vf a, vf b) {
    return _mm256_max_ps(a, b);
}
static inline vf v_min(vf a, vf b) {
    return _mm256_min_ps(a, b);
}
static inline vf v_f16_to_f32_(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#define v_f16_to_f32 v_f16_to_f32_

#define KERNELS_TABLE ctxpar_cpu_kernels_avx2
#define KERNELS_LABEL "avx2"
#include "backends/cpu/cpu_kernels_impl.h"

#pragma GCC pop_options
#else
typedef int ctxpar_cpu_kernels_avx2_not_built; // ISO C wants a non-empty translation unit
#endif
