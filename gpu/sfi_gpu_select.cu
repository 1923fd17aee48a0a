/* GPU-resident Selector (sfi(7) SELECTOR, steps 1-9), deterministic
 * Top-K by radix select, and the reorg gather into the compact buffer.
 * Layouts: see sfi_gpu.h. Everything stays on the device: the host only
 * launches kernels (no copies, no synchronisation). */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "sfi_gpu.h"
#include "sfi_gpu_math.cuh"
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

namespace {

constexpr int kSelThreads = 1024;
/* Most window rows per KV head sel_main_kernel takes (prefill windows:
 * W_prefill * G); the fast kernels take G (a decode step). */
constexpr int kMaxWin = 512;
constexpr int kTopkThreads = 1024;
/* Window rows sel_fast_kernel keeps per pass over the logits (registers);
 * a larger group (SFI_GPU_MAX_GROUP) takes several passes. */
constexpr int kFastWin = 8;

/* Block-wide reductions over 1024 threads (warp shuffles, then warp 0).
 * The shuffle tree is fixed, so results are deterministic run to run.
 * identity fills the slots of warps the block does not have. */
struct AddOp {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
template <typename T, typename Op>
__device__ T block_reduce(T v, T *sh, T identity, Op op) {
    for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : identity;
        for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}
__device__ float block_sum(float v, float *sh) { return block_reduce(v, sh, 0.f, AddOp()); }
__device__ double block_sum_d(double v, double *sh) { return block_reduce(v, sh, 0.0, AddOp()); }
__device__ float block_max(float v, float *sh) { return block_reduce(v, sh, -INFINITY, MaxOp()); }

/* Sum of x[0..n) in the reference's order (ascending, one float) when
 * EXACT, by thread 0; else a parallel deterministic tree. x is written by
 * this block before the call (the __syncthreads inside publishes it). */
template <bool EXACT>
__device__ float row_sum(const float *x, int n, float *sh) {
    if (EXACT) {
        __syncthreads();
        if (threadIdx.x == 0) {
            float a = 0.f;
            for (int i = 0; i < n; i++) a = __fadd_rn(a, x[i]);
            sh[33] = a;
        }
        __syncthreads();
        return sh[33];
    }
    float a = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) a += x[i];
    return block_sum(a, sh);
}

/* Selector steps 1-7 for one (request, KV head).
 * Launch: grid (n_kv, batch), block 1024. The CTA walks J with a block
 * stride several times: (1) per window query w, max and sum of exp over J
 * (softmax of step 1); (2) per j, p_w(j), power mean mu, f_un = mu^(1/a)
 * (step 2-3) and the unnormalised prior (step 4) into ws.f / ws.r;
 * (3) normalise both and the three dot products of step 5; (4) s and
 * z = log(s + eps) (step 6) into ws.z1; (5) Soft-NMS from the pre-NMS z1
 * into ws.z2 (step 7). Every intermediate is a row of [b][kvh][max_J]
 * global scratch (L2-resident at these sizes). EXACT: every sum is
 * sequential and ascending in one thread and every elementwise formula is
 * the reference's (ref/sfi_selector.c), so the bits match the host. */
template <bool EXACT>
__global__ void __launch_bounds__(kSelThreads)
sel_main_kernel(const sfi_gpu_step_desc *__restrict__ d, sfi_gpu_sel_params prm,
                const float *__restrict__ logits, const float *__restrict__ norms,
                sfi_gpu_sel_ws ws, float *__restrict__ s_out) {
    __shared__ float sh[40];
    __shared__ float mw[kMaxWin], sw[kMaxWin];
    const int kvh = blockIdx.x, b = blockIdx.y;
    const sfi_gpu_req rq = d->req[b];
    const int j0 = rq.j_begin, n = rq.j_end - rq.j_begin;
    if (n <= 0) return;
    const int G = d->n_heads / d->n_kv, nwin = d->n_win > 0 ? d->n_win : G;
    /* window row w of this (request, KV head); with n_win = G this is
     * query head kvh * G + w of the decode layout */
    auto wrow = [&](int w) {
        return logits + (((size_t)b * d->n_kv + kvh) * nwin + w) * d->ld_logits + j0;
    };
    const size_t row = ((size_t)b * d->n_kv + kvh) * d->max_J;
    float *f = ws.f + row, *r = ws.r + row, *z1 = ws.z1 + row, *z2 = ws.z2 + row;
    const float *nrm = norms + ((size_t)b * d->n_kv + kvh) * d->ld_logits + j0;

    /* step 1: softmax statistics of each window query over J */
    for (int w = 0; w < nwin; w++) {
        const float *lw = wrow(w);
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, lw[i]);
        mx = block_max(mx, sh); /* a max of finite values: any order */
        /* e = exp(l - max) into z1 (scratch), then its sum */
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            z1[i] = sfi_dev_expf(__fsub_rn(lw[i], mx));
        const float sum = row_sum<EXACT>(z1, n, sh);
        if (threadIdx.x == 0) { mw[w] = mx; sw[w] = sum; }
        __syncthreads();
    }
    /* steps 2-4: g = (mean of p^a)^(1/a) (f = p when n_win == 1), and the
     * unnormalised prior w */
    const float inv_alpha = __fdiv_rn(1.0f, prm.alpha);
    const float span = __fadd_rn((float)(n - 1), prm.eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float fu;
        if (nwin == 1) {
            const float *lw = wrow(0);
            fu = __fdiv_rn(sfi_dev_expf(__fsub_rn(lw[i], mw[0])), sw[0]);
        } else {
            float mu = 0.f;
            for (int w = 0; w < nwin; w++) {
                const float *lw = wrow(w);
                const float p = __fdiv_rn(sfi_dev_expf(__fsub_rn(lw[i], mw[w])), sw[w]);
                mu = __fadd_rn(mu, sfi_dev_powf_pos(p, prm.alpha));
            }
            fu = sfi_dev_powf_pos(__fdiv_rn(mu, (float)nwin), inv_alpha);
        }
        f[i] = fu;
        const float kn = sfi_dev_powf_pos(__fadd_rn(nrm[i], prm.eps), -prm.gamma);
        const float u = __fdiv_rn((float)i, span);
        const float pp = __fmul_rn(sfi_dev_expf(__fmul_rn(-prm.beta, sfi_dev_powf_pos(u, prm.p))),
                                   sfi_dev_powf_pos(__fadd_rn(__fsub_rn(1.0f, u), prm.eps), prm.eta));
        r[i] = __fmul_rn(kn, pp);
    }
    const float Sf = nwin == 1 ? 1.0f : row_sum<EXACT>(f, n, sh);
    const float Sr = row_sum<EXACT>(r, n, sh);
    __syncthreads();
    /* step 5: normalise; num = sum f (f - r), den = sum (f - r)^2 */
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float fi = nwin == 1 ? f[i] : __fdiv_rn(f[i], Sf);
        const float ri = __fdiv_rn(r[i], Sr);
        f[i] = fi;
        r[i] = ri;
    }
    float num, den;
    if (EXACT) {
        __syncthreads();
        if (threadIdx.x == 0) {
            float a = 0.f, c = 0.f;
            for (int i = 0; i < n; i++) {
                const float dd = __fsub_rn(f[i], r[i]);
                a = __fadd_rn(a, __fmul_rn(f[i], dd));
                c = __fadd_rn(c, __fmul_rn(dd, dd));
            }
            sh[34] = a; sh[35] = c;
        }
        __syncthreads();
        num = sh[34]; den = sh[35];
    } else {
        __syncthreads();
        float a = 0.f, c = 0.f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float dd = f[i] - r[i];
            a = fmaf(f[i], dd, a);
            c = fmaf(dd, dd, c);
        }
        num = block_sum(a, sh);
        den = block_sum(c, sh);
    }
    float lam = 0.0f;
    if (den != 0.0f) {
        lam = __fdiv_rn(num, den);
        if (!(lam > 0.0f)) lam = 0.0f; /* negative or NaN */
        if (lam > prm.lambda_clip) lam = prm.lambda_clip;
    }
    if (threadIdx.x == 0) ws.lambda[(size_t)b * d->n_kv + kvh] = lam;
    /* step 6 */
    const float oml = __fsub_rn(1.0f, lam);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float s = __fadd_rn(__fmul_rn(oml, f[i]), __fmul_rn(lam, r[i]));
        if (s_out) s_out[row + i] = s;
        z1[i] = sfi_dev_logf(__fadd_rn(s, prm.eps));
    }
    __syncthreads();
    /* step 7: Soft-NMS from pre-NMS scores */
    const int R = prm.nms_radius;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float z = z1[i];
        const int lo = max(0, i - R), hi = min(n - 1, i + R);
        float m = z1[lo];
        for (int k = lo + 1; k <= hi; k++) m = z1[k] > m ? z1[k] : m;
        z2[i] = __fsub_rn(z, __fmul_rn(prm.alpha_soft, __fsub_rn(m, z)));
    }
}

/* Loads x[0..cnt) = p[i..i+cnt), one 16-byte load when vec (p + i is then
 * 16-byte aligned: callers check the row base once) and cnt == 4. */
__device__ __forceinline__ bool al16(const void *p);
__device__ __forceinline__ void ld4(const float *p, int i, int cnt, bool vec, float x[4]) {
    if (vec && cnt == 4 && al16(p + i)) {
        const float4 v = *reinterpret_cast<const float4 *>(p + i);
        x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) x[k] = k < cnt ? p[i + k] : 0.f;
    }
}
/* ld4 for data read exactly once (the Selector's logits and key norms):
 * evict-first in L2, so streaming 84 MB through it does not push out the
 * score rows the next kernels read back. */
__device__ __forceinline__ void ld4_once(const float *p, int i, int cnt, float x[4]) {
    if (cnt == 4 && al16(p + i)) {
        const float4 v = __ldcs(reinterpret_cast<const float4 *>(p + i));
        x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) x[k] = k < cnt ? __ldcs(p + i + k) : 0.f;
    }
}
__device__ __forceinline__ void st4(float *p, int i, int cnt, bool vec, const float x[4]) {
    if (vec && cnt == 4 && al16(p + i)) {
        *reinterpret_cast<float4 *>(p + i) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (k < cnt) p[i + k] = x[k];
    }
}
__device__ __forceinline__ bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Fast-path transcendental functions (the exact path uses the ported
 * reference ones). exp: 2^(x log2 e) with the product carried in two parts
 * (an FMA keeps x*log2e to about 2^-40 relative); the integer part k is
 * split off before ex2.approx sees the argument, because rounding the
 * whole product to one float would cost |x| * 2^-24 relative (6e-7 at
 * x = -20, most of the checker's 1e-6 on s). ex2.approx (2^-22 relative)
 * then gets |f| <= 1/2 and 2^k is applied exactly in two halves (no
 * overflow of the exponent field for k in [-252, 254]; beyond, the
 * result is 0 or inf anyway). log: lg2.approx has an absolute error below
 * 2^-22 in log2 units, about 1.7e-7 in z = log(s + eps) for any s. */
__device__ __forceinline__ float fexp(float x) {
    const float hi = x * 1.44269502f;
    const float lo = fmaf(x, 1.44269502f, -hi) + x * 1.9259629e-8f;
    const float k = rintf(hi);
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"((hi - k) + lo));
    const int ki = (int)fminf(fmaxf(k, -252.f), 254.f), k1 = ki >> 1;
    return y * __int_as_float((k1 + 127) << 23) * __int_as_float((ki - k1 + 127) << 23);
}
__device__ __forceinline__ float flog(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y * 0.693147181f;
}

/* Merges two (max, sum of exp(x - max)) pairs. */
__device__ __forceinline__ void ms_merge(float &m, float &s, float m2, float s2) {
    const float M = fmaxf(m, m2);
    if (M == -INFINITY) { s = 0.f; m = M; return; }
    s = (m == -INFINITY ? 0.f : s * fexp(m - M)) + (m2 == -INFINITY ? 0.f : s2 * fexp(m2 - M));
    m = M;
}

__device__ void block_ms(float &m, float &s, float *sh) {
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        ms_merge(m, s, m2, s2);
    }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) { sh[w] = m; sh[32 + w] = s; }
    __syncthreads();
    if (w == 0) {
        m = lane < nw ? sh[lane] : -INFINITY;
        s = lane < nw ? sh[32 + lane] : 0.f;
        for (int off = 16; off > 0; off >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
            const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
            ms_merge(m, s, m2, s2);
        }
        if (lane == 0) { sh[64] = m; sh[65] = s; }
    }
    __syncthreads();
    m = sh[64];
    s = sh[65];
    __syncthreads();
}

/* Selector steps 1-7, fast path (the default; the reference's formulas,
 * parallel sums, fast exp/log). Launch: grid (n_kv, batch), block 1024.
 * Thread t owns groups of 4 consecutive positions (t*4 + k*4096), loaded
 * as one 16-byte vector when the rows are aligned. Passes over J: (A) up
 * to kFastWin window rows at once (a group of 16: two passes): online max
 * and sum of exp per row (one read of the logits), into shared memory;
 * (B) logits + norms -> g (or f = p) and the prior weight w into
 * ws.f / ws.r, their sums and the float64 sums step 5 needs; (D) s (to
 * s_out), z = log(s + eps) and Soft-NMS into ws.z2. Between passes only
 * block-wide reductions. */
__global__ void __launch_bounds__(kSelThreads)
sel_fast_kernel(const sfi_gpu_step_desc *__restrict__ d, sfi_gpu_sel_params prm,
                const float *__restrict__ logits, const float *__restrict__ norms,
                sfi_gpu_sel_ws ws, float *__restrict__ s_out) {
    __shared__ float sh[72];
    __shared__ double shd[34];
    __shared__ float s_mw[SFI_GPU_MAX_GROUP], s_isw[SFI_GPU_MAX_GROUP];
    const int kvh = blockIdx.x, b = blockIdx.y;
    const sfi_gpu_req rq = d->req[b];
    const int j0 = rq.j_begin, n = rq.j_end - rq.j_begin;
    if (n <= 0) return;
    const int G = d->n_heads / d->n_kv, nwin = G;
    const size_t row = ((size_t)b * d->n_kv + kvh) * d->max_J;
    float *__restrict__ f = ws.f + row, *__restrict__ r = ws.r + row;
    float *__restrict__ z1 = ws.z1 + row, *__restrict__ z2 = ws.z2 + row;
    float *__restrict__ so = s_out ? s_out + row : nullptr;
    const float *__restrict__ nrm = norms + ((size_t)b * d->n_kv + kvh) * d->ld_logits + j0;
    const float *__restrict__ lrow = logits + ((size_t)b * d->n_heads + kvh * G) * d->ld_logits + j0;
    const size_t lds = d->ld_logits;
    const bool vec = al16(f) && al16(r) && al16(z1) && al16(nrm) && al16(lrow) && (lds % 4 == 0) &&
                     (!so || al16(so));
    const int step = blockDim.x * 4;

    /* (A), kFastWin rows a pass; each row's statistics are its own, so
     * the passes change no bits */
    for (int w0 = 0; w0 < nwin; w0 += kFastWin) {
        const int nw = min(kFastWin, nwin - w0);
        float mw[kFastWin], sw[kFastWin];
#pragma unroll
        for (int w = 0; w < kFastWin; w++) { mw[w] = -INFINITY; sw[w] = 0.f; }
#pragma unroll 2
        for (int i = threadIdx.x * 4; i < n; i += step) {
            const int cnt = min(4, n - i);
#pragma unroll
            for (int w = 0; w < kFastWin; w++) {
                if (w >= nw) break;
                float x[4];
                ld4(lrow + (w0 + w) * lds, i, cnt, vec, x);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (k >= cnt) break;
                    if (x[k] > mw[w]) {
                        sw[w] = (mw[w] == -INFINITY ? 0.f : sw[w] * fexp(mw[w] - x[k])) + 1.0f;
                        mw[w] = x[k];
                    } else {
                        sw[w] += fexp(x[k] - mw[w]);
                    }
                }
            }
        }
#pragma unroll
        for (int w = 0; w < kFastWin; w++) {
            if (w >= nw) break;
            block_ms(mw[w], sw[w], sh); /* block-uniform results */
            if (threadIdx.x == 0) { s_mw[w0 + w] = mw[w]; s_isw[w0 + w] = 1.0f / sw[w]; }
        }
    }
    __syncthreads();

    /* (B) */
    const float inv_alpha = 1.0f / prm.alpha;
    const float span = (float)(n - 1) + prm.eps;
    float Sf = 0.f, Sr = 0.f;
    double A1 = 0, A2 = 0, A3 = 0; /* sums of g*g, g*w, w*w (step 5, below) */
#pragma unroll 2
    for (int i = threadIdx.x * 4; i < n; i += step) {
        const int cnt = min(4, n - i);
        float fu[4], ru[4], nr[4];
        if (nwin == 1) {
            float x[4];
            ld4(lrow, i, cnt, vec, x);
#pragma unroll
            for (int k = 0; k < 4; k++) fu[k] = fexp(x[k] - s_mw[0]) * s_isw[0];
        } else {
            /* window rows in ascending order (the reference's sum) */
            float mu[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
            for (int w = 0; w < nwin; w++) {
                float x[4];
                ld4(lrow + w * lds, i, cnt, vec, x);
                const float mww = s_mw[w], isw = s_isw[w];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float p = fexp(x[k] - mww) * isw;
                    /* p^alpha; alpha = 0.5 (default) is a square root */
                    mu[k] += prm.alpha == 0.5f ? sqrtf(p)
                             : (p > 0.f ? fexp(prm.alpha * flog(p)) : 0.f);
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float m_ = mu[k] * (1.0f / (float)nwin);
                fu[k] = prm.alpha == 0.5f ? m_ * m_ : (m_ > 0.f ? fexp(inv_alpha * flog(m_)) : 0.f);
            }
        }
        ld4(nrm, i, cnt, vec, nr);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            /* the reference's formulas; u is an IEEE division because
             * 1 - u cancels near the end of J */
            const float kn = prm.gamma == 1.0f ? 1.0f / (nr[k] + prm.eps)
                                               : fexp(-prm.gamma * flog(nr[k] + prm.eps));
            const float u = (float)(i + k) / span;
            const float up = prm.p == 2.0f ? u * u : (u > 0.f ? fexp(prm.p * flog(u)) : 0.f);
            const float tail = (1.0f - u) + prm.eps;
            const float te = prm.eta == 0.5f ? sqrtf(tail) : fexp(prm.eta * flog(tail));
            ru[k] = kn * (fexp(-prm.beta * up) * te);
            if (k < cnt) {
                Sf += fu[k];
                Sr += ru[k];
                A1 = fma((double)fu[k], (double)fu[k], A1);
                A2 = fma((double)fu[k], (double)ru[k], A2);
                A3 = fma((double)ru[k], (double)ru[k], A3);
            }
        }
        st4(f, i, cnt, vec, fu);
        st4(r, i, cnt, vec, ru);
    }
    Sf = nwin == 1 ? 1.0f : block_sum(Sf, sh);
    Sr = block_sum(Sr, sh);
    const float inv_Sf = 1.0f / Sf, inv_Sr = 1.0f / Sr;

    /* Step 5 without another pass: with f = g/Sf, r = w/Sr,
     *   num = sum f (f - r) = A1/Sf^2 - A2/(Sf Sr),
     *   den = sum (f - r)^2 = A1/Sf^2 - 2 A2/(Sf Sr) + A3/Sr^2,
     * from float64 sums, so the cancellation when f is close to r costs
     * nothing visible in float32. */
    A1 = block_sum_d(A1, shd);
    A2 = block_sum_d(A2, shd);
    A3 = block_sum_d(A3, shd);
    const double sf = nwin == 1 ? 1.0 : (double)Sf, sr = (double)Sr;
    const double t1 = A1 / (sf * sf), t2 = A2 / (sf * sr), t3 = A3 / (sr * sr);
    const float num = (float)(t1 - t2), den = (float)(t1 - 2 * t2 + t3);
    float lam = 0.0f;
    if (den != 0.0f) {
        lam = num / den;
        if (!(lam > 0.0f)) lam = 0.0f;
        if (lam > prm.lambda_clip) lam = prm.lambda_clip;
    }
    if (threadIdx.x == 0) ws.lambda[(size_t)b * d->n_kv + kvh] = lam;

    /* (D): s, z = log(s + eps) and Soft-NMS in one pass: a thread computes
     * z for its 4 positions and for up to 4 neighbours on each side (the
     * radius' halo; z is elementwise in f and r), so no z row is written
     * and read back and no barrier is needed. Radius > 4: two passes. */
    const float oml = 1.0f - lam;
    const int R = prm.nms_radius;
    auto s_at = [&](float fu, float rv) -> float {
        const float fx = nwin != 1 ? fu * inv_Sf : fu;
        return __fadd_rn(__fmul_rn(oml, fx), __fmul_rn(lam, rv * inv_Sr));
    };
    for (int i = threadIdx.x * 4; i < n; i += step) {
        const int cnt = min(4, n - i);
        float fx[4], rx[4], sx[4], w[12];
        ld4(f, i, cnt, vec, fx);
        ld4(r, i, cnt, vec, rx);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            sx[k] = s_at(fx[k], rx[k]);
            w[4 + k] = k < cnt ? flog(sx[k] + prm.eps) : -INFINITY;
        }
        if (so) st4(so, i, cnt, vec, sx);
        if (R <= 4) {
#pragma unroll
            for (int h = 0; h < 4; h++) {
                const int jl = i - 1 - h, jr = i + 4 + h;
                w[3 - h] = (h < R && jl >= 0) ? flog(s_at(f[jl], r[jl]) + prm.eps) : -INFINITY;
                w[8 + h] = (h < R && jr < n) ? flog(s_at(f[jr], r[jr]) + prm.eps) : -INFINITY;
            }
            float zo[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float m = -INFINITY;
#pragma unroll
                for (int t = 0; t < 12; t++)
                    if (t >= 4 + k - R && t <= 4 + k + R) m = fmaxf(m, w[t]);
                zo[k] = w[4 + k] - prm.alpha_soft * (m - w[4 + k]);
            }
            st4(z2, i, cnt, vec, zo);
        } else {
            st4(z1, i, cnt, vec, w + 4);
        }
    }
    if (R > 4) {
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float z = z1[i];
            const int lo = max(0, i - R), hi = min(n - 1, i + R);
            float m = z1[lo];
            for (int k = lo + 1; k <= hi; k++) m = z1[k] > m ? z1[k] : m;
            z2[i] = z - prm.alpha_soft * (m - z);
        }
    }
}

/* Steps 1-7 on a thread-block cluster (fast path for 1, 2, 4, 8 or 16
 * window queries when |J| and the Soft-NMS radius fit; sel_fast_kernel
 * otherwise; 16 (Qwen3-235B-A22B) keeps 64 logits a thread in registers,
 * one CTA an SM, |J| up to 16K). Why: with one CTA per (request, KV head) too few bytes are
 * in flight to stream the logits at DRAM speed, they are read twice (once
 * for the softmax statistics, once for p), and f and r make a round trip
 * through global memory. Here a cluster of kClC CTAs shares the row and
 * every thread keeps its positions' logits, key norms, g and w in
 * registers from the one read to the end; only reductions cross CTAs.
 * Launch: grid (n_kv * kClC, batch), cluster (kClC, 1, 1), block kClT.
 * CTA rank c owns the chunk [c*cs, c*cs + cs) of J, cs = ceil(|J| / kClC)
 * rounded up to 4 (the last chunks may be short or empty); thread t owns
 * the groups of 4 consecutive positions 4*(t + g*kClT), g < NG, loaded as
 * 16-byte vectors when aligned. Three reduction rounds, each a block
 * reduction whose result warp 0 pushes into slot c of every CTA's shared
 * memory, then one cluster barrier, after which each CTA merges the kClC
 * slots in rank order (so every CTA gets the same bits, run to run):
 * (A) per window row max and sum of exp (softmax statistics, step 1);
 * (B) sums of g (or f = p) and of the prior weight w (steps 2-4);
 * (C) sum f (f - r) and sum (f - r)^2 of step 5, in float as the reference
 * does. Then (D) s and z = log(s + eps) (step 6) into shared memory, the
 * nms_radius positions beyond each chunk end computed by this CTA too
 * (their raw inputs read at the start), and Soft-NMS (step 7) into
 * ws.z2. No CTA reads another's memory after the last barrier, so none
 * has to wait for the others before it exits. */
/* 8 CTAs of 512 threads measured faster than 16 of 256 on the H100
 * bench (118 vs 127 us for the Selector). */
constexpr int kClC = 8;
constexpr int kClT = 4096 / kClC;
constexpr int kClHalo = 4; /* largest Soft-NMS radius of the cluster path */
template <int NW> struct ClShape {
    /* NW*NG*4 <= 32 logits in registers; 64 for NW = 16 (one CTA an SM) */
    static constexpr int NG = NW > 8 ? 1 : 8 / NW < 4 ? 8 / NW : 4;
    static constexpr int cap = kClC * 4 * kClT * NG;   /* longest J */
};

__device__ __forceinline__ float ex2a(float a) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(a));
    return y;
}
/* exp(d * sc) for sc = 1 or 1/2 (a power of two: the scaled constants
 * stay exact). The argument's rounding to one float would cost |d| 2^-24
 * relative (as in fexp), so its residual lo is applied as 1 + lo ln2
 * after ex2.approx: 6 instructions, about 2^-22 relative for any d. */
__device__ __forceinline__ float fexp_s(float d, float sc) {
    const float c = 1.44269502f * sc, hi = d * c;
    const float lo = fmaf(d, 1.9259629e-8f * sc, fmaf(d, c, -hi));
    const float y = ex2a(hi);
    return fmaf(y, lo * 0.693147181f, y);
}
__device__ __forceinline__ float rcpa(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float sqrta(float x) {
    float y;
    asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* g (fu) and the prior weight w (ru) of one position (steps 2-4), the
 * reference's formulas. e[w] = exp(sc (l_w - m_w)) for some reference
 * m_w, cw[w] the factor that makes it p_w^sc: with the default alpha = 1/2
 * (HALF) sc = 1/2 and p^(1/2) = e * cw needs no pow; else sc = 1 and
 * p = e * cw. u stays an IEEE division because 1 - u cancels near the end
 * of J. */
template <int NW>
__device__ __forceinline__ void cl_pos(const float *e, float nr, int pos, const float *cw, bool half,
                                       const sfi_gpu_sel_params &prm, float inv_alpha, float span,
                                       float &fu, float &ru) {
    if (NW == 1) {
        fu = e[0] * cw[0];
    } else if (half) {
        float mu = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) mu = fmaf(e[w], cw[w], mu);
        const float m_ = mu * (1.0f / (float)NW);
        fu = m_ * m_;
    } else {
        float mu = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float p = e[w] * cw[w];
            mu += p > 0.f ? fexp(prm.alpha * flog(p)) : 0.f;
        }
        const float m_ = mu * (1.0f / (float)NW);
        fu = m_ > 0.f ? fexp(inv_alpha * flog(m_)) : 0.f;
    }
    const float kn = prm.gamma == 1.0f ? rcpa(nr + prm.eps) : fexp(-prm.gamma * flog(nr + prm.eps));
    const float u = __fdiv_rn((float)pos, span);
    const float up = prm.p == 2.0f ? u * u : (u > 0.f ? fexp(prm.p * flog(u)) : 0.f);
    const float tail = (1.0f - u) + prm.eps;
    const float te = prm.eta == 0.5f ? sqrta(tail) : fexp(prm.eta * flog(tail));
    ru = kn * (fexp_s(-prm.beta * up, 1.0f) * te);
}

/* Soft-NMS of the 4 positions i..i+3 from z in sz (valid from i - R to
 * i + 3 + R); H >= R is the window the code is unrolled for, FIXED: R ==
 * H (the default radius 2 gets a branch-free window). */
template <int H, bool FIXED>
__device__ __forceinline__ void cl_nms4(const float *sz, int i, int R, float alpha_soft,
                                        float (&zo)[4]) {
    if (FIXED) R = H;
    float wv[4 + 2 * H]; /* z at position i - H + t */
#pragma unroll
    for (int t = 0; t < 4 + 2 * H; t++)
        wv[t] = t >= H - R && t < H + 4 + R ? sz[i - H + t] : -INFINITY;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float m = -INFINITY;
#pragma unroll
        for (int t = 0; t < 4 + 2 * H; t++)
            if (t >= H + k - R && t <= H + k + R) m = fmaxf(m, wv[t]);
        zo[k] = wv[H + k] - alpha_soft * (m - wv[H + k]);
    }
}

/* One reduction round: v (N values per thread) reduced over the block by
 * op (fixed shuffle tree, then warp 0 over the warps in order) and pushed
 * by warp 0's lanes q < kClC into slot [c][.] of rank q's `gat`. The
 * caller's cluster barrier then publishes it. sh: (blockDim/32) * N. */
template <int N, typename Op>
__device__ __forceinline__ void cl_push(float (&v)[N], float idn, float *sh, float *gat,
                                        cg::cluster_group &cl, int c, Op op) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
#pragma unroll
    for (int k = 0; k < N; k++)
        for (int off = 16; off > 0; off >>= 1) v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], off));
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < N; k++) sh[w * N + k] = v[k];
    }
    __syncthreads();
    if (w == 0) {
#pragma unroll
        for (int k = 0; k < N; k++) {
            float a = lane < nw ? sh[lane * N + k] : idn;
            for (int off = 16; off > 0; off >>= 1) a = op(a, __shfl_xor_sync(0xffffffffu, a, off));
            if (lane < kClC) cl.map_shared_rank(gat, lane)[c * N + k] = a;
        }
    }
}

struct OpAdd { __device__ float operator()(float a, float b) const { return a + b; } };

template <int NW>
__global__ void __launch_bounds__(kClT, NW > 8 ? 1 : 1024 / kClT)
sel_cluster_kernel(const sfi_gpu_step_desc *__restrict__ d, sfi_gpu_sel_params prm,
                   const float *__restrict__ logits, const float *__restrict__ norms,
                   sfi_gpu_sel_ws ws, float *__restrict__ s_out) {
    constexpr int NG = ClShape<NW>::NG;
    __shared__ __align__(16) float zx[kClHalo + 4 * kClT * NG + kClHalo]; /* z, halo both sides */
    __shared__ float sh[(kClT / 32) * (NW > 2 ? NW : 2)];
    __shared__ float gat_m[kClC * NW], gat_s[kClC * NW], gat_b[kClC * 2], gat_c[kClC * 2];
    __shared__ float st_m[NW], st_c[NW];
    __shared__ float hraw[2 * kClHalo][NW + 1];
    float *const sz = zx + kClHalo;
    cg::cluster_group cl = cg::this_cluster();
    /* DSMEM may be written only once every CTA of the cluster runs: arrive
     * now, wait just before the first push */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    const int c = (int)cl.block_rank();
    const int kvh = blockIdx.x / kClC, b = blockIdx.y;
    const sfi_gpu_req rq = d->req[b];
    const int j0 = rq.j_begin, n = rq.j_end - rq.j_begin;
    if (n <= 0) { /* the whole cluster (one request) leaves; match the arrive */
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        return;
    }
    const int cs = ((n + kClC - 1) / kClC + 3) & ~3;
    const int cb = c * cs, cn = max(0, min(cs, n - cb));
    const int R = prm.nms_radius;
    const size_t row = ((size_t)b * d->n_kv + kvh) * d->max_J + cb;
    const size_t lds = d->ld_logits;
    const float *__restrict__ nrm = norms + ((size_t)b * d->n_kv + kvh) * lds + j0 + cb;
    const float *__restrict__ lrow = logits + ((size_t)b * d->n_heads + kvh * NW) * lds + j0 + cb;

    /* every load first: all of the CTA's bytes in flight at once */
    float x[NG][NW][4], nr[NG][4];
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int i = 4 * ((int)threadIdx.x + g * kClT), cnt = max(0, min(4, cn - i));
#pragma unroll
        for (int w = 0; w < NW; w++) ld4_once(lrow + w * lds, i, cnt, x[g][w]);
        ld4_once(nrm, i, cnt, nr[g]);
    }
    /* raw inputs of the halo: R positions before and after the chunk */
    const int hq = (int)threadIdx.x < R ? (int)threadIdx.x - R : cn + (int)threadIdx.x - R;
    const bool hin = (int)threadIdx.x < 2 * R && cb + hq >= 0 && cb + hq < n;
    if (hin) {
#pragma unroll
        for (int w = 0; w < NW; w++) hraw[threadIdx.x][w] = lrow[w * lds + hq];
        hraw[threadIdx.x][NW] = nrm[hq];
    }

    /* (A): block max m_c per row, then the sum of exp(l - m_c); the
     * cluster merge rescales by exp(m_c - M). p itself is taken in (B)
     * from l - M, the reference's own rounding of the argument (taking it
     * from l - m_c instead rounds differently and costs up to half the
     * checker's tolerance on s). */
    const bool half = NW != 1 && prm.alpha == 0.5f;
    const float sc = half ? 0.5f : 1.0f;
    float mx[NW], sm[NW];
#pragma unroll
    for (int w = 0; w < NW; w++) {
        mx[w] = -INFINITY;
#pragma unroll
        for (int g = 0; g < NG; g++) {
            const int i = 4 * ((int)threadIdx.x + g * kClT);
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (i + k < cn) mx[w] = fmaxf(mx[w], x[g][w][k]);
        }
        for (int off = 16; off > 0; off >>= 1) mx[w] = fmaxf(mx[w], __shfl_xor_sync(0xffffffffu, mx[w], off));
    }
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int w = 0; w < NW; w++) sh[(threadIdx.x >> 5) * NW + w] = mx[w];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
#pragma unroll
        for (int w = 0; w < NW; w++) {
            float m = (int)threadIdx.x < kClT / 32 ? sh[threadIdx.x * NW + w] : -INFINITY;
            for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
            if (threadIdx.x == 0) st_m[w] = m;
        }
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < NW; w++) {
        mx[w] = st_m[w];
        /* the large-|d| terms whose argument ex2 rounds are the small
         * ones: no residual correction needed in this sum */
        const float m0 = mx[w] == -INFINITY ? 0.f : mx[w]; /* empty chunk: nothing to scale */
        sm[w] = 0.f;
#pragma unroll
        for (int g = 0; g < NG; g++) {
            const int i = 4 * ((int)threadIdx.x + g * kClT);
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (i + k < cn) sm[w] += ex2a((x[g][w][k] - m0) * 1.44269502f);
        }
    }
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if (threadIdx.x < 32 && (int)threadIdx.x < kClC) {
#pragma unroll
        for (int w = 0; w < NW; w++) cl.map_shared_rank(gat_m, threadIdx.x)[c * NW + w] = mx[w];
    }
    cl_push<NW>(sm, 0.f, sh, gat_s, cl, c, OpAdd());
    cl.sync();
    if ((int)threadIdx.x < NW) {
        /* row max M and sum S = sum_q S_q exp(m_q - M) in rank order, and
         * the factor cw that makes exp(sc (l - M)) p^sc */
        const int w = threadIdx.x;
        float m = -INFINITY, s = 0.f;
        for (int q = 0; q < kClC; q++) m = fmaxf(m, gat_m[q * NW + w]);
        for (int q = 0; q < kClC; q++) {
            const float mq = gat_m[q * NW + w];
            if (mq != -INFINITY) s += gat_s[q * NW + w] * fexp_s(mq - m, 1.0f);
        }
        st_m[w] = m;
        st_c[w] = half ? 1.0f / sqrtf(s) : 1.0f / s;
    }
    __syncthreads();
    float M[NW], cw[NW];
#pragma unroll
    for (int w = 0; w < NW; w++) { M[w] = st_m[w]; cw[w] = st_c[w]; }

    /* (B) */
    const float inv_alpha = 1.0f / prm.alpha;
    const float span = (float)(n - 1) + prm.eps;
    float fu[NG][4], ru[NG][4];
    float sums[2] = {0.f, 0.f};
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int i = 4 * ((int)threadIdx.x + g * kClT);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float ev[NW];
#pragma unroll
            for (int w = 0; w < NW; w++) ev[w] = fexp_s(x[g][w][k] - M[w], sc);
            cl_pos<NW>(ev, nr[g][k], cb + i + k, cw, half, prm, inv_alpha, span, fu[g][k], ru[g][k]);
            if (i + k < cn) { sums[0] += fu[g][k]; sums[1] += ru[g][k]; }
        }
    }
    cl_push<2>(sums, 0.f, sh, gat_b, cl, c, OpAdd());
    cl.sync();
    float Sf = 0.f, Sr = 0.f;
    for (int q = 0; q < kClC; q++) { Sf += gat_b[2 * q]; Sr += gat_b[2 * q + 1]; }
    if (NW == 1) Sf = 1.0f;
    const float inv_Sf = 1.0f / Sf, inv_Sr = 1.0f / Sr;

    /* (C) */
    float nd[2] = {0.f, 0.f};
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int i = 4 * ((int)threadIdx.x + g * kClT);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float fx = NW != 1 ? fu[g][k] * inv_Sf : fu[g][k], rx = ru[g][k] * inv_Sr;
            const float dd = fx - rx;
            if (i + k < cn) { nd[0] = fmaf(fx, dd, nd[0]); nd[1] = fmaf(dd, dd, nd[1]); }
        }
    }
    cl_push<2>(nd, 0.f, sh, gat_c, cl, c, OpAdd());
    cl.sync(); /* the last access to another CTA's memory is before this */
    float num = 0.f, den = 0.f;
    for (int q = 0; q < kClC; q++) { num += gat_c[2 * q]; den += gat_c[2 * q + 1]; }
    float lam = 0.0f;
    if (den != 0.0f) {
        lam = num / den;
        if (!(lam > 0.0f)) lam = 0.0f;
        if (lam > prm.lambda_clip) lam = prm.lambda_clip;
    }
    if (c == 0 && threadIdx.x == 0) ws.lambda[(size_t)b * d->n_kv + kvh] = lam;

    /* (D) */
    const float oml = 1.0f - lam;
    auto s_of = [&](float fuv, float ruv) -> float {
        const float fx = NW != 1 ? fuv * inv_Sf : fuv;
        return __fadd_rn(__fmul_rn(oml, fx), __fmul_rn(lam, ruv * inv_Sr));
    };
    float *__restrict__ so = s_out ? s_out + row : nullptr;
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int i = 4 * ((int)threadIdx.x + g * kClT);
        float sx[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            sx[k] = s_of(fu[g][k], ru[g][k]);
            if (i + k < cn) sz[i + k] = flog(sx[k] + prm.eps);
        }
        if (so && i < cn) st4(so, i, min(4, cn - i), true, sx);
    }
    if ((int)threadIdx.x < 2 * R) {
        float z = -INFINITY;
        if (hin) {
            float he[NW], hc[NW], hf, hr;
#pragma unroll
            for (int w = 0; w < NW; w++) { he[w] = fexp_s(hraw[threadIdx.x][w] - M[w], sc); hc[w] = cw[w]; }
            cl_pos<NW>(he, hraw[threadIdx.x][NW], cb + hq, hc, half, prm, inv_alpha, span, hf, hr);
            z = flog(s_of(hf, hr) + prm.eps);
        }
        sz[hq] = z;
    }
    __syncthreads();
    float *__restrict__ z2 = ws.z2 + row;
#pragma unroll
    for (int g = 0; g < NG; g++) {
        const int i = 4 * ((int)threadIdx.x + g * kClT);
        if (i >= cn) continue;
        float zo[4];
        if (R == 2)
            cl_nms4<2, true>(sz, i, R, prm.alpha_soft, zo);
        else
            cl_nms4<kClHalo, false>(sz, i, R, prm.alpha_soft, zo);
        st4(z2, i, min(4, cn - i), true, zo);
    }
}

/* Step 8, cross-head exclusivity. Launch: grid (ceil(max_J/256), batch),
 * block 256; thread = one position j, loops over the n_kv heads in order
 * (softmax over heads: max, exp, ascending sum, divide, as sfi_softmax),
 * writes z3 into ws.z1. */
template <bool EXACT>
__global__ void sel_cross_kernel(const sfi_gpu_step_desc *__restrict__ d, sfi_gpu_sel_params prm,
                                 sfi_gpu_sel_ws ws) {
    const int b = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    const sfi_gpu_req rq = d->req[b];
    const int n = rq.j_end - rq.j_begin;
    if (i >= n) return;
    const int H = d->n_kv;
    float t[16];
    float mx = -INFINITY;
    for (int h = 0; h < H; h++) {
        const float z = ws.z2[((size_t)b * H + h) * d->max_J + i];
        t[h] = __fdiv_rn(z, prm.T);
        mx = (h == 0 || t[h] > mx) ? t[h] : mx;
    }
    float sum = 0.f;
    for (int h = 0; h < H; h++) {
        t[h] = EXACT ? sfi_dev_expf(__fsub_rn(t[h], mx)) : fexp(t[h] - mx);
        sum = __fadd_rn(sum, t[h]);
    }
    for (int h = 0; h < H; h++) {
        const size_t o = ((size_t)b * H + h) * d->max_J + i;
        float rh = __fdiv_rn(t[h], sum);
        rh = rh > prm.eps ? rh : prm.eps;
        ws.z1[o] = __fadd_rn(ws.z2[o], __fmul_rn(prm.alpha_cross, EXACT ? sfi_dev_logf(rh) : flog(rh)));
    }
}

/* Step 8, fast path. Launch: grid (ceil(max_J/1024), batch), block 256;
 * a thread takes 4 consecutive positions (16-byte loads and stores when
 * aligned) and keeps all heads' z2 in registers (HM >= n_kv, loops
 * unrolled so no array lands in local memory); the heads are combined in
 * order, as in sel_cross_kernel. Writes z3 into ws.z1. */
template <int HM>
__global__ void __launch_bounds__(256)
sel_cross_fast_kernel(const sfi_gpu_step_desc *__restrict__ d, sfi_gpu_sel_params prm,
                      sfi_gpu_sel_ws ws) {
    const int b = blockIdx.y, i = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    const sfi_gpu_req rq = d->req[b];
    const int n = rq.j_end - rq.j_begin;
    if (i >= n) return;
    const int cnt = min(4, n - i), H = d->n_kv;
    const size_t ld = d->max_J, base = (size_t)b * H * ld;
    /* t: z2 / T, then its exp; z2 is read again for the output (an L1/L2
     * hit) rather than kept: 32 fewer registers, twice the occupancy */
    float t[HM][4], mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, sum[4];
#pragma unroll
    for (int h = 0; h < HM; h++) {
        if (h >= H) break;
        ld4(ws.z2 + base + h * ld, i, cnt, true, t[h]);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            t[h][k] = prm.T == 1.0f ? t[h][k] : __fdiv_rn(t[h][k], prm.T);
            mx[k] = (h == 0 || t[h][k] > mx[k]) ? t[h][k] : mx[k];
        }
    }
#pragma unroll
    for (int k = 0; k < 4; k++) sum[k] = 0.f;
#pragma unroll
    for (int h = 0; h < HM; h++) {
        if (h >= H) break;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float e = fexp_s(t[h][k] - mx[k], 1.0f);
            sum[k] = __fadd_rn(sum[k], e);
            t[h][k] = e;
        }
    }
#pragma unroll
    for (int h = 0; h < HM; h++) {
        if (h >= H) break;
        float z[4], o[4];
        ld4(ws.z2 + base + h * ld, i, cnt, true, z);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float rh = __fdiv_rn(t[h][k], sum[k]);
            rh = rh > prm.eps ? rh : prm.eps;
            o[k] = __fadd_rn(z[k], __fmul_rn(prm.alpha_cross, flog(rh)));
        }
        st4(ws.z1 + base + h * ld, i, cnt, true, o);
    }
}

/* Order-preserving key: larger float -> larger unsigned; -0 and +0 equal
 * (the reference compares values, so they tie and the smaller index wins). */
__device__ __forceinline__ uint32_t fkey(float x) {
    uint32_t u = __float_as_uint(x);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Exclusive scan over the block of one int per thread (1024 threads). */
__device__ int block_excl_scan(int v, int *sh, int *total) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
    }
    __syncthreads();
    if (lane == 31) sh[w] = x;
    __syncthreads();
    if (w == 0) {
        int s = lane < nw ? sh[lane] : 0;
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, s, off);
            if (lane >= off) s += y;
        }
        sh[32 + lane] = s; /* inclusive over warps */
    }
    __syncthreads();
    const int before = (w > 0 ? sh[32 + w - 1] : 0) + x - v;
    *total = sh[32 + nw - 1];
    __syncthreads();
    return before;
}

/* Top-K, one row per CTA. Launch: grid (n_kv, batch), block 1024.
 * Thread t owns the contiguous slice [t*c, (t+1)*c) of the row, c =
 * ceil(n/1024) rounded up to 4; with c <= kTopkRegItems (rows up to 32K)
 * its keys (32-bit, order-preserving) stay in registers for every pass,
 * else each pass re-reads them (L2). Radix select from the top: the block
 * min and max keys give the common leading bits, which need no pass; then
 * 8-bit digits, a 256-bin shared histogram per pass over the keys still
 * matching the prefix, and warp 0 finds the bin where the count from the
 * top reaches `need`. Result: the K-th largest key T and how many keys
 * equal to T are taken (need). Ordered compaction: per-thread counts of
 * keys > T and == T, two block scans, and key j goes to slot (#greater
 * before j) + min(#equal before j, need) when taken: equal keys are taken
 * smallest index first and the output is ascending, deterministically. */
constexpr int kTopkRegItems = 32;

template <bool REG>
__global__ void __launch_bounds__(kTopkThreads)
topk_kernel(const sfi_gpu_step_desc *__restrict__ d, const float *__restrict__ scores, int ld,
            int32_t *__restrict__ out) {
    __shared__ int hist[256];
    __shared__ int sh[64];
    __shared__ uint32_t s_prefix, s_kmin, s_kmax;
    __shared__ int s_need;
    const int kvh = blockIdx.x, b = blockIdx.y;
    const sfi_gpu_req rq = d->req[b];
    const int n = rq.j_end - rq.j_begin;
    if (n <= 0) return;
    const int K = d->K;
    const int ob = (rq.flags & SFI_GPU_REQ_ALT) ? b + d->alt_rows : b;
    int32_t *o = out + ((size_t)ob * d->n_kv + kvh) * K;
    const float *x = scores + ((size_t)b * d->n_kv + kvh) * ld;
    if (n <= K) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = rq.j_begin + i;
        return;
    }
    const int c = ((n + (int)blockDim.x - 1) / (int)blockDim.x + 3) & ~3;
    /* idle threads (slice past the end) get an empty slice at 0 */
    const int a0 = (int)threadIdx.x * c < n ? (int)threadIdx.x * c : 0;
    const int a1 = (int)threadIdx.x * c < n ? min(n, a0 + c) : 0, cnt = a1 - a0;
    const bool vec = al16(x);
    uint32_t keys[REG ? kTopkRegItems : 1] = {};
    uint32_t kmin = 0xffffffffu, kmax = 0;
    if (REG) {
#pragma unroll
        for (int j = 0; j < kTopkRegItems; j += 4) {
            float v[4];
            ld4(x, a0 + j, max(0, min(4, cnt - j)), vec, v);
#pragma unroll
            for (int q = 0; q < 4; q++) keys[REG ? j + q : 0] = fkey(v[q]);
        }
    }
    /* REG: loops over all kTopkRegItems, fully unrolled (keys stay in
     * registers), guarded by j < cnt; else plain loops over cnt. */
#define FOR_KEYS(body)                                                               \
    if (REG) {                                                                       \
        _Pragma("unroll") for (int j = 0; j < kTopkRegItems; j++) if (j < cnt) {     \
            const uint32_t k = keys[REG ? j : 0];                                    \
            body                                                                     \
        }                                                                            \
    } else {                                                                         \
        for (int j = 0; j < cnt; j++) {                                              \
            const uint32_t k = fkey(x[a0 + j]);                                      \
            body                                                                     \
        }                                                                            \
    }
    FOR_KEYS(kmin = min(kmin, k); kmax = max(kmax, k);)
    /* block min / max */
    for (int off = 16; off > 0; off >>= 1) {
        kmin = min(kmin, (uint32_t)__shfl_xor_sync(0xffffffffu, kmin, off));
        kmax = max(kmax, (uint32_t)__shfl_xor_sync(0xffffffffu, kmax, off));
    }
    if (threadIdx.x == 0) { s_kmin = 0xffffffffu; s_kmax = 0; }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { atomicMin(&s_kmin, kmin); atomicMax(&s_kmax, kmax); }
    __syncthreads();
    kmin = s_kmin;
    kmax = s_kmax;
    const int cl = kmin == kmax ? 32 : __clz(kmin ^ kmax); /* common leading bits */
    uint32_t mask = cl == 0 ? 0u : (cl >= 32 ? 0xffffffffu : 0xffffffffu << (32 - cl));
    uint32_t prefix = kmin & mask;
    int need = K;
    for (int hi = 31 - cl; hi >= 0; hi -= 8) {
        const int lo = max(0, hi - 7);
        const uint32_t dmask = (1u << (hi - lo + 1)) - 1u;
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        FOR_KEYS(if ((k & mask) == prefix) atomicAdd(&hist[(k >> lo) & dmask], 1);)
        __syncthreads();
        if (threadIdx.x < 32) {
            /* find, from the top bin down, where the running count reaches
             * need: lane L owns bins 255-8L .. 248-8L; a shuffle scan of the
             * lanes' totals, then the first lane reaching need walks its 8 */
            const int lane = threadIdx.x;
            int cc = 0;
            for (int j = 0; j < 8; j++) cc += hist[255 - 8 * lane - j];
            int incl = cc;
            for (int off = 1; off < 32; off <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off) incl += y;
            }
            const unsigned hit = __ballot_sync(0xffffffffu, incl >= need);
            const int L = __ffs(hit) - 1; /* exists: the total count >= need */
            if (lane == L) {
                int acc = incl - cc, bin = 255 - 8 * lane;
                for (int j = 0; j < 7; j++, bin--) {
                    if (acc + hist[bin] >= need) break;
                    acc += hist[bin];
                }
                s_prefix = prefix | ((uint32_t)bin << lo);
                s_need = need - acc;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= dmask << lo;
        __syncthreads();
    }
    const uint32_t T = prefix;
    int gt = 0, eq = 0;
    FOR_KEYS(gt += k > T; eq += k == T;)
    int tot;
    int gt_before = block_excl_scan(gt, sh, &tot);
    int eq_before = block_excl_scan(eq, sh, &tot);
    FOR_KEYS(
        if (k > T) {
            o[gt_before + min(eq_before, need)] = rq.j_begin + a0 + j;
            gt_before++;
        } else if (k == T) {
            if (eq_before < need) o[gt_before + eq_before] = rq.j_begin + a0 + j;
            eq_before++;
        })
#undef FOR_KEYS
}

cudaError_t launch_topk(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                        const float *scores, int ld, int32_t *out, cudaStream_t st) {
    dim3 g(h->n_kv, h->batch);
    if (h->max_J <= kTopkThreads * kTopkRegItems)
        topk_kernel<true><<<g, kTopkThreads, 0, st>>>(d, scores, ld, out);
    else
        topk_kernel<false><<<g, kTopkThreads, 0, st>>>(d, scores, ld, out);
    return cudaGetLastError();
}

/* Reorg gather. Launch: grid (min(ceil(rows*W/(256*kReorgWords)),
 * kReorgMaxCtas), n_kv, batch), block 256, W = D*sizeof(T)/16
 * sixteen-byte words per row: a
 * thread copies kReorgWords words of K and the same words of V (word
 * index = (block*kReorgWords + j)*256 + thread, so each j is one
 * contiguous, coalesced sweep over whole rows). Row r < n_sink is
 * position r, else selected[r - n_sink]. */
constexpr int kReorgWords = 4;
/* CTAs per (request, KV head): 32 puts all of a request's sink + 2048
 * selected rows in flight in one pass (33 CTAs' worth). Beside a slow
 * step's attention, which keeps its KV tiles' bytes in flight, HBM's
 * bandwidth is shared about as the bytes in flight are, and the reorg,
 * on the side stream, is on the slow step's critical path: with 8 CTAs
 * (four passes) a 32K slow step's layer waited on it. H100, Qwen3-0.6B
 * batch 16, kjv-32k replayed: 8 CTAs slow steps 5.252 ms, 16 5.129, 32
 * 5.131, 64 5.133, 4 5.720 (32K decode 4371.6 -> 4439.1 tok/s with 32); 8K
 * 5166.9 -> 5253.4, 16K 4778.6 -> 4783.4 tok/s. */
constexpr int kReorgMaxCtas = 32;
/* At most 64 registers (launch bounds of 4 CTAs an SM; 67 without): a
 * reorg CTA then fits beside two of a slow step's attention CTAs, which
 * leave 16K of an SM's 64K registers, instead of waiting for one of them
 * to end. H100, Qwen3-0.6B batch 16 kjv-32k: slow steps 5.114 / 5.109
 * against 5.139 / 5.171 ms (decode 4445.7 / 4450.4 against 4433.2 /
 * 4415.9 tok/s); 16K 4787.5 against 4785.5, 8K 5266.4 against 5259.8. */
__global__ void __launch_bounds__(256, 4) reorg_kernel(const sfi_gpu_step_desc *__restrict__ d, int row_words,
                             const uint4 *__restrict__ kp, const uint4 *__restrict__ vp,
                             const int32_t *__restrict__ sel, uint4 *__restrict__ ck,
                             uint4 *__restrict__ cv, int32_t *__restrict__ comp_pos) {
    const int kvh = blockIdx.y, b = blockIdx.z;
    const sfi_gpu_req rq = d->req[b];
    const int nJ = rq.j_end - rq.j_begin;
    const int kout = nJ <= 0 ? 0 : min(d->K, nJ);
    const int rows = d->n_sink + kout;
    const int cb = (rq.flags & SFI_GPU_REQ_ALT) ? b + d->alt_rows : b; /* selected / compact row */
    /* a grid-stride sweep: a request with few rows (a fast step's sink
     * refresh) leaves after one pass instead of idling many CTAs */
    for (int base = blockIdx.x * kReorgWords * blockDim.x; base < rows * row_words;
         base += gridDim.x * kReorgWords * blockDim.x) {
    uint4 kx[kReorgWords], vx[kReorgWords];
    size_t dst[kReorgWords];
    bool ok[kReorgWords];
#pragma unroll
    for (int j = 0; j < kReorgWords; j++) { /* all loads first: 2*kReorgWords in flight */
        const int t = base + j * blockDim.x + threadIdx.x;
        const int r = t / row_words, w = t % row_words;
        ok[j] = r < rows;
        if (!ok[j]) continue;
        const int pos =
            r < d->n_sink ? r : sel[((size_t)cb * d->n_kv + kvh) * d->K + (r - d->n_sink)];
        const int blk = d->block_table[(size_t)b * d->max_blocks + pos / d->page];
        const size_t src = (((size_t)blk * d->n_kv + kvh) * d->page + pos % d->page) * row_words + w;
        dst[j] = (((size_t)cb * d->n_kv + kvh) * d->compact_cap + r) * row_words + w;
        kx[j] = __ldg(kp + src);
        vx[j] = __ldg(vp + src);
        if (comp_pos && w == 0) comp_pos[((size_t)cb * d->n_kv + kvh) * d->compact_cap + r] = pos;
    }
#pragma unroll
    for (int j = 0; j < kReorgWords; j++)
        if (ok[j]) { ck[dst[j]] = kx[j]; cv[dst[j]] = vx[j]; }
    }
}

/* Launches sel_cluster_kernel<NW> with the cluster shape as a launch
 * attribute (clusters of more than 8 CTAs need the non-portable opt-in). */
template <int NW>
cudaError_t launch_cluster(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                           const sfi_gpu_sel_params *prm, const float *logits,
                           const float *key_norms, const sfi_gpu_sel_ws *ws, float *s_out,
                           cudaStream_t st) {
    if (kClC > 8) {
        /* per device, hence per host thread (--tp: one thread per GPU) */
        static thread_local bool opted = false;
        if (!opted) {
            cudaError_t e = cudaFuncSetAttribute(sel_cluster_kernel<NW>,
                                                 cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
            if (e != cudaSuccess) return e;
            opted = true;
        }
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(h->n_kv * kClC, h->batch);
    cfg.blockDim = dim3(kClT);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = kClC;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, sel_cluster_kernel<NW>, d, *prm, logits, key_norms, *ws, s_out);
}

/* Under tensor parallelism only the requests whose Selector runs (J not
 * empty) send scores: their slot is their rank among those requests, in
 * batch order, the same on every rank (it depends on tokens only). */
__device__ __forceinline__ int sel_slot(const sfi_gpu_step_desc *__restrict__ d, int b) {
    int s = 0;
    for (int i = 0; i < b; i++) s += d->req[i].j_end > d->req[i].j_begin;
    return s;
}

/* The z2 rows of the requests with a slot below n_slots, packed slot by
 * slot into send [n_slots][n_kv][max_J] for the all-gather. Launch: grid
 * (ceil(max_J/256), n_kv, batch), block 256. */
__global__ void sel_pack_kernel(const sfi_gpu_step_desc *__restrict__ d, const float *__restrict__ z2,
                                int n_slots, float *__restrict__ send) {
    const int kvh = blockIdx.y, b = blockIdx.z, i = blockIdx.x * blockDim.x + threadIdx.x;
    const sfi_gpu_req rq = d->req[b];
    if (i >= rq.j_end - rq.j_begin) return;
    const int slot = sel_slot(d, b);
    if (slot >= n_slots) return;
    const size_t ld = d->max_J;
    send[((size_t)slot * d->n_kv + kvh) * ld + i] = z2[((size_t)b * d->n_kv + kvh) * ld + i];
}

/* Step 8 under tensor parallelism (sfi-gpu run --tp): this rank's heads
 * are KV heads rank*n_kv .. rank*n_kv + n_kv - 1 of the layer (n_kv =
 * d->n_kv, the rank's share), and the softmax over heads at position j
 * takes every rank's z2, all-gathered into z_all [n_ranks][n_slots][n_kv]
 * [max_J] (rank 0 first; request b's rows at its slot, sel_slot). The heads are combined in the global order with
 * the formulas of sel_cross_kernel (EXACT) or sel_cross_fast_kernel, so
 * given the same z2 the result has the bits of the single-GPU Selector.
 * Launch: grid (ceil(max_J/256), batch), block 256, one position per
 * thread; writes z3 of this rank's heads into ws.z1. */
template <bool EXACT>
__global__ void sel_cross_tp_kernel(const sfi_gpu_step_desc *__restrict__ d, sfi_gpu_sel_params prm,
                                    const float *__restrict__ z_all, int n_slots, int n_ranks,
                                    int rank, sfi_gpu_sel_ws ws) {
    const int b = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    const sfi_gpu_req rq = d->req[b];
    const int n = rq.j_end - rq.j_begin;
    if (i >= n) return;
    const int slot = sel_slot(d, b);
    if (slot >= n_slots) return; /* the caller sized n_slots too small */
    const int Hl = d->n_kv, H = Hl * n_ranks, B = n_slots;
    const size_t ld = d->max_J;
    float t[16];
    float mx = -INFINITY;
    for (int h = 0; h < H; h++) {
        const int r = h / Hl, hl = h % Hl;
        const float z = z_all[(((size_t)r * B + slot) * Hl + hl) * ld + i];
        t[h] = EXACT ? __fdiv_rn(z, prm.T) : (prm.T == 1.0f ? z : __fdiv_rn(z, prm.T));
        mx = (h == 0 || t[h] > mx) ? t[h] : mx;
    }
    float sum = 0.f;
    for (int h = 0; h < H; h++) {
        t[h] = EXACT ? sfi_dev_expf(__fsub_rn(t[h], mx)) : fexp_s(t[h] - mx, 1.0f);
        sum = __fadd_rn(sum, t[h]);
    }
    for (int hl = 0; hl < Hl; hl++) {
        const int h = rank * Hl + hl;
        const size_t o = ((size_t)b * Hl + hl) * ld + i;
        float rh = __fdiv_rn(t[h], sum);
        rh = rh > prm.eps ? rh : prm.eps;
        ws.z1[o] = __fadd_rn(ws.z2[o], __fmul_rn(prm.alpha_cross, EXACT ? sfi_dev_logf(rh) : flog(rh)));
    }
}

} // namespace

extern "C" {

size_t sfi_gpu_sel_ws_bytes(int batch, int n_kv, int max_J) {
    return ((size_t)4 * batch * n_kv * max_J + (size_t)batch * n_kv) * sizeof(float);
}

void sfi_gpu_sel_ws_carve(sfi_gpu_sel_ws *ws, void *base, int batch, int n_kv, int max_J) {
    const size_t one = (size_t)batch * n_kv * max_J;
    ws->f = (float *)base;
    ws->r = ws->f + one;
    ws->z1 = ws->r + one;
    ws->z2 = ws->z1 + one;
    ws->lambda = ws->z2 + one;
}

cudaError_t sfi_gpu_topk(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, const float *scores,
                         int ld, int32_t *out, cudaStream_t st) {
    return launch_topk(h, d, scores, ld, out, st);
}

cudaError_t sfi_gpu_selector_local(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                                   const sfi_gpu_sel_params *prm, const float *logits,
                                   const float *key_norms, const sfi_gpu_sel_ws *ws, float *s_out,
                                   int exact, cudaStream_t st) {
    if (h->n_kv > 16 || h->n_heads % h->n_kv || h->n_heads / h->n_kv > SFI_GPU_MAX_GROUP ||
        h->n_win > kMaxWin)
        return cudaErrorInvalidValue;
    dim3 g(h->n_kv, h->batch);
    const int G = h->n_heads / h->n_kv;
    cudaError_t e = cudaSuccess;
    /* experiment: SFI_GPU_SEL_CLUSTER=0 keeps the one-CTA kernel (a
     * cluster needs 8 free SMs of one GPC at once, which a side stream
     * beside the main stream's GEMMs may wait for); read once per thread */
    static thread_local int no_cluster = -1;
    if (no_cluster < 0) {
        const char *env = getenv("SFI_GPU_SEL_CLUSTER");
        no_cluster = env && !strcmp(env, "0");
    }
    if (exact)
        sel_main_kernel<true><<<g, kSelThreads, 0, st>>>(d, *prm, logits, key_norms, *ws, s_out);
    else if (h->n_win > 0 && h->n_win != G) /* a prefill window: the general kernel */
        sel_main_kernel<false><<<g, kSelThreads, 0, st>>>(d, *prm, logits, key_norms, *ws, s_out);
    else if (prm->nms_radius > kClHalo || prm->nms_radius < 0 || no_cluster)
        sel_fast_kernel<<<g, kSelThreads, 0, st>>>(d, *prm, logits, key_norms, *ws, s_out);
    else if (G == 1 && h->max_J <= ClShape<1>::cap)
        e = launch_cluster<1>(h, d, prm, logits, key_norms, ws, s_out, st);
    else if (G == 2 && h->max_J <= ClShape<2>::cap)
        e = launch_cluster<2>(h, d, prm, logits, key_norms, ws, s_out, st);
    else if (G == 4 && h->max_J <= ClShape<4>::cap)
        e = launch_cluster<4>(h, d, prm, logits, key_norms, ws, s_out, st);
    else if (G == 8 && h->max_J <= ClShape<8>::cap)
        e = launch_cluster<8>(h, d, prm, logits, key_norms, ws, s_out, st);
    else if (G == 16 && h->max_J <= ClShape<16>::cap)
        e = launch_cluster<16>(h, d, prm, logits, key_norms, ws, s_out, st);
    else
        sel_fast_kernel<<<g, kSelThreads, 0, st>>>(d, *prm, logits, key_norms, *ws, s_out);
    if (e != cudaSuccess) return e;
    return cudaGetLastError();
}

cudaError_t sfi_gpu_selector_pack(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                                  const sfi_gpu_sel_ws *ws, int n_slots, float *send,
                                  cudaStream_t st) {
    if (n_slots < 1 || n_slots > h->batch) return cudaErrorInvalidValue;
    sel_pack_kernel<<<dim3((h->max_J + 255) / 256, h->n_kv, h->batch), 256, 0, st>>>(d, ws->z2, n_slots,
                                                                                    send);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_selector_cross_tp(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                                      const sfi_gpu_sel_params *prm, const float *z_all,
                                      int n_slots, int n_ranks, int rank, const sfi_gpu_sel_ws *ws,
                                      int32_t *selected, int exact, cudaStream_t st) {
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks || h->n_kv * n_ranks > 16 || n_slots < 1 ||
        n_slots > h->batch)
        return cudaErrorInvalidValue;
    const dim3 g((h->max_J + 255) / 256, h->batch);
    if (exact)
        sel_cross_tp_kernel<true><<<g, 256, 0, st>>>(d, *prm, z_all, n_slots, n_ranks, rank, *ws);
    else
        sel_cross_tp_kernel<false><<<g, 256, 0, st>>>(d, *prm, z_all, n_slots, n_ranks, rank, *ws);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return launch_topk(h, d, ws->z1, h->max_J, selected, st);
}

cudaError_t sfi_gpu_selector(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                             const sfi_gpu_sel_params *prm, const float *logits, const float *key_norms,
                             const sfi_gpu_sel_ws *ws, float *s_out, int32_t *selected, int exact,
                             cudaStream_t st) {
    cudaError_t e = sfi_gpu_selector_local(h, d, prm, logits, key_norms, ws, s_out, exact, st);
    if (e != cudaSuccess) return e;
    if (exact)
        sel_cross_kernel<true><<<dim3((h->max_J + 255) / 256, h->batch), 256, 0, st>>>(d, *prm, *ws);
    else if (h->n_kv <= 8)
        sel_cross_fast_kernel<8><<<dim3((h->max_J + 1023) / 1024, h->batch), 256, 0, st>>>(d, *prm, *ws);
    else
        sel_cross_fast_kernel<16><<<dim3((h->max_J + 1023) / 1024, h->batch), 256, 0, st>>>(d, *prm, *ws);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return launch_topk(h, d, ws->z1, h->max_J, selected, st);
}

cudaError_t sfi_gpu_reorg(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                          const void *k_pool, const void *v_pool, const int32_t *selected, void *ck,
                          void *cv, int32_t *comp_pos, cudaStream_t st) {
    const int esz = dtype == SFI_GPU_BF16 ? 2 : 4;
    const int row_words = h->head_dim * esz / 16;
    const int rows = h->n_sink + h->K;
    int gx = (rows * row_words + 256 * kReorgWords - 1) / (256 * kReorgWords);
    if (gx > kReorgMaxCtas) gx = kReorgMaxCtas;
    dim3 g(gx, h->n_kv, h->batch);
    reorg_kernel<<<g, 256, 0, st>>>(d, row_words, (const uint4 *)k_pool, (const uint4 *)v_pool,
                                    selected, (uint4 *)ck, (uint4 *)cv, comp_pos);
    return cudaGetLastError();
}

} // extern "C"
