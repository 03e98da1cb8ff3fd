// Element types on the device: ctxpar dtypes as CUDA types, and conversions to and from F32.
// The 16-bit conversions are the round-to-nearest-even intrinsics, which give the same bits as
// api/ctxpar_half.h on the host.
#ifndef CTXPAR_CUDA_DTYPE_CUH
#define CTXPAR_CUDA_DTYPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace ctxpar_cuda {

__device__ __forceinline__ float to_f32(float x) {
    return x;
}
__device__ __forceinline__ float to_f32(__half x) {
    return __half2float(x);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

// A 16-bit value given by its bits, as F32.
template <typename T> __device__ __forceinline__ float bits_to_f32(uint16_t u);
template <> __device__ __forceinline__ float bits_to_f32<__half>(uint16_t u) {
    return __half2float(__ushort_as_half(u));
}
template <> __device__ __forceinline__ float bits_to_f32<__nv_bfloat16>(uint16_t u) {
    return __bfloat162float(__ushort_as_bfloat16(u));
}

// The exponent bits of a 16-bit type: a value is an infinity or a NaN when all of them are set.
template <typename T> __device__ __forceinline__ uint16_t exponent_bits();
template <> __device__ __forceinline__ uint16_t exponent_bits<__half>() {
    return 0x7c00u;
}
template <> __device__ __forceinline__ uint16_t exponent_bits<__nv_bfloat16>() {
    return 0x7f80u;
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) {
    return x;
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Two floats as one 32-bit register of 16-bit values, lo in the low half (the element with the
// lower index), as the mma fragments want them.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

// Exact conversions for cast: as above, and NaN keeps its sign and payload the way
// api/ctxpar_half.h keeps it (the intrinsics return one canonical NaN instead).
__device__ __forceinline__ float exact_to_f32(float x) {
    return x;
}
__device__ __forceinline__ float exact_to_f32(__half x) {
    const uint16_t h = __half_as_ushort(x);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu))
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u |
                               ((uint32_t)(h & 0x3ffu) << 13));
    return __half2float(x);
}
__device__ __forceinline__ float exact_to_f32(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T exact_from_f32(float x);
template <> __device__ __forceinline__ float exact_from_f32<float>(float x) {
    return x;
}
template <> __device__ __forceinline__ __half exact_from_f32<__half>(float x) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return __ushort_as_half(
            (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | (((u & 0x7fffffffu) >> 13) & 0x3ffu)));
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 exact_from_f32<__nv_bfloat16>(float x) {
    const uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return __ushort_as_bfloat16((uint16_t)((u >> 16) | 0x40u));
    return __float2bfloat16_rn(x);
}

// f(T{}) for each CUDA type of the kernels (float, __half, __nv_bfloat16), in that order, until
// one returns an error: for host code that configures or queries every instantiation.
template <class F> cudaError_t for_each_dtype(F f) {
    cudaError_t e = f(float{});
    if (e == cudaSuccess)
        e = f(__half{});
    if (e == cudaSuccess)
        e = f(__nv_bfloat16{});
    return e;
}

} // namespace ctxpar_cuda

// Calls F<T> with T the CUDA type of a ctxpar dtype; returns cudaErrorInvalidValue for others.
#define CTXPAR_CUDA_DISPATCH_DTYPE(dtype, F, ...)                                                  \
    ((dtype) == CTXPAR_DTYPE_F32    ? F<float>(__VA_ARGS__)                                        \
     : (dtype) == CTXPAR_DTYPE_F16  ? F<__half>(__VA_ARGS__)                                       \
     : (dtype) == CTXPAR_DTYPE_BF16 ? F<__nv_bfloat16>(__VA_ARGS__)                                \
                                    : cudaErrorInvalidValue)

#endif // CTXPAR_CUDA_DTYPE_CUH
