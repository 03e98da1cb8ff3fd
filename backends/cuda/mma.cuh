// Warp-level tensor-core multiply-accumulate (sm_80+): D[16x8] += A[16x16] * B[16x8], 16-bit
// inputs, F32 accumulators. Fragment layout, with lane = 4 * g + t (g = lane / 4, t = lane % 4):
//   A (row-major 16x16), 4 registers of two 16-bit values (low half = lower column):
//     a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]
//     a[3] = A[g+8][2t+8, 2t+9]
//   B (16x8, k by n), 2 registers: b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   C/D (16x8 F32): c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
#ifndef CTXPAR_CUDA_MMA_CUH
#define CTXPAR_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace ctxpar_cuda {

template <typename T>
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]);

template <>
__device__ __forceinline__ void mma_16816<__half>(float c[4], const uint32_t a[4],
                                                  const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                         const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two 16-bit values from shared memory as one register, lo at the lower address.
__device__ __forceinline__ uint32_t ld_pair(const uint16_t *p) {
    return *reinterpret_cast<const uint32_t *>(p);
}
__device__ __forceinline__ uint32_t join_pair(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

} // namespace ctxpar_cuda

#endif // CTXPAR_CUDA_MMA_CUH
