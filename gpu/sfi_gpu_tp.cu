/* Kernels of the tensor-parallel decode; see sfi_gpu_tp.h. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "sfi_gpu_tp.h"

namespace {

/* argmax_kernel's key (sfi_gpu_model.cu): -0 and +0 equal, larger floats
 * larger keys */
__device__ __forceinline__ uint32_t okey(float x) {
    uint32_t u = __float_as_uint(x);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* grid (blocks per row, T), block 256: a block's best folded into keys[t]
 * by a 64-bit atomicMax (the result does not depend on the order) */
__global__ void argmax_keys_kernel(const float *__restrict__ lg, int V, int v0,
                                   unsigned long long *__restrict__ keys) {
    __shared__ unsigned long long sb[32];
    const int t = blockIdx.y;
    const float *x = lg + (size_t)t * V;
    unsigned long long best = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
        const unsigned long long k =
            ((unsigned long long)okey(x[i]) << 32) | (uint32_t)~(uint32_t)(v0 + i);
        best = k > best ? k : best;
    }
    for (int off = 16; off > 0; off >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
        best = o > best ? o : best;
    }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) sb[w] = best;
    __syncthreads();
    if (w == 0) {
        best = lane < nw ? sb[lane] : 0;
        for (int off = 16; off > 0; off >>= 1) {
            const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
            best = o > best ? o : best;
        }
        if (lane == 0) atomicMax(keys + t, best);
    }
}

__global__ void argmax_merge_kernel(const unsigned long long *__restrict__ all, int n_ranks, int T,
                                    unsigned long long *__restrict__ keys,
                                    int32_t *__restrict__ out) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    unsigned long long best = 0;
    for (int r = 0; r < n_ranks; r++) {
        const unsigned long long k = all[(size_t)r * T + t];
        best = k > best ? k : best;
    }
    out[t] = (int32_t)~(uint32_t)(best & 0xffffffffu);
    keys[t] = 0;
}

} // namespace

extern "C" {

cudaError_t sfi_gpu_argmax_keys(const float *logits, int T, int V, int v0,
                                unsigned long long *keys, cudaStream_t st) {
    if (T <= 0 || V <= 0) return cudaSuccess;
    int bx = (V + 4095) / 4096;
    if (bx > 64) bx = 64;
    argmax_keys_kernel<<<dim3(bx, T), 256, 0, st>>>(logits, V, v0, keys);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_argmax_merge(const unsigned long long *all, int n_ranks, int T,
                                 unsigned long long *keys, int32_t *out, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    argmax_merge_kernel<<<(T + 127) / 128, 128, 0, st>>>(all, n_ranks, T, keys, out);
    return cudaGetLastError();
}

} // extern "C"
