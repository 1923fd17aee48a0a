/* Kernels of the tensor-parallel decode; see sfi_gpu_tp.h. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "sfi_gpu_math.cuh"
#include "sfi_gpu_tp.h"

namespace {

/* grid (blocks per row, T), block 256: the keys of sfi_gpu_argmax's
 * argmax_kernel, ids offset by the rank's first vocabulary row v0 */
__global__ void argmax_keys_kernel(const float *__restrict__ lg, int V, int v0,
                                   unsigned long long *__restrict__ keys) {
    const int t = blockIdx.y;
    sfi_dev_argmax_fold(lg + (size_t)t * V, V, v0, keys + t);
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
