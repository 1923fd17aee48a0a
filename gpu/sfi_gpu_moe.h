/* The grouped form of a Qwen3-MoE layer's experts, for prefill chunks.
 *
 * The decode form (sfi_gpu_moe_gemv, sfi_gpu_model.h) runs one
 * matrix-vector product per (token, expert) pair and so reads an expert's
 * weights once per pair: right for a decode step's few rows, ruinous for a
 * prefill chunk of thousands. The grouped form sorts the pairs by expert
 * (deterministically, pair order inside an expert), gathers their input
 * rows in that order and runs one cuBLAS GEMM per expert that has pairs
 * (gate/up, SwiGLU, down), then adds the weighted outputs into the
 * residual in the decode form's summation order.
 *
 * It copies the per-expert counts to the host and waits for them (the
 * GEMMs' sizes), so it must not run inside a stream capture: the engine
 * calls it only outside decode steps and never in --exact mode. */
#ifndef SFI_GPU_MOE_H
#define SFI_GPU_MOE_H

#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "sfi_error.h"

typedef struct {
    int T, top, E, H, Im; /* Im: this rank's expert width (tensor parallelism) */
    int dtype;            /* SFI_GPU_BF16 or SFI_GPU_F32: weights and GEMM inputs */
    /* host arrays of E device pointers: gate/up [2 Im][H] (the gate rows,
     * then the up rows), down [H][Im] */
    void *const *w_gu, *const *w_d;
    const float *x;       /* [T][H] the normed input, f32 */
    const int32_t *sel_e; /* [T][top] the route (sfi_gpu_moe_route) */
    const float *sel_w;   /* [T][top] */
    float *h;             /* [T][H] the residual: += the experts' weighted sum */
    /* workspace, pairs = T * top rows */
    int32_t *cnt;   /* device [E] */
    int32_t *h_cnt; /* host [E], pinned (page-locked) */
    int32_t *pos;   /* device [pairs] */
    float *y1;      /* device [pairs][2 Im] f32 */
    void *act;      /* device, pairs * Im * 4 bytes (the SwiGLU in dtype) */
    float *y2;      /* device [pairs][H] f32; first holds the gathered input */
} sfi_gpu_moe_grouped_args;

/* Device bytes of the grouped form's own workspace (cnt and pos) for
 * `rows` tokens; y1, act and y2 are the decode form's buffers. */
uint64_t sfi_gpu_moe_grouped_ws_bytes(int rows, int top, int E);

/* Runs the experts of a->T tokens on stream st through blas (its stream is
 * set to st); returns when the work is enqueued, after one wait for the
 * counts. f32: CUBLAS_COMPUTE_32F_PEDANTIC (no TF32: within the f32
 * end-to-end checks' 1e-4); bf16: bf16 inputs, f32 accumulation and
 * output, the SwiGLU rounded to bf16 as the dense layers' is. */
sfi_status sfi_gpu_moe_grouped(const sfi_gpu_moe_grouped_args *a, cublasHandle_t blas,
                               cudaStream_t st, sfi_error *err);

#endif
