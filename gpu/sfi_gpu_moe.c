/* The grouped MoE experts; see sfi_gpu_moe.h. */
#include <config.h>

#include "sfi_gpu_moe.h"

#include "sfi_gpu.h"
#include "sfi_gpu_model.h"
#include "sfi_gpu_status.h"

#define CK(x) SFI_GPU_RETURN_IF_FAILED(x, #x)
#define CKB(x) SFI_GPU_BLAS_RETURN_IF_FAILED(x, #x)

/* sfi_gpu_silu_mul's grid has a row per block row (at most 65535) */
#define SILU_ROWS 32768

uint64_t sfi_gpu_moe_grouped_ws_bytes(int rows, int top, int E)
{
    return (uint64_t)rows * top * 4 + (uint64_t)E * 4;
}

sfi_status sfi_gpu_moe_grouped(const sfi_gpu_moe_grouped_args *a, cublasHandle_t blas,
                               cudaStream_t st, sfi_error *err)
{
    const int T = a->T, top = a->top, E = a->E, H = a->H, Im = a->Im;
    if (T <= 0)
        return SFI_OK;
    const int pairs = T * top, bf = a->dtype == SFI_GPU_BF16;
    const size_t esz = bf ? 2 : 4;
    CK(sfi_gpu_moe_sort(a->sel_e, pairs, E, a->cnt, a->pos, st));
    /* the gathered input lives in y2 (pairs * H floats hold it in either
     * type) until the down GEMM overwrites it: no buffer of its own */
    void *xs = a->y2;
    CK(sfi_gpu_moe_gather(a->x, H, top, pairs, a->pos, xs, a->dtype, st));
    /* The GEMM sizes are the counts, which the host needs. Waiting here is
     * allowed because prefill is never captured (only the decode step is,
     * capture_step in sfi_gpu_engine.c) and already waits on its stream
     * between chunks; the engine calls this only with e->decoding == 0.
     * Under --tp every rank waits for its own stream only, before its
     * all-reduce is enqueued, so no rank waits on another here. */
    CK(cudaMemcpyAsync(a->h_cnt, a->cnt, (size_t)E * 4, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    long sum = 0;
    for (int x = 0; x < E; x++) {
        if (a->h_cnt[x] < 0 || a->h_cnt[x] > pairs)
            return sfi_error_set(err, SFI_EIO, "MoE experts: expert %d has %d of %d pairs", x,
                                 (int)a->h_cnt[x], pairs);
        sum += a->h_cnt[x];
    }
    if (sum != pairs)
        return sfi_error_set(err, SFI_EIO,
                             "MoE experts: the route names experts outside 0..%d (%ld of %d pairs "
                             "sorted)",
                             E - 1, sum, pairs);
    /* One cublasGemmEx per expert with pairs, not cublasGemmGroupedBatchedEx
     * (which the toolkit's cuBLAS 13 has): that one takes device arrays of
     * the A/B/C pointers, one more upload per GEMM after the counts'
     * download, and whether it covers the f32 runs' PEDANTIC compute type
     * in one kernel could not be measured here. The loop costs at most 2 E
     * launches per layer, each a product of n_e rows over the whole expert
     * (Qwen3-30B-A3B, 2048-token chunks: about 128 rows each), where the
     * decode form read every expert's weights once per pair. */
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t ct = bf ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
    CKB(cublasSetStream(blas, st));
    for (int x = 0, off = 0; x < E; off += a->h_cnt[x], x++) {
        const int n = a->h_cnt[x];
        if (!n)
            continue;
        CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * Im, n, H, &one, a->w_gu[x], dt, H,
                         (const char *)xs + (size_t)off * H * esz, dt, H, &zero,
                         a->y1 + (size_t)off * 2 * Im, CUDA_R_32F, 2 * Im, ct,
                         CUBLAS_GEMM_DEFAULT));
    }
    for (int r0 = 0; r0 < pairs; r0 += SILU_ROWS) {
        const int n = pairs - r0 < SILU_ROWS ? pairs - r0 : SILU_ROWS;
        CK(sfi_gpu_silu_mul(a->y1 + (size_t)r0 * 2 * Im, n, Im, 0,
                            (char *)a->act + (size_t)r0 * Im * esz, a->dtype, 0, st));
    }
    for (int x = 0, off = 0; x < E; off += a->h_cnt[x], x++) {
        const int n = a->h_cnt[x];
        if (!n)
            continue;
        CKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, H, n, Im, &one, a->w_d[x], dt, Im,
                         (const char *)a->act + (size_t)off * Im * esz, dt, Im, &zero,
                         a->y2 + (size_t)off * H, CUDA_R_32F, H, ct, CUBLAS_GEMM_DEFAULT));
    }
    CK(sfi_gpu_moe_combine_pos(a->h, a->y2, a->pos, a->sel_w, T, top, H, st));
    return SFI_OK;
}
