/*
 * cpu_vec_avx512.h - the vector vocabulary of cpu_kernels_impl.h on AVX-512 (16 lanes), for the
 * AVX-512 kernel tables (one per register tile). It turns the AVX-512 target on with
 * `#pragma GCC push_options`; the including file pops it after the kernels.
 */
#ifndef CTXPAR_CPU_VEC_AVX512_H
#define CTXPAR_CPU_VEC_AVX512_H
#include <immintrin.h>
#include <stdint.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")

typedef __m512 vf;
typedef uint32_t vi __attribute__((vector_size(64)));
#define VL 16

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
// VPERMT2D: index bit 4 picks b, as in cpu_kernels_impl.h's v_shuffle2 (and for clang too).
#define v_shuffle2(a, b, idx) \
    ((vi)_mm512_permutex2var_epi32((__m512i)(a), (__m512i)(idx), (__m512i)(b)))

#endif /* CTXPAR_CPU_VEC_AVX512_H */
