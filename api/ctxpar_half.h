/*
 * ctxpar_half.h - scalar conversions between float and the 16-bit storage types.
 *
 * Round to nearest even, NaN kept NaN, overflow to infinity: the same results as hardware
 * conversions (F16C, AVX512-BF16, CUDA __float2bfloat16_rn), so that every backend and the test
 * oracle agree bit for bit on what a stored 16-bit value is.
 */
#ifndef CTXPAR_HALF_H
#define CTXPAR_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint32_t ctxpar_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ctxpar_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float ctxpar_bf16_to_f32(uint16_t h) { return ctxpar_bits_f32((uint32_t)h << 16); }

static inline uint16_t ctxpar_f32_to_bf16(float f) {
    uint32_t u = ctxpar_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it quiet and NaN after truncation
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ctxpar_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) // inf or NaN
        return ctxpar_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return ctxpar_bits_f32(sign);
        // subnormal: value = man * 2^-24, exact in float
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return ctxpar_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t ctxpar_f32_to_f16(float f) {
    uint32_t u = ctxpar_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) // NaN
        return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    if (abs >= 0x477ff000u) // rounds to >= 65520: infinity
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { // below the smallest normal half (2^-14): subnormal or zero
        // Adding 0.5f aligns the half subnormal grid (2^-24) with float's ulp at 0.5 (2^-24),
        // so the float addition performs the round-to-nearest-even for us.
        float a = ctxpar_bits_f32(abs) + 0.5f;
        return (uint16_t)(sign | (uint16_t)(ctxpar_f32_bits(a) - 0x3f000000u));
    }
    uint32_t r = abs - 0x38000000u; // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)(r >> 13));
}

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_HALF_H */
