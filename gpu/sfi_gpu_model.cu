/* The Qwen3 forward pass's kernels and the per-step plan; see
 * sfi_gpu_model.h. Exact variants follow ref/sfi_qwen3.c operation for
 * operation (sequential sums, explicit _rn intrinsics, sfi_dev_expf). */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "sfi_gpu.h"
#include "sfi_gpu_math.cuh"
#include "sfi_gpu_tma.cuh"
#include "sfi_gpu_model.h"

namespace {

/* programmatic dependent launch: wait for the previous kernel of the
 * stream (its writes visible), and let the next one start launching.
 * Both are no-ops for a kernel launched without the attribute. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

/* sfi_step_kind / sfi_step_reason / sfi_trigger_kind values (ref/sfi_state.h),
 * which this CUDA file cannot include */
enum { kSlow = 1, kFast = 2 };
enum { kRNone = 0, kRFirst = 1, kRTrigger = 2, kRTmax = 3, kRInterval = 4, kRAlways = 5 };
enum { kTrigSfi = 0, kTrigTmax, kTrigBoundary, kTrigInterval, kTrigAlways, kTrigNever };

__device__ __forceinline__ float ld_elem(const void *p, size_t i, int dtype) {
    if (dtype == SFI_GPU_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void st_elem(void *p, size_t i, int dtype, float x) {
    if (dtype == SFI_GPU_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
    else
        ((float *)p)[i] = x;
}

/* Block sum of one float per thread (any block size up to 1024; a fixed
 * tree, so deterministic). sh: 33 floats. */
__device__ float block_sum(float v, float *sh) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.f;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

/* ---- embedding, norms, elementwise ---- */

__global__ void embed_kernel(const int32_t *__restrict__ tok, const void *__restrict__ E,
                             int dtype, int H, float *__restrict__ x, float *__restrict__ ss,
                             __nv_bfloat16 *__restrict__ xb) {
    pdl_wait();
    pdl_launch();
    const int t = blockIdx.x;
    const size_t base = (size_t)tok[t] * H;
    if (!ss) {
        for (int i = threadIdx.x; i < H; i += blockDim.x) x[(size_t)t * H + i] = ld_elem(E, base + i, dtype);
        return;
    }
    /* a deferred norm's producer (sfi_gpu_rownorm): 8 columns a thread */
    for (int g = threadIdx.x; g < H / 8; g += blockDim.x) {
        float a = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int i = 8 * g + j;
            const float v = ld_elem(E, base + i, dtype);
            x[(size_t)t * H + i] = v;
            xb[(size_t)t * H + i] = __float2bfloat16_rn(v);
            a += v * v;
        }
        ss[(size_t)t * (H / 8) + g] = a;
    }
}

/* W[m][k] *= w[k], in bf16 (the deferred norm's folded weights) */
__global__ void scale_cols_kernel(__nv_bfloat16 *__restrict__ W, int M, int N, const float *__restrict__ w) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)M * N;
         i += (size_t)gridDim.x * blockDim.x)
        W[i] = __float2bfloat16_rn(__bfloat162float(W[i]) * w[i % N]);
}

/* One block per row. Exact: thread 0 sums x*x in ascending order, as the
 * reference's rmsnorm. */
template <bool EXACT>
__global__ void rmsnorm_kernel(const float *__restrict__ x, const float *__restrict__ w, int n,
                               float eps, float *__restrict__ yf, __nv_bfloat16 *__restrict__ yb) {
    pdl_wait();
    pdl_launch();
    __shared__ float sh[34];
    const int t = blockIdx.x;
    const float *xr = x + (size_t)t * n;
    float r;
    if (EXACT) {
        if (threadIdx.x == 0) {
            float ss = 0.f;
            for (int i = 0; i < n; i++) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
            sh[33] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
        }
        __syncthreads();
        r = sh[33];
    } else {
        float a = 0.f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) a += xr[i] * xr[i];
        a = block_sum(a, sh);
        r = rsqrtf(a / (float)n + eps);
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        /* w NULL: the weights were folded into the next product's */
        const float y = w ? __fmul_rn(w[i], __fmul_rn(xr[i], r)) : __fmul_rn(xr[i], r);
        if (yf) yf[(size_t)t * n + i] = y;
        if (yb) yb[(size_t)t * n + i] = __float2bfloat16_rn(y);
    }
}

/* Thread per (row i, token t): the reference's sfi_dot (ascending, one
 * accumulator from 0), then + b, then (accumulate) Y + that. */
__global__ void gemv_exact_kernel(const float *__restrict__ W, const float *__restrict__ X,
                                  const float *__restrict__ b, float *__restrict__ Y, int M, int N,
                                  int accumulate) {
    pdl_wait();
    pdl_launch();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= M) return;
    const float *wr = W + (size_t)i * N, *xr = X + (size_t)t * N;
    float a = 0.f;
    for (int j = 0; j < N; j++) a = __fadd_rn(a, __fmul_rn(wr[j], xr[j]));
    if (b) a = __fadd_rn(a, b[i]);
    float *y = Y + (size_t)t * M + i;
    *y = accumulate ? __fadd_rn(*y, a) : a;
}

__global__ void add_bias_kernel(float *__restrict__ y, const float *__restrict__ b, int M) {
    pdl_wait();
    pdl_launch();
    const int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < M; i += gridDim.x * blockDim.x)
        y[(size_t)t * M + i] += b[i];
}

template <bool EXACT>
__global__ void silu_mul_kernel(const float *__restrict__ gu, int I, int tiled, int adtype, void *act) {
    pdl_wait();
    pdl_launch();
    const int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < I; i += gridDim.x * blockDim.x) {
        const size_t gi = tiled ? (size_t)(i / 8) * 16 + i % 8 : (size_t)i;
        const size_t ui = tiled ? gi + 8 : (size_t)I + i;
        const float g = gu[(size_t)t * 2 * I + gi], u = gu[(size_t)t * 2 * I + ui];
        const float e = EXACT ? sfi_dev_expf(-g) : __expf(-g);
        const float s = __fdiv_rn(g, __fadd_rn(1.0f, e));
        st_elem(act, (size_t)t * I + i, adtype, __fmul_rn(s, u));
    }
}

__global__ void to_bf16_kernel(const float *__restrict__ x, size_t n, __nv_bfloat16 *__restrict__ y) {
    pdl_wait();
    pdl_launch();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

/* Argmax in two launches: blocks of a row each fold their best key
 * (sfi_dev_argmax_key: the largest value, among equal values the smaller
 * index, the reference's first maximum) into slot[t] with a 64-bit
 * atomicMax, so the result does not depend on the order. Then
 * argmax_decode writes the ids. */
__global__ void argmax_kernel(const float *__restrict__ lg, int V, const int32_t *__restrict__ active,
                              unsigned long long *__restrict__ slot) {
    pdl_wait();
    pdl_launch();
    const int t = blockIdx.y;
    if (active && !active[t]) return;
    sfi_dev_argmax_fold(lg + (size_t)t * V, V, 0, slot + t);
}

__global__ void argmax_decode_kernel(unsigned long long *__restrict__ slot, int T,
                                     const int32_t *__restrict__ active, int32_t *__restrict__ out) {
    pdl_wait();
    pdl_launch();
    const int t = threadIdx.x;
    if (t >= T) return;
    if (!active || active[t]) out[t] = (int32_t)~(uint32_t)(slot[t] & 0xffffffffu);
    slot[t] = 0; /* ready for the next step */
}

/* ---- skinny GEMM on tensor cores (decode: T <= 64 rows of activations) ----
 *
 * Y[t][i] (= or +=) sum_k X[t][k] W[i][k] for bf16 W [M][N] and bf16 X
 * [T][N], f32 Y. A CTA owns 16 output rows; its 8 warps split the
 * reduction into k-blocks of 32 (warp w takes blocks w, w + 8, ...), then
 * add their partials in warp order (deterministic). Per k-block a lane
 * loads 16 bytes of each of its two weight rows (g and g + 8) and 16 bytes
 * of X per token tile, and runs two mma.sync m16n8k16 per token tile: the
 * k order inside a block is permuted identically for W and X (lane t's 8
 * consecutive k feed logical k {2t, 2t+1, 2t+8, 2t+9} of two k-steps), so
 * every operand is one 16-byte load and the sum is unchanged. Weights
 * stream through once (no shared memory, no split-K pass); X is re-read
 * by every CTA from L2. */
enum { kEpiStore = 0, kEpiAccumulate = 1, kEpiSwiGLU = 2 };
/* or'ed into the slab kernel's epi: the next kernel may launch right
 * after this one's wait (sfi_gpu_gemm_set_trigger), not after its products */
constexpr int kEpiTriggerWait = 16;

__device__ __forceinline__ void mma_bf16_g(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                           uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int NT>
__global__ void __launch_bounds__(256) skinny_gemm_kernel(const __nv_bfloat16 *__restrict__ W,
                                                          const __nv_bfloat16 *__restrict__ X,
                                                          void *__restrict__ Yv, int T, int M, int N,
                                                          int epi, float *__restrict__ part,
                                                          int *__restrict__ counters) {
    constexpr int U = 4; /* k-blocks in flight per warp */
    __shared__ float red[8][32][NT * 4 + 1];
    __shared__ int s_last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int r0 = blockIdx.x * 16;
    const int ks = gridDim.y, ky = blockIdx.y;
    const int ra = min(r0 + g, M - 1), rb = min(r0 + g + 8, M - 1);
    const __nv_bfloat16 *wa = W + (size_t)ra * N + 8 * t4, *wb = W + (size_t)rb * N + 8 * t4;
    float c[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
    /* this CTA's k-blocks: a contiguous share of the reduction (split-K
     * over gridDim.y when there are few row tiles) */
    const int nkb_all = N / 32;
    const int kb_lo = (int)((long)nkb_all * ky / ks), kb_hi = (int)((long)nkb_all * (ky + 1) / ks);
    uint4 A[U], Bv[U];
    auto load_w = [&](int kb0) {
#pragma unroll
        for (int u = 0; u < U; u++)
            if (kb0 + u < kb_hi) {
                A[u] = __ldg(reinterpret_cast<const uint4 *>(wa + (kb0 + u) * 32));
                Bv[u] = __ldg(reinterpret_cast<const uint4 *>(wb + (kb0 + u) * 32));
            }
    };
    /* the weights do not depend on the previous kernel: their first loads
     * are issued before waiting for it (programmatic dependent launch) */
    load_w(kb_lo + warp * U);
    pdl_wait();
    const __nv_bfloat16 *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) xr[j] = X + (size_t)min(8 * j + g, T - 1) * N + 8 * t4;
    for (int kb0 = kb_lo + warp * U; kb0 < kb_hi; kb0 += 8 * U) {
        uint4 Xv[U][NT];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (kb0 + u < kb_hi)
#pragma unroll
                for (int j = 0; j < NT; j++) Xv[u][j] = __ldg(reinterpret_cast<const uint4 *>(xr[j] + (kb0 + u) * 32));
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb0 + u < kb_hi) {
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    mma_bf16_g(c[j], A[u].x, Bv[u].x, A[u].y, Bv[u].y, Xv[u][j].x, Xv[u][j].y);
                    mma_bf16_g(c[j], A[u].z, Bv[u].z, A[u].w, Bv[u].w, Xv[u][j].z, Xv[u][j].w);
                }
            }
        }
        if (kb0 + 8 * U < kb_hi) load_w(kb0 + 8 * U);
    }
    pdl_launch();
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[warp][lane][j * 4 + e] = c[j][e];
    __syncthreads();
    /* warp 0 adds the 8 partials in order; with split-K it stores the
     * CTA's partial and the last CTA of the row tile adds the splits in
     * order (deterministic) and finishes */
    if (warp != 0) return;
    float v[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            v[j][e] = 0.f;
#pragma unroll
            for (int w = 0; w < 8; w++) v[j][e] += red[w][lane][j * 4 + e];
        }
    if (ks > 1) {
        auto pidx = [&](int y, int j, int e) {
            const int row = r0 + g + (e >= 2 ? 8 : 0), tok = 8 * j + 2 * t4 + (e & 1);
            return ((size_t)y * 64 + tok) * M + row;
        };
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) part[pidx(ky, j, e)] = v[j][e];
        __threadfence();
        __syncwarp();
        if (lane == 0) s_last = atomicAdd(&counters[blockIdx.x], 1) == ks - 1;
        __syncwarp();
        if (!s_last) return;
        __threadfence();
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float a = 0.f;
                for (int y = 0; y < ks; y++) a += __ldcg(part + pidx(y, j, e));
                v[j][e] = a;
            }
        if (lane == 0) counters[blockIdx.x] = 0;
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        if (epi == kEpiSwiGLU) {
            /* tiled gate/up rows: row g of the tile is gate i, row g + 8 its
             * up; act [T][M/2] gets silu(gate) * up in bf16 */
            const int i = r0 / 2 + g;
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int tok = 8 * j + 2 * t4 + e;
                if (r0 + g < M && tok < T) {
                    const float gt = v[j][e], up = v[j][e + 2];
                    const float a = gt / (1.0f + __expf(-gt)) * up;
                    ((__nv_bfloat16 *)Yv)[(size_t)tok * (M / 2) + i] = __float2bfloat16_rn(a);
                }
            }
            continue;
        }
        float *Y = (float *)Yv;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = r0 + g + (e >= 2 ? 8 : 0), tok = 8 * j + 2 * t4 + (e & 1);
            if (row < M && tok < T) {
                float *y = Y + (size_t)tok * M + row;
                *y = epi == kEpiAccumulate ? *y + v[j][e] : v[j][e];
            }
        }
    }
}

/* The decode GEMM with the weights staged through shared memory (the
 * default for bf16 products of up to 64 rows): Y[T][M] (epi) X[T][N]
 * W[M][N]^T. A CTA owns RB = 8 or 16 consecutive weight rows, one
 * contiguous slab of RB*N bf16, which thread 0 requests as RB bulk copies
 * BEFORE waiting for the previous kernel: the slab streams in while that
 * kernel finishes (programmatic dependent launch), and a CTA has all its
 * bytes in flight at once (skinny_gemm_kernel keeps 4 k-blocks per warp
 * in flight, so its small products are latency-bound: 0.6B's 4-12 MB
 * matrices at about 1 TB/s on the H100). Rows sit 64 bytes apart beyond
 * their length so that the 8 lanes of a quarter-warp (two rows, 4 x 16
 * bytes each) hit distinct banks. The tokens are the MMA's rows
 * (m16n8k16: A = 16 tokens x 16 k of X, B = 16 k x 8 weight rows), with
 * the k order inside a 32-block permuted identically for both operands as
 * in skinny_gemm_kernel; warp w takes k-blocks w, w + 8, ...; the warps'
 * partials are added in warp order through shared memory (deterministic).
 * SwiGLU (RB 16): rows 0-7 of a tile are gates i0..i0+7, rows 8-15 their
 * ups (the engine's tiled gate/up layout). */
template <int MT, int RB, bool NORM>
__global__ void __launch_bounds__(256) slab_gemm_kernel(const __nv_bfloat16 *__restrict__ W,
                                                        const __nv_bfloat16 *__restrict__ X,
                                                        void *__restrict__ Yv, int T, int M, int N,
                                                        int epi_arg, const float *__restrict__ xf,
                                                        const float *__restrict__ nw, float eps,
                                                        sfi_gpu_rownorm rn) {
    const int epi = epi_arg & ~kEpiTriggerWait;
    constexpr int NB = RB / 8;          /* n-tiles of 8 weight rows */
    constexpr int NV = MT * NB * 4;     /* accumulators per lane */
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ uint64_t bar, ss_bar;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int r0 = blockIdx.x * RB, nrows = min(RB, M - r0);
    const int ldw = 2 * N + 64; /* bytes per staged row */
    /* the deferred norm's partial sums [T][N / 8], past the slab and the
     * partials' buffer (slab_smem's layout) */
    float *s_ss = reinterpret_cast<float *>(
        smem + ((max((size_t)RB * ldw, (size_t)8 * 32 * (NV + 1) * 4) + 15) / 16 * 16));
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        mbar_expect_tx(&bar, (unsigned)(nrows * 2 * N));
        for (int r = 0; r < nrows; r++)
            bulk_g2s(smem + (size_t)r * ldw, W + (size_t)(r0 + r) * N, (unsigned)(2 * N), &bar);
    }
    pdl_wait();
    if (epi_arg & kEpiTriggerWait) pdl_launch();
    /* NORM: X is RMSNorm(xf) * nw, made here from the f32 residual (every
     * CTA reads all T x N of it anyway) instead of by a launch before:
     * rmsnorm_kernel's formula, w * (x * r) */
    __shared__ float s_inv[64];
    if constexpr (NORM) {
        for (int t = warp; t < T; t += 8) {
            const float4 *xr = reinterpret_cast<const float4 *>(xf + (size_t)t * N);
            float a = 0.f;
            for (int i = lane; i < N / 4; i += 32) {
                const float4 v = xr[i];
                a += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
            for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
            if (lane == 0) s_inv[t] = rsqrtf(a / (float)N + eps);
        }
    }
    if (rn.ss_in && threadIdx.x == 0) {
        /* the deferred norm's sums, in flight during the products (used
         * by the epilogue) */
        mbar_init(&ss_bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        mbar_expect_tx(&ss_bar, (unsigned)(T * (N / 8) * 4));
        bulk_g2s(s_ss, rn.ss_in, (unsigned)(T * (N / 8) * 4), &ss_bar);
    }
    __syncthreads(); /* the barrier's initialisation (and s_inv), for every thread */
    float c[MT][NB][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nb = 0; nb < NB; nb++) c[mt][nb][0] = c[mt][nb][1] = c[mt][nb][2] = c[mt][nb][3] = 0.f;
    const __nv_bfloat16 *xa[MT], *xb[MT];
    int ta[MT], tb[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        ta[mt] = min(16 * mt + g, T - 1);
        tb[mt] = min(16 * mt + g + 8, T - 1);
        xa[mt] = X + (size_t)ta[mt] * N + 8 * t4;
        xb[mt] = X + (size_t)tb[mt] * N + 8 * t4;
    }
    /* 8 consecutive k of token t, normalised, as 4 bf16 pairs */
    auto xnorm = [&](int t, int k0) {
        const float4 *xr = reinterpret_cast<const float4 *>(xf + (size_t)t * N + k0);
        const float4 *wr = reinterpret_cast<const float4 *>(nw + k0);
        const float4 x0 = xr[0], x1 = xr[1], w0 = __ldg(wr), w1 = __ldg(wr + 1);
        const float r = s_inv[t];
        auto pk = [](float lo, float hi) {
            const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
            return *reinterpret_cast<const uint32_t *>(&v);
        };
        uint4 o;
        o.x = pk(__fmul_rn(w0.x, __fmul_rn(x0.x, r)), __fmul_rn(w0.y, __fmul_rn(x0.y, r)));
        o.y = pk(__fmul_rn(w0.z, __fmul_rn(x0.z, r)), __fmul_rn(w0.w, __fmul_rn(x0.w, r)));
        o.z = pk(__fmul_rn(w1.x, __fmul_rn(x1.x, r)), __fmul_rn(w1.y, __fmul_rn(x1.y, r)));
        o.w = pk(__fmul_rn(w1.z, __fmul_rn(x1.z, r)), __fmul_rn(w1.w, __fmul_rn(x1.w, r)));
        return o;
    };
    (void)xnorm;
    const int nkb = N / 32;
    auto mma_kb = [&](int kb, const uint4 *a, const uint4 *b) {
        uint4 w[NB];
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
            w[nb] = *reinterpret_cast<const uint4 *>(smem + (size_t)(nb * 8 + g) * ldw + kb * 64 + t4 * 16);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nb = 0; nb < NB; nb++) {
                mma_bf16_g(c[mt][nb], a[mt].x, b[mt].x, a[mt].y, b[mt].y, w[nb].x, w[nb].y);
                mma_bf16_g(c[mt][nb], a[mt].z, b[mt].z, a[mt].w, b[mt].w, w[nb].z, w[nb].w);
            }
    };
    /* 16 tokens or fewer: X's k-blocks U at a time, all requested before
     * the first MMA. Loaded one k-block at a time, a warp waited an L2
     * round trip per k-block (the compiler issued each pair after the
     * previous MMA), 4-12 of them in a row for the 0.6B shape's products.
     * RB 16 (products with rows for several CTAs an SM) takes 4, few
     * enough registers for three CTAs an SM. More tokens keep the loop
     * below (their registers would cost CTAs an SM). */
    constexpr int U = (MT == 1 && !NORM) ? (RB == 16 ? 4 : 8) : 0;
    if constexpr (U > 0) {
        for (int kb0 = warp; kb0 < nkb; kb0 += 8 * U) {
            uint4 xa_u[U], xb_u[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (kb0 + 8 * u < nkb) {
                    xa_u[u] = __ldg(reinterpret_cast<const uint4 *>(xa[0] + (kb0 + 8 * u) * 32));
                    xb_u[u] = __ldg(reinterpret_cast<const uint4 *>(xb[0] + (kb0 + 8 * u) * 32));
                }
            if (kb0 == warp) mbar_wait(&bar, 0); /* warp 0 always: before the __syncthreads below */
#pragma unroll
            for (int u = 0; u < U; u++)
                if (kb0 + 8 * u < nkb) mma_kb(kb0 + 8 * u, &xa_u[u], &xb_u[u]);
        }
    } else {
        mbar_wait(&bar, 0);
        for (int kb = warp; kb < nkb; kb += 8) {
            uint4 a[MT], b[MT];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if constexpr (NORM) {
                    a[mt] = xnorm(ta[mt], kb * 32 + 8 * t4);
                    b[mt] = xnorm(tb[mt], kb * 32 + 8 * t4);
                } else {
                    a[mt] = __ldg(reinterpret_cast<const uint4 *>(xa[mt] + kb * 32));
                    b[mt] = __ldg(reinterpret_cast<const uint4 *>(xb[mt] + kb * 32));
                }
            }
            mma_kb(kb, a, b);
        }
    }
    if (!(epi_arg & kEpiTriggerWait)) pdl_launch();
    /* the slab's buffer becomes the warps' partials: [8][32][NV + 1] */
    __syncthreads();
    float *red = reinterpret_cast<float *>(smem);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[(warp * 32 + lane) * (NV + 1) + (mt * NB + nb) * 4 + e] = c[mt][nb][e];
    __syncthreads();
    auto sum = [&](int ln, int v) {
        float a = 0.f;
#pragma unroll
        for (int w8 = 0; w8 < 8; w8++) a += red[(w8 * 32 + ln) * (NV + 1) + v];
        return a;
    };
    if (rn.ss_in) {
        /* each token's scale: a lane's share of the partials in order,
         * then a fixed tree (the same bits in every CTA) */
        mbar_wait(&ss_bar, 0);
        for (int t = warp; t < T; t += 8) {
            float a = 0.f;
            for (int p = lane; p < N / 8; p += 32) a += s_ss[t * (N / 8) + p];
            for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
            if (lane == 0) s_inv[t] = rsqrtf(a / (float)N + rn.eps);
        }
        __syncthreads();
    }
    if (epi == kEpiSwiGLU) {
        /* entries of n-tile 0 (gates); the up is the same entry of n-tile 1 */
        for (int i = threadIdx.x; i < 32 * MT * 4; i += 256) {
            const int ln = i % 32, mt = (i / 32) / 4, e = (i / 32) % 4;
            const int tok = 16 * mt + (ln >> 2) + (e >= 2 ? 8 : 0), col = 2 * (ln & 3) + (e & 1);
            if (tok >= T || col >= nrows) continue;
            const float sc = rn.ss_in ? s_inv[tok] : 1.0f;
            const float gt = sum(ln, (mt * NB + 0) * 4 + e) * sc,
                        up = sum(ln, (mt * NB + NB - 1) * 4 + e) * sc;
            const float a = gt / (1.0f + __expf(-gt)) * up;
            ((__nv_bfloat16 *)Yv)[(size_t)tok * (M / 2) + r0 / 2 + col] = __float2bfloat16_rn(a);
        }
        return;
    }
    float *Y = (float *)Yv;
    __shared__ float s_new[64][RB]; /* ss_out: the updated rows */
    for (int i = threadIdx.x; i < 32 * NV; i += 256) {
        const int ln = i % 32, v = i / 32, mt = v / (NB * 4), nb = (v / 4) % NB, e = v % 4;
        const int tok = 16 * mt + (ln >> 2) + (e >= 2 ? 8 : 0), row = nb * 8 + 2 * (ln & 3) + (e & 1);
        if (tok >= T || row >= nrows) continue;
        float *y = Y + (size_t)tok * M + r0 + row;
        const float a = rn.ss_in ? sum(ln, v) * s_inv[tok] : sum(ln, v);
        const float o = epi == kEpiAccumulate ? *y + a : a;
        *y = o;
        if (rn.ss_out) {
            s_new[tok][row] = o;
            ((__nv_bfloat16 *)rn.xb_out)[(size_t)tok * M + r0 + row] = __float2bfloat16_rn(o);
        }
    }
    if (rn.ss_out) {
        /* sums of squares of each 8 updated columns, in column order */
        __syncthreads();
        for (int i = threadIdx.x; i < T * NB; i += 256) {
            const int tok = i / NB, g = i % NB;
            float a = 0.f;
            for (int j = 0; j < 8 && g * 8 + j < nrows; j++) a += s_new[tok][g * 8 + j] * s_new[tok][g * 8 + j];
            rn.ss_out[(size_t)tok * (M / 8) + r0 / 8 + g] = a;
        }
    }
}

/* ---- q/k norm, RoPE, KV append ---- */

/* Block per (token, head slot): slots 0..nh-1 are q heads, then nkv k
 * heads, then nkv v heads. Block of max(32, D) threads, thread i owns
 * element i. Exact: the sums in thread 0 in ascending order; RoPE in the
 * rotate-half form with the reference's operation order. */
template <bool EXACT>
__global__ void qkv_post_kernel(sfi_gpu_qkv_args a) {
    pdl_wait();
    pdl_launch();
    __shared__ float v[512];
    __shared__ float sh[34];
    const int t = blockIdx.x, slot = blockIdx.y, D = a.head_dim, i = threadIdx.x;
    const int nh = a.n_heads, nkv = a.n_kv;
    const int pos = a.pos_arr ? a.pos_arr[t] : a.pos0 + t;
    const int row = a.row_arr ? a.row_arr[t] : a.row0 >= 0 ? a.row0 : t;
    if (pos < 0) return;
    const int width = (nh + 2 * nkv) * D;
    const float *src = a.qkv + (size_t)t * width + (size_t)slot * D;
    const float *bias = nullptr;
    if (slot < nh) bias = a.bq ? a.bq + (size_t)slot * D : nullptr;
    else if (slot < nh + nkv) bias = a.bk ? a.bk + (size_t)(slot - nh) * D : nullptr;
    else bias = a.bv ? a.bv + (size_t)(slot - nh - nkv) * D : nullptr;
    if (i < D) v[i] = bias ? __fadd_rn(src[i], bias[i]) : src[i];
    __syncthreads();
    const int kind = slot < nh ? 0 : slot < nh + nkv ? 1 : 2;
    const int kvh = kind == 1 ? slot - nh : kind == 2 ? slot - nh - nkv : 0;
    const int blk = kind ? a.block_table[(size_t)row * a.max_blocks + pos / a.page] : 0;
    const size_t dst = kind ? (((size_t)blk * nkv + kvh) * a.page + pos % a.page) * D : 0;
    if (kind == 2) { /* v: stored as it is */
        if (i < D) st_elem(a.v_pool, dst + i, a.dtype, v[i]);
        return;
    }
    /* RMSNorm over the head */
    const float *nw = kind == 0 ? a.q_norm : a.k_norm;
    float r;
    if (EXACT) {
        if (i == 0) {
            float ss = 0.f;
            for (int j = 0; j < D; j++) ss = __fadd_rn(ss, __fmul_rn(v[j], v[j]));
            sh[33] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)D), a.eps)));
        }
        __syncthreads();
        r = sh[33];
    } else {
        r = block_sum(i < D ? v[i] * v[i] : 0.f, sh);
        r = rsqrtf(r / (float)D + a.eps);
    }
    float y = 0.f;
    if (i < D) y = __fmul_rn(nw[i], __fmul_rn(v[i], r));
    __syncthreads();
    if (i < D) v[i] = y;
    __syncthreads();
    /* RoPE: x[i] = a*cos - b*sin, x[i+h] = b*cos + a*sin */
    const int h2 = D / 2;
    float o = 0.f;
    if (i < D) {
        const int k = i < h2 ? i : i - h2;
        const float c = a.cs[(size_t)pos * h2 + k], s = a.sn[(size_t)pos * h2 + k];
        const float x0 = v[k], x1 = v[k + h2];
        o = i < h2 ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s))
                   : __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
    if (kind == 0) {
        if (i < D) a.q_out[((size_t)t * nh + slot) * D + i] = o;
        return;
    }
    /* k: store, then ||k|| of the stored values */
    float stored = o;
    if (i < D) {
        st_elem(a.k_pool, dst + i, a.dtype, o);
        if (a.dtype == SFI_GPU_BF16) stored = __bfloat162float(__float2bfloat16_rn(o));
    }
    if (!a.key_norms) return;
    __syncthreads();
    if (i < D) v[i] = stored;
    __syncthreads();
    float nrm;
    if (EXACT) {
        if (i == 0) {
            float ss = 0.f;
            for (int j = 0; j < D; j++) ss = __fadd_rn(ss, __fmul_rn(v[j], v[j]));
            sh[33] = __fsqrt_rn(ss);
        }
        __syncthreads();
        nrm = sh[33];
    } else {
        nrm = sqrtf(block_sum(i < D ? v[i] * v[i] : 0.f, sh));
    }
    if (i == 0) a.key_norms[((size_t)row * nkv + kvh) * a.ld_norms + pos] = nrm;
}

/* qkv_post_kernel<false> with a warp per (token, head slot) and no
 * shared memory or block barriers: lane l holds elements l + 32 j (j <
 * D / 32), so both halves of every RoPE pair (k, k + D / 2) sit in the
 * same lane and each norm is one butterfly. The same formulas as the
 * block kernel's fast form; its sums go in another order. Launch: grid
 * (T, ceil(slots / 4)), block 128; D a multiple of 64 up to 256. */
template <int J>
__global__ void __launch_bounds__(128) qkv_post_warp_kernel(sfi_gpu_qkv_args a) {
    pdl_wait();
    pdl_launch();
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    const int slot = blockIdx.y * 4 + (threadIdx.x >> 5);
    const int nh = a.n_heads, nkv = a.n_kv, D = a.head_dim;
    if (slot >= nh + 2 * nkv) return;
    const int pos = a.pos_arr ? a.pos_arr[t] : a.pos0 + t;
    const int row = a.row_arr ? a.row_arr[t] : a.row0 >= 0 ? a.row0 : t;
    if (pos < 0) return;
    const int width = (nh + 2 * nkv) * D;
    const float *src = a.qkv + (size_t)t * width + (size_t)slot * D;
    const int kind = slot < nh ? 0 : slot < nh + nkv ? 1 : 2;
    const int hs = kind == 0 ? slot : kind == 1 ? slot - nh : slot - nh - nkv;
    const float *bias = kind == 0 ? a.bq : kind == 1 ? a.bk : a.bv;
    float v[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = lane + 32 * j;
        v[j] = bias ? __fadd_rn(src[i], bias[(size_t)hs * D + i]) : src[i];
    }
    size_t dst = 0;
    if (kind) {
        const int blk = a.block_table[(size_t)row * a.max_blocks + pos / a.page];
        dst = (((size_t)blk * nkv + hs) * a.page + pos % a.page) * D;
    }
    if (kind == 2) {
#pragma unroll
        for (int j = 0; j < J; j++) st_elem(a.v_pool, dst + lane + 32 * j, a.dtype, v[j]);
        return;
    }
    float o[J];
    sfi_dev_warp_norm_rope<J>(v, kind == 0 ? a.q_norm : a.k_norm, a.eps,
                              a.cs + (size_t)pos * (D / 2), a.sn + (size_t)pos * (D / 2), o);
    if (kind == 0) {
#pragma unroll
        for (int j = 0; j < J; j++) a.q_out[((size_t)t * nh + slot) * D + lane + 32 * j] = o[j];
        return;
    }
    float kn = 0.f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        st_elem(a.k_pool, dst + lane + 32 * j, a.dtype, o[j]);
        const float stored =
            a.dtype == SFI_GPU_BF16 ? __bfloat162float(__float2bfloat16_rn(o[j])) : o[j];
        kn += stored * stored;
    }
    if (!a.key_norms) return;
    for (int off = 16; off > 0; off >>= 1) kn += __shfl_xor_sync(0xffffffffu, kn, off);
    if (lane == 0) a.key_norms[((size_t)row * nkv + hs) * a.ld_norms + pos] = sqrtf(kn);
}

/* ---- Qwen3-MoE ---- */

/* Thread per token: sfi_softmax's order (max, exp(x - max), ascending
 * sum, divide), top-k by repeated selection (strict >: ties to the
 * smaller expert), normalisation in selection order, then the experts
 * sorted ascending (the order their outputs are summed in). */
template <bool EXACT>
__global__ void moe_route_kernel(float *__restrict__ rl, int T, int E, int top, int norm,
                                 int32_t *__restrict__ sel_e, float *__restrict__ sel_w) {
    pdl_wait();
    pdl_launch();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    float *x = rl + (size_t)t * E, *p = x; /* in place, as sfi_softmax */
    float m = x[0];
    for (int e = 1; e < E; e++) m = x[e] > m ? x[e] : m;
    float s = 0.f;
    for (int e = 0; e < E; e++) {
        p[e] = EXACT ? sfi_dev_expf(__fsub_rn(x[e], m)) : __expf(x[e] - m);
        s = __fadd_rn(s, p[e]);
    }
    for (int e = 0; e < E; e++) p[e] = __fdiv_rn(p[e], s);
    int sel[64];
    float w[64];
    for (int k = 0; k < top; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[k] = best;
        w[k] = p[best];
    }
    if (norm) {
        float z = 0.f;
        for (int k = 0; k < top; k++) z = __fadd_rn(z, w[k]);
        for (int k = 0; k < top; k++) w[k] = __fdiv_rn(w[k], z);
    }
    /* ascending expert order (insertion sort of top <= 64 entries) */
    for (int k = 1; k < top; k++) {
        const int e = sel[k];
        const float we = w[k];
        int j = k - 1;
        while (j >= 0 && sel[j] > e) { sel[j + 1] = sel[j]; w[j + 1] = w[j]; j--; }
        sel[j + 1] = e;
        w[j + 1] = we;
    }
    for (int k = 0; k < top; k++) {
        sel_e[(size_t)t * top + k] = sel[k];
        sel_w[(size_t)t * top + k] = w[k];
    }
}

/* Exact: thread per (row, pair), sequential dot. */
__global__ void moe_gemv_exact_kernel(const float *const *__restrict__ w, const int32_t *__restrict__ sel_e,
                                      int top, const float *__restrict__ x, int x_per_pair, int M, int N,
                                      float *__restrict__ y) {
    pdl_wait();
    pdl_launch();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;
    if (i >= M) return;
    const float *W = w[sel_e[p]] + (size_t)i * N;
    const float *xr = x + (size_t)(x_per_pair ? p : p / top) * N;
    float a = 0.f;
    for (int j = 0; j < N; j++) a = __fadd_rn(a, __fmul_rn(W[j], xr[j]));
    y[(size_t)p * M + i] = a;
}

/* Fast: a warp per output row, x of the pair staged in shared memory
 * (N <= 8192 floats), 16-byte weight loads. */
template <typename T>
__global__ void __launch_bounds__(256) moe_gemv_kernel(void *const *__restrict__ w, const int32_t *__restrict__ sel_e,
                                int top, const float *__restrict__ x, int x_per_pair, int M, int N,
                                float *__restrict__ y) {
    pdl_wait();
    pdl_launch();
    extern __shared__ float xs[];
    const int p = blockIdx.y;
    const float *xr = x + (size_t)(x_per_pair ? p : p / top) * N;
    for (int j = threadIdx.x; j < N; j += blockDim.x) xs[j] = xr[j];
    __syncthreads();
    const T *W = (const T *)w[sel_e[p]];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int VEC = 16 / sizeof(T);
    for (int i = blockIdx.x * 8 + warp; i < M; i += gridDim.x * 8) {
        const T *wr = W + (size_t)i * N;
        float a = 0.f;
        if (N % VEC == 0) {
            for (int j = lane * VEC; j < N; j += 32 * VEC) {
                const uint4 u = *reinterpret_cast<const uint4 *>(wr + j);
                const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
                for (int k = 0; k < VEC; k++) a += (float)e[k] * xs[j + k];
            }
        } else {
            for (int j = lane; j < N; j += 32) a += (float)wr[j] * xs[j];
        }
        for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (lane == 0) y[(size_t)p * M + i] = a;
    }
}

__global__ void moe_combine_kernel(float *__restrict__ h, const float *__restrict__ y,
                                   const float *__restrict__ sw, int top, int H) {
    pdl_wait();
    pdl_launch();
    const int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x) {
        float acc = 0.f;
        for (int k = 0; k < top; k++)
            acc = __fadd_rn(acc, __fmul_rn(y[((size_t)t * top + k) * H + i], sw[(size_t)t * top + k]));
        h[(size_t)t * H + i] = __fadd_rn(h[(size_t)t * H + i], acc);
    }
}

/* ---- grouped experts (prefill) ----
 * A counting sort of the T*top (token, expert) pairs by expert, so that
 * each expert's rows are contiguous and one GEMM per expert reads its
 * weights once (sfi_gpu_moe_grouped in sfi_gpu_moe.c runs the GEMMs). */

/* Block per expert e: offset = number of pairs with a smaller expert,
 * count = number with e (pass 1, a plain reduction); pass 2 walks the
 * pairs in order, 256 at a time, and gives each of e's pairs the next
 * position by a ballot prefix within the warp and the warps' totals
 * before it: positions in pair order, the same on every run (no atomics). */
__global__ void __launch_bounds__(256) moe_sort_kernel(const int32_t *__restrict__ sel_e, int pairs,
                                                       int32_t *__restrict__ cnt, int32_t *__restrict__ pos) {
    pdl_wait();
    pdl_launch();
    __shared__ int s_below[8], s_same[8], s_warp[8];
    const int e = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int below = 0, same = 0;
    for (int p = tid; p < pairs; p += 256) {
        const int x = sel_e[p];
        below += x < e;
        same += x == e;
    }
    for (int off = 16; off > 0; off >>= 1) {
        below += __shfl_xor_sync(0xffffffffu, below, off);
        same += __shfl_xor_sync(0xffffffffu, same, off);
    }
    if (lane == 0) {
        s_below[warp] = below;
        s_same[warp] = same;
    }
    __syncthreads();
    int base = 0, n = 0;
    for (int w = 0; w < 8; w++) {
        base += s_below[w];
        n += s_same[w];
    }
    if (tid == 0) cnt[e] = n;
    if (n == 0) return; /* uniform over the block */
    const unsigned lt = (1u << lane) - 1u;
    for (int c0 = 0; c0 < pairs; c0 += 256) {
        const int p = c0 + tid;
        const bool mine = p < pairs && sel_e[p] == e;
        const unsigned b = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) s_warp[warp] = __popc(b);
        __syncthreads();
        int before = 0, tot = 0;
        for (int w = 0; w < 8; w++) {
            before += w < warp ? s_warp[w] : 0;
            tot += s_warp[w];
        }
        if (mine) pos[p] = base + before + __popc(b & lt);
        base += tot;
        __syncthreads(); /* s_warp is rewritten by the next chunk */
    }
}

/* xs[pos[p]][i] = x[p / top][i] in the GEMM's input type. */
template <typename T>
__global__ void moe_gather_kernel(const float *__restrict__ x, int H, int top, int pairs,
                                  const int32_t *__restrict__ pos, T *__restrict__ xs) {
    pdl_wait();
    pdl_launch();
    for (int p = blockIdx.y; p < pairs; p += gridDim.y) {
        const float *src = x + (size_t)(p / top) * H;
        T *dst = xs + (size_t)pos[p] * H;
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x)
            dst[i] = (T)src[i];
    }
}

/* moe_combine_kernel with pair p's row at y[pos[p]] (the sorted order). */
__global__ void moe_combine_pos_kernel(float *__restrict__ h, const float *__restrict__ y,
                                       const int32_t *__restrict__ pos, const float *__restrict__ sw,
                                       int T, int top, int H) {
    pdl_wait();
    pdl_launch();
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x) {
            float acc = 0.f;
            for (int k = 0; k < top; k++) {
                const size_t p = (size_t)t * top + k;
                acc = __fadd_rn(acc, __fmul_rn(y[(size_t)pos[p] * H + i], sw[p]));
            }
            h[(size_t)t * H + i] = __fadd_rn(h[(size_t)t * H + i], acc);
        }
    }
}

/* ---- window logits (prefill Selector input) ---- */

/* Thread per position j, block row = (w, query head): the reference's
 * dot (ascending over D, one accumulator) times the scale. */
__global__ void window_logits_kernel(const float *__restrict__ qwin, int nw, int first, int n_ctx,
                                     int row, int nh, int nkv, int D, const int32_t *__restrict__ bt,
                                     int max_blocks, int page, const void *__restrict__ kp, int dtype,
                                     float *__restrict__ out, int ld) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int w = blockIdx.y, h = blockIdx.z;
    if (j >= n_ctx) return;
    const int G = nh / nkv, kvh = h / G, g = h % G;
    float *o = out + ((size_t)kvh * nw * G + (size_t)w * G + g) * ld;
    if (j > first + w) { o[j] = -INFINITY; return; }
    const float *q = qwin + ((size_t)w * nh + h) * D;
    const int blk = bt[(size_t)row * max_blocks + j / page];
    const size_t base = (((size_t)blk * nkv + kvh) * page + j % page) * D;
    float a = 0.f;
    for (int i = 0; i < D; i++) a = __fadd_rn(a, __fmul_rn(q[i], ld_elem(kp, base + i, dtype)));
    const float sc = __fdiv_rn(1.0f, __fsqrt_rn((float)D));
    o[j] = __fmul_rn(a, sc);
}

/* ---- random fill ---- */

__device__ __forceinline__ uint32_t hash32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}

__global__ void fill_kernel(void *p, size_t n, int dtype, uint32_t seed, float scale, float offset) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t h = hash32((uint32_t)i ^ hash32(seed ^ (uint32_t)(i >> 32) * 0x9e3779b9u));
        const float u = (float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        st_elem(p, i, dtype, offset + u * scale);
    }
}

/* ---- the plan ---- */

__device__ __forceinline__ bool is_trig(const sfi_gpu_plan_cfg &c, int32_t tok) {
    return c.is_trigger && tok >= 0 && tok < c.n_vocab && c.is_trigger[tok];
}

/* Why request b is slow at a step whose input is prev, dd steps after
 * its last slow one (kRNone: fast): sfi_trigger_next's rules. */
__device__ __forceinline__ int trig_reason(const sfi_gpu_plan_cfg &c, int32_t prev, int dd) {
    if (!c.sfi) return kRAlways;
    switch (c.policy) {
    case kTrigSfi:
        if (is_trig(c, prev)) return kRTrigger;
        if (c.T_max >= 1 && dd >= c.T_max) return kRTmax;
        return kRNone;
    case kTrigTmax: return c.T_max >= 1 && dd >= c.T_max ? kRTmax : kRNone;
    case kTrigBoundary: return is_trig(c, prev) ? kRTrigger : kRNone;
    case kTrigInterval: return c.interval >= 1 && dd >= c.interval ? kRInterval : kRNone;
    case kTrigAlways: return kRAlways;
    default: return kRNone;
    }
}

/* One thread per request (batch <= 64, one block). The rules of
 * sfi_trigger_next and sfi_state_candidates / sfi_state_fast_set. */
__global__ void plan_kernel(sfi_gpu_plan_cfg c, sfi_gpu_run_state *__restrict__ s,
                            sfi_gpu_step_desc *__restrict__ d, sfi_gpu_step_desc *__restrict__ dsel,
                            int32_t *__restrict__ hist) {
    pdl_wait();
    pdl_launch();
    const int b = threadIdx.x;
    const int step = s->step + 1;
    const int defer = c.sfi && c.refresh_delay >= 2;
    if (b < c.batch) {
        sfi_gpu_req rq = d->req[b];
        rq.j_begin = rq.j_end = 0;
        /* the deferred Selector's entry: idle unless set below */
        sfi_gpu_req rs = rq;
        rs.flags = SFI_GPU_REQ_IDLE;
        if (defer) {
            s->installed[b] = -1;
            if (s->active[b] && step < c.max_new && s->pend[b] > 0 &&
                step == s->pend[b] + c.refresh_delay) {
                /* the pending sets take effect (before this step's kind:
                 * a slow step now pends anew) */
                s->buf[b] ^= 1;
                s->kout[b] = s->kpend[b];
                s->installed[b] = s->pend[b];
                s->pend[b] = 0;
            }
        }
        if (!s->active[b] || step >= c.max_new) {
            s->active[b] = 0;
            s->pos[b] = -1;
            s->in_tok[b] = 0;
            rq.flags = SFI_GPU_REQ_IDLE;
        } else {
            const int32_t prev = c.force ? c.force[(size_t)b * c.max_new + step - 1] : s->tok[b];
            const int dd = s->since_slow[b] + 1;
            const int why = trig_reason(c, prev, dd);
            s->since_slow[b] = why == kRNone ? dd : 0;
            const int ctx = s->ctx[b] + 1;
            s->ctx[b] = ctx;
            s->pos[b] = ctx - 1;
            s->in_tok[b] = prev;
            rq.ctx_len = ctx;
            if (defer && why == kRNone && s->pend[b] == step - 1 && step > 1) {
                /* last step was slow: its Selector runs now, on its J and
                 * logits, into the inactive buffer */
                const int pc = ctx - 1;
                int jb = c.n_sink < pc ? c.n_sink : pc, je = pc - c.n_recent;
                if (je > pc) je = pc;
                if (je < jb) je = jb;
                rs.ctx_len = pc;
                rs.recent_begin = 0;
                rs.n_compact = 0;
                rs.j_begin = jb;
                rs.j_end = je;
                rs.flags = 0;
            }
            if (why != kRNone) {
                rq.flags = 0;
                rq.n_compact = 0;
                rq.recent_begin = 0;
                if (c.sfi) {
                    /* J = [n_sink, ctx - n_recent) clipped (sfi_state_candidates) */
                    int jb = c.n_sink < ctx ? c.n_sink : ctx, je = ctx - c.n_recent;
                    if (je > ctx) je = ctx;
                    if (je < jb) je = jb;
                    const int kk = je > jb ? min(c.K, je - jb) : 0;
                    if (defer) {
                        /* pending from this step on (dropping an older one);
                         * no Selector in this step */
                        s->pend[b] = step;
                        s->kpend[b] = kk;
                    } else {
                        rq.j_begin = jb;
                        rq.j_end = je;
                        s->kout[b] = kk;
                    }
                }
            } else {
                /* fast: sink [0, a) + selected + recent [max(a, ctx - n_recent),
                 * ctx); with no gap between sink and recent the rows are
                 * simply 0..ctx-1, in place */
                const int a = c.n_sink < ctx ? c.n_sink : ctx;
                rq.flags = SFI_GPU_REQ_SPARSE | (defer && s->buf[b] ? SFI_GPU_REQ_ALT : 0);
                if (ctx - c.n_recent > a) {
                    rq.n_compact = c.n_sink + s->kout[b];
                    rq.recent_begin = ctx - c.n_recent;
                } else {
                    rq.n_compact = 0;
                    rq.recent_begin = 0;
                }
            }
            hist[(size_t)step * c.batch + b] = (why == kRNone ? kFast : kSlow) | (why << 4);
        }
        d->req[b] = rq;
        if (defer) {
            /* the Selector writes the inactive buffer (every request, so
             * that the reorg's sink refresh of idle ones lands there too) */
            if (!s->buf[b]) rs.flags |= SFI_GPU_REQ_ALT;
            dsel->req[b] = rs;
        }
    }
    __syncthreads();
    if (b == 0) s->step = step;
}

__global__ void end_step_kernel(sfi_gpu_plan_cfg c, sfi_gpu_run_state *__restrict__ s,
                                const int32_t *__restrict__ next, int32_t *__restrict__ hist) {
    pdl_wait();
    pdl_launch();
    const int b = threadIdx.x;
    int slow = 0;
    if (b < c.batch && s->pos[b] >= 0) {
        const int32_t t = next[b];
        s->tok[b] = t;
        hist[(size_t)s->step * c.batch + b] = t;
        bool stop = c.stop_token >= 0 && t == c.stop_token;
        for (int i = 0; i < c.n_stop_more && i < 16; i++) stop = stop || t == c.stop_more[i];
        if ((stop && !c.force) || s->step + 1 >= c.max_new)
            s->active[b] = 0;
        if (c.sfi && c.refresh_delay >= 2) {
            slow = 1; /* the deferred Selector is not skipped */
        } else if (s->active[b]) {
            /* the plan kernel's decision for step + 1, made early; and
             * while the sink is not yet whole in the cache, the reorg's
             * sink refresh of fast requests must run too */
            const int32_t prev = c.force ? c.force[(size_t)b * c.max_new + s->step] : t;
            slow = trig_reason(c, prev, s->since_slow[b] + 1) != kRNone ||
                   s->ctx[b] + 1 <= c.n_sink;
        }
    }
    slow = __syncthreads_count(slow);
    if (b == 0) s->next_slow = slow;
}

__global__ void set_cond_kernel(cudaGraphConditionalHandle h, const sfi_gpu_run_state *__restrict__ s) {
    cudaGraphSetConditional(h, s->next_slow == 0 ? 1u : 0u);
}

/* Launches k, with the programmatic-dependent-launch attribute when
 * sfi_gpu_set_pdl(1) is in force (the engine's decode steps). */
template <typename... P, typename... A>
cudaError_t launch_k(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = sfi_gpu_pdl() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, (P)args...);
}

/* the slab kernel lets the next kernel launch after its wait (sfi_gpu_gemm_set_trigger) */
thread_local int g_slab_trigger = 0;

/* slab_gemm_kernel's launch: RB 16 where there are rows enough for two
 * CTAs per SM (and for SwiGLU, whose gate/up tiles are 16 rows), else 8,
 * so that a 1024-row product still spreads over the SMs. Returns 0 when
 * it does not apply (shared memory too small for the slab): the caller
 * falls back. xf != NULL: the fused RMSNorm form. */
template <int MT, int RB, bool NORM>
cudaError_t launch_slab_k(const __nv_bfloat16 *w, const __nv_bfloat16 *x, void *Y, int T, int M,
                          int N, int epi, const float *xf, const float *nw, float eps,
                          const sfi_gpu_rownorm &rn, size_t smem, cudaStream_t st) {
    /* the opt-in size already set for this kernel, per host thread: each
     * GPU of sfi-gpu run --tp has its own thread, and the attribute is per device */
    static thread_local size_t granted;
    if (smem > 48 * 1024 && smem > granted) {
        cudaError_t e = cudaFuncSetAttribute(slab_gemm_kernel<MT, RB, NORM>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        granted = smem;
    }
    return launch_k(slab_gemm_kernel<MT, RB, NORM>, dim3((M + RB - 1) / RB), dim3(256), smem, st,
                    w, x, Y, T, M, N, g_slab_trigger ? epi | kEpiTriggerWait : epi, xf, nw, eps, rn);
}

/* rn: the deferred norm (NULL: none); err NULL: only whether it applies */
template <int MT>
int launch_slab(const __nv_bfloat16 *w, const __nv_bfloat16 *x, void *Y, int T, int M, int N,
                int epi, const float *xf, const float *nw, float eps, const sfi_gpu_rownorm *rn,
                cudaStream_t st, cudaError_t *err) {
    const int rb = (epi == kEpiSwiGLU || M / 16 >= 256) ? 16 : 8;
    const int nv = MT * (rb / 8) * 4;
    size_t smem = (size_t)rb * (2 * N + 64);
    const size_t red = (size_t)8 * 32 * (nv + 1) * 4;
    if (smem < red) smem = red;
    if (rn && rn->ss_in) smem = (smem + 15) / 16 * 16 + (size_t)T * (N / 8) * 4;
    if (smem > 220 * 1024) return 0;
    if (!err) return 1;
    const sfi_gpu_rownorm r = rn ? *rn : sfi_gpu_rownorm{};
    if (rb == 16)
        *err = xf ? launch_slab_k<MT, 16, true>(w, x, Y, T, M, N, epi, xf, nw, eps, r, smem, st)
                  : launch_slab_k<MT, 16, false>(w, x, Y, T, M, N, epi, xf, nw, eps, r, smem, st);
    else
        *err = xf ? launch_slab_k<MT, 8, true>(w, x, Y, T, M, N, epi, xf, nw, eps, r, smem, st)
                  : launch_slab_k<MT, 8, false>(w, x, Y, T, M, N, epi, xf, nw, eps, r, smem, st);
    return 1;
}

thread_local int g_gemm_kernel = SFI_GPU_GEMM_SLAB;
/* MiB of weights up to which the slab kernel runs; -1: the measured rule */
thread_local int g_slab_max_mb = -1;

/* The slab kernel for T x M x N when it applies (selection, size); 0 if not. */
int try_slab(const void *W, const void *X, void *Y, int T, int M, int N, int epi, const float *xf,
             const float *nw, float eps, cudaStream_t st, cudaError_t *err,
             const sfi_gpu_rownorm *rn = nullptr) {
    /* where it measured faster (H100, batch 16 fast steps): the Qwen3-0.6B
     * shape's four products (2.91 against 3.00 ms a step with the register
     * kernel); not Qwen3-1.7B's 2048 x 2048 O projection (4.10 against
     * 3.92 ms) nor the 4B shape's 20-100 MB products (8.62 against 6.86
     * ms). Hence: small products with a side of at most 1024. */
    if (g_gemm_kernel != SFI_GPU_GEMM_SLAB)
        return 0;
    if (g_slab_max_mb < 0 ? ((double)M * N * 2 > 13 * 1048576.0 || (M > 1024 && N > 1024))
                          : (double)M * N * 2 > g_slab_max_mb * 1048576.0)
        return 0;
    const __nv_bfloat16 *w = (const __nv_bfloat16 *)W, *x = (const __nv_bfloat16 *)X;
    return T <= 16   ? launch_slab<1>(w, x, Y, T, M, N, epi, xf, nw, eps, rn, st, err)
           : T <= 32 ? launch_slab<2>(w, x, Y, T, M, N, epi, xf, nw, eps, rn, st, err)
                     : launch_slab<4>(w, x, Y, T, M, N, epi, xf, nw, eps, rn, st, err);
}

} // namespace

#include "sfi_gpu_prefill.cuh"

extern "C" {

cudaError_t sfi_gpu_embed(const int32_t *tok, int T, const void *E, int dtype, int H, float *x,
                          cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    launch_k(embed_kernel, dim3(T), dim3(256), 0, st, tok, E, dtype, H, x, (float *)NULL,
             (__nv_bfloat16 *)NULL);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_embed_rownorm(const int32_t *tok, int T, const void *E, int dtype, int H,
                                  float *x, float *ss, void *xb, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (H % 8 || T > 64) return cudaErrorInvalidValue;
    launch_k(embed_kernel, dim3(T), dim3(256), 0, st, tok, E, dtype, H, x, ss, (__nv_bfloat16 *)xb);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_rmsnorm(const float *x, const float *w, int T, int n, float eps, float *yf, void *yb,
                            int exact, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (exact)
        launch_k(rmsnorm_kernel<true>, dim3(T), dim3(256), 0, st, x, w, n, eps, yf, (__nv_bfloat16 *)yb);
    else
        launch_k(rmsnorm_kernel<false>, dim3(T), dim3(256), 0, st, x, w, n, eps, yf, (__nv_bfloat16 *)yb);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_gemv_exact(const float *W, const float *X, const float *b, float *Y, int T, int M,
                               int N, int accumulate, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    launch_k(gemv_exact_kernel, dim3((M + 127) / 128, T), dim3(128), 0, st, W, X, b, Y, M, N, accumulate);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_add_bias(float *y, const float *b, int T, int M, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    launch_k(add_bias_kernel, dim3((M + 255) / 256, T), dim3(256), 0, st, y, b, M);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_qkv_post(const sfi_gpu_qkv_args *a, int exact, cudaStream_t st) {
    if (a->T <= 0) return cudaSuccess;
    if (a->head_dim > 512 || a->head_dim % 2) return cudaErrorInvalidValue;
    const int threads = a->head_dim < 32 ? 32 : (a->head_dim + 31) / 32 * 32;
    dim3 g(a->T, a->n_heads + 2 * a->n_kv);
    /* a warp per head (fewer barriers; the default outside --exact),
     * SFI_GPU_QKV_WARP=0 the block kernel (experiments) */
    static thread_local int warp_form = -1;
    if (warp_form < 0) {
        const char *env = getenv("SFI_GPU_QKV_WARP");
        warp_form = !(env && !strcmp(env, "0"));
    }
    const int slots = a->n_heads + 2 * a->n_kv;
    if (!exact && warp_form && (a->head_dim == 64 || a->head_dim == 128 || a->head_dim == 256)) {
        dim3 gw(a->T, (slots + 3) / 4);
        if (a->head_dim == 64)
            launch_k(qkv_post_warp_kernel<2>, gw, dim3(128), 0, st, *a);
        else if (a->head_dim == 128)
            launch_k(qkv_post_warp_kernel<4>, gw, dim3(128), 0, st, *a);
        else
            launch_k(qkv_post_warp_kernel<8>, gw, dim3(128), 0, st, *a);
        return cudaGetLastError();
    }
    if (exact)
        launch_k(qkv_post_kernel<true>, dim3(g), dim3(threads), 0, st, *a);
    else
        launch_k(qkv_post_kernel<false>, dim3(g), dim3(threads), 0, st, *a);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_silu_mul(const float *gu, int T, int I, int tiled, void *act, int adtype, int exact,
                             cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    dim3 g((I + 255) / 256 < 1024 ? (I + 255) / 256 : 1024, T);
    if (exact)
        launch_k(silu_mul_kernel<true>, g, dim3(256), 0, st, gu, I, tiled, adtype, act);
    else
        launch_k(silu_mul_kernel<false>, g, dim3(256), 0, st, gu, I, tiled, adtype, act);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_to_bf16(const float *x, size_t n, void *y, cudaStream_t st) {
    if (!n) return cudaSuccess;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    launch_k(to_bf16_kernel, dim3((unsigned)blocks), dim3(256), 0, st, x, n, (__nv_bfloat16 *)y);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_argmax(const float *logits, int T, int V, const int32_t *active, int32_t *out,
                           unsigned long long *slots, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (T > 1024) return cudaErrorInvalidValue;
    int bx = (V + 4095) / 4096;
    if (bx > 64) bx = 64;
    launch_k(argmax_kernel, dim3(bx, T), dim3(256), 0, st, logits, V, active, slots);
    launch_k(argmax_decode_kernel, dim3(1), dim3(((T + 31) / 32) * 32), 0, st, slots, T, active, out);
    return cudaGetLastError();
}


void sfi_gpu_gemm_set_trigger(int after_wait) { g_slab_trigger = after_wait != 0; }

void sfi_gpu_gemm_select(int kernel, int slab_max_mb) {
    g_gemm_kernel = kernel == SFI_GPU_GEMM_REGS ? SFI_GPU_GEMM_REGS : SFI_GPU_GEMM_SLAB;
    g_slab_max_mb = slab_max_mb < 0 ? -1 : slab_max_mb;
}


cudaError_t sfi_gpu_gemm_norm(const void *W, const float *x, const float *norm_w, float eps, void *Y, int T,
                      int M, int N, int epi, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (T > 64 || N % 32 || (epi == kEpiSwiGLU && M % 16)) return cudaErrorInvalidValue;
    /* every CTA reads the T x N residual to make the norm: measured a gain
     * at batch 1 (0.6B fast steps 1.25 against 1.29 ms) and a loss at 16
     * (2.96 against 2.91 ms), so only while that read is small (the
     * measured rule; an explicit sfi_gpu_gemm_select limit lifts it) */
    if (g_slab_max_mb < 0 && (long)T * N > 4096) return cudaErrorNotSupported;
    cudaError_t e = cudaSuccess;
    if (!try_slab(W, NULL, Y, T, M, N, epi, x, norm_w, eps, st, &e)) return cudaErrorNotSupported;
    return e;
}

int sfi_gpu_gemm_rownorm_applies(int T, int M, int N, int epi, int consumer) {
    if (T <= 0 || T > 64 || N % 32 || M % 8 || (epi == kEpiSwiGLU && M % 16)) return 0;
    /* a consumer's shared memory also holds the partial sums (launch_slab
     * only looks at whether ss_in is set here) */
    static const float dummy = 0.f; /* only tested for NULL */
    sfi_gpu_rownorm r = {};
    r.ss_in = consumer ? &dummy : nullptr;
    return try_slab(nullptr, nullptr, nullptr, T, M, N, epi, NULL, NULL, 0.f, 0, nullptr, &r);
}

cudaError_t sfi_gpu_gemm_rownorm(const void *W, const void *X, void *Y, int T, int M, int N, int epi,
                                 const sfi_gpu_rownorm *rn, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (!sfi_gpu_gemm_rownorm_applies(T, M, N, epi, rn->ss_in != NULL) ||
        (rn->ss_out && epi != kEpiAccumulate))
        return cudaErrorNotSupported;
    cudaError_t e = cudaSuccess;
    if (!try_slab(W, X, Y, T, M, N, epi, NULL, NULL, 0.f, st, &e, rn)) return cudaErrorNotSupported;
    return e;
}

cudaError_t sfi_gpu_scale_cols(void *W, int M, int N, const float *w, cudaStream_t st) {
    const size_t n = (size_t)M * N;
    if (!n) return cudaSuccess;
    size_t blocks = (n + 255) / 256;
    if (blocks > 8192) blocks = 8192;
    scale_cols_kernel<<<(unsigned)blocks, 256, 0, st>>>((__nv_bfloat16 *)W, M, N, w);
    return cudaGetLastError();
}

/* per host thread: each GPU of `sfi-gpu run --tp` has its own thread and
 * its own scratch */
static thread_local float *g_gemm_part;
static thread_local int *g_gemm_counters;
static thread_local size_t g_gemm_part_floats;
static thread_local int g_gemm_max_tiles;

void sfi_gpu_gemm_set_ws(float *part, size_t part_floats, int *counters, int max_tiles) {
    g_gemm_part = part;
    g_gemm_part_floats = part_floats;
    g_gemm_counters = counters;
    g_gemm_max_tiles = max_tiles;
}

cudaError_t sfi_gpu_gemm_skinny(const void *W, const void *X, void *Y, int T, int M, int N, int epi,
                                cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (T > 64 || N % 32 || (epi == kEpiSwiGLU && M % 16)) return cudaErrorInvalidValue;
    {
        cudaError_t e = cudaSuccess;
        if (try_slab(W, X, Y, T, M, N, epi, NULL, NULL, 0.f, st, &e)) return e;
    }
    const int tiles = (M + 15) / 16, nkb = N / 32;
    /* Split-K over gridDim.y (partials + the last CTA of a row tile
     * adding them in order) is supported by the kernel, but measured on
     * the H100 it made the 0.6B and 4B decode steps slower (the extra
     * partial traffic and fences cost more than the idle SMs of the
     * 64-160-tile products), so every product runs unsplit unless
     * SFI_GPU_SPLITK=1 asks for the split (experiments). */
    int ks = 1;
    static int split = -1;
    if (split < 0) {
        const char *v = getenv("SFI_GPU_SPLITK");
        split = v && *v == '1';
    }
    while (split && tiles * ks < 264 && nkb / (ks * 2) >= 8 && ks < 8) ks *= 2;
    if (ks > 1 && (!g_gemm_part || tiles > g_gemm_max_tiles ||
                   (size_t)ks * 64 * M > g_gemm_part_floats))
        ks = 1;
    dim3 g(tiles, ks);
    const __nv_bfloat16 *w = (const __nv_bfloat16 *)W, *x = (const __nv_bfloat16 *)X;
    float *p = g_gemm_part;
    int *c = g_gemm_counters;
    if (T <= 8) return launch_k(skinny_gemm_kernel<1>, g, dim3(256), 0, st, w, x, Y, T, M, N, epi, p, c);
    if (T <= 16) return launch_k(skinny_gemm_kernel<2>, g, dim3(256), 0, st, w, x, Y, T, M, N, epi, p, c);
    if (T <= 32) return launch_k(skinny_gemm_kernel<4>, g, dim3(256), 0, st, w, x, Y, T, M, N, epi, p, c);
    return launch_k(skinny_gemm_kernel<8>, g, dim3(256), 0, st, w, x, Y, T, M, N, epi, p, c);
}

cudaError_t sfi_gpu_moe_route(float *rl, int T, int E, int top, int norm, int32_t *sel_e,
                              float *sel_w, int exact, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    if (top > 64 || top < 1 || top > E) return cudaErrorInvalidValue;
    if (exact)
        launch_k(moe_route_kernel<true>, dim3((T + 63) / 64), dim3(64), 0, st, rl, T, E, top, norm, sel_e, sel_w);
    else
        launch_k(moe_route_kernel<false>, dim3((T + 63) / 64), dim3(64), 0, st, rl, T, E, top, norm, sel_e, sel_w);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_moe_gemv(void *const *w, int dtype, const int32_t *sel_e, int T, int top,
                             const float *x, int x_per_pair, int M, int N, float *y, int exact,
                             cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    const int pairs = T * top;
    if (exact) {
        if (dtype != SFI_GPU_F32) return cudaErrorInvalidValue;
        launch_k(moe_gemv_exact_kernel, dim3((M + 127) / 128, pairs), dim3(128), 0, st, (const float *const *)w, sel_e, top, x, x_per_pair, M, N, y);
        return cudaGetLastError();
    }
    if (N > 12288) return cudaErrorInvalidValue;
    const size_t smem = (size_t)N * sizeof(float);
    int gx = (M + 7) / 8;
    if (gx > 64) gx = 64;
    if (dtype == SFI_GPU_BF16) {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(moe_gemv_kernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        launch_k(moe_gemv_kernel<__nv_bfloat16>, dim3(gx, pairs), dim3(256), smem, st, w, sel_e, top, x, x_per_pair, M, N, y);
    } else {
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(moe_gemv_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        launch_k(moe_gemv_kernel<float>, dim3(gx, pairs), dim3(256), smem, st, w, sel_e, top, x, x_per_pair, M, N, y);
    }
    return cudaGetLastError();
}

cudaError_t sfi_gpu_moe_combine(float *h, const float *y, const float *sel_w, int T, int top, int H,
                                int exact, cudaStream_t st) {
    (void)exact; /* one formula: the reference's order, which costs nothing here */
    if (T <= 0) return cudaSuccess;
    launch_k(moe_combine_kernel, dim3((H + 255) / 256, T), dim3(256), 0, st, h, y, sel_w, top, H);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_moe_sort(const int32_t *sel_e, int pairs, int E, int32_t *cnt, int32_t *pos,
                             cudaStream_t st) {
    if (E <= 0) return cudaSuccess;
    if (pairs < 0) return cudaErrorInvalidValue;
    launch_k(moe_sort_kernel, dim3(E), dim3(256), 0, st, sel_e, pairs, cnt, pos);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_moe_gather(const float *x, int H, int top, int pairs, const int32_t *pos,
                               void *xs, int dtype, cudaStream_t st) {
    if (pairs <= 0) return cudaSuccess;
    dim3 g((H + 255) / 256 < 64 ? (H + 255) / 256 : 64, pairs < 65535 ? pairs : 65535);
    if (dtype == SFI_GPU_BF16)
        launch_k(moe_gather_kernel<__nv_bfloat16>, g, dim3(256), 0, st, x, H, top, pairs, pos,
                 (__nv_bfloat16 *)xs);
    else
        launch_k(moe_gather_kernel<float>, g, dim3(256), 0, st, x, H, top, pairs, pos, (float *)xs);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_moe_combine_pos(float *h, const float *y, const int32_t *pos, const float *sel_w,
                                    int T, int top, int H, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    dim3 g((H + 255) / 256, T < 65535 ? T : 65535);
    launch_k(moe_combine_pos_kernel, g, dim3(256), 0, st, h, y, pos, sel_w, T, top, H);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_window_logits(const float *qwin, int nw, int first, int n_ctx, int row, int n_heads,
                                  int n_kv, int head_dim, const int32_t *block_table, int max_blocks,
                                  int page, const void *k_pool, int dtype, float *out, int ld,
                                  cudaStream_t st) {
    if (nw <= 0 || n_ctx <= 0) return cudaSuccess;
    dim3 g((n_ctx + 255) / 256, nw, n_heads);
    window_logits_kernel<<<g, 256, 0, st>>>(qwin, nw, first, n_ctx, row, n_heads, n_kv, head_dim,
                                            block_table, max_blocks, page, k_pool, dtype, out, ld);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_fill_uniform(void *p, size_t n, int dtype, uint32_t seed, float scale, float offset,
                                 cudaStream_t st) {
    if (!n) return cudaSuccess;
    size_t blocks = (n + 255) / 256;
    if (blocks > 8192) blocks = 8192;
    fill_kernel<<<(unsigned)blocks, 256, 0, st>>>(p, n, dtype, seed, scale, offset);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_plan_step(const sfi_gpu_plan_cfg *cfg, sfi_gpu_run_state *st, sfi_gpu_step_desc *d,
                              sfi_gpu_step_desc *dsel, int32_t *hist_kind, cudaStream_t st_) {
    if (cfg->batch < 1 || cfg->batch > SFI_GPU_MAX_BATCH) return cudaErrorInvalidValue;
    if (cfg->sfi && cfg->refresh_delay >= 2 && !dsel) return cudaErrorInvalidValue;
    launch_k(plan_kernel, dim3(1), dim3(64), 0, st_, *cfg, st, d, dsel, hist_kind);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_end_step(const sfi_gpu_plan_cfg *cfg, sfi_gpu_run_state *st, const int32_t *next,
                             int32_t *hist_tok, cudaStream_t st_) {
    launch_k(end_step_kernel, dim3(1), dim3(64), 0, st_, *cfg, st, next, hist_tok);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_set_step_cond(cudaGraphConditionalHandle h, const sfi_gpu_run_state *st,
                                  cudaStream_t st_) {
    set_cond_kernel<<<1, 1, 0, st_>>>(h, st);
    return cudaGetLastError();
}

} // extern "C"
