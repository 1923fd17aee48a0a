/* Kernels of the tensor-parallel decode (sfi-gpu run --tp N): the LM head
 * is split over the vocabulary (rank r holds rows [v0, v0 + n) of it), so
 * the greedy argmax is each rank's best (value, id) of its slice, an
 * all-gather of those, and the best of the gathered ones. The packed key
 * is argmax_kernel's (sfi_gpu_model.cu): the float's order-preserving bits
 * above the complement of the token id, so the largest value wins and among
 * equal values the smaller id (the reference's tie rule), across ranks as
 * within one. Launch on the given stream, allocate nothing, return a
 * cudaError_t value. */
#ifndef SFI_GPU_TP_H
#define SFI_GPU_TP_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* keys[t] = max(keys[t], best key of logits[t][0..V) with ids v0 + i);
 * keys must be zero before the first call of a step. */
cudaError_t sfi_gpu_argmax_keys(const float *logits, int T, int V, int v0, unsigned long long *keys,
                                cudaStream_t st);

/* out[t] = the id of max over r < n_ranks of all[r * T + t] (the gathered
 * keys), then keys[t] = 0 (this rank's keys, ready for the next step). */
cudaError_t sfi_gpu_argmax_merge(const unsigned long long *all, int n_ranks, int T,
                                 unsigned long long *keys, int32_t *out, cudaStream_t st);

#ifdef __cplusplus
}
#endif
#endif
