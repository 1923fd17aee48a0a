/* GPU-resident Selector (method.md section 4, steps 1-9), deterministic
 * Top-K by radix select, and the reorg gather into the compact buffer.
 * Layouts: see sfi_gpu.h. Everything stays on the device: the host only
 * launches kernels (no copies, no synchronisation). */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "sfi_gpu.h"
#include "sfi_gpu_math.cuh"

namespace {

constexpr int kSelThreads = 1024;
constexpr int kTopkThreads = 1024;

/* Block-wide reductions over 1024 threads (warp shuffles, then warp 0).
 * The shuffle tree is fixed, so results are deterministic run to run. */
__device__ float block_sum(float v, float *sh) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.f;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

__device__ float block_max(float v, float *sh) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : -INFINITY;
        for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    return sh[32];
}

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
    const int kvh = blockIdx.x, b = blockIdx.y;
    const sfi_gpu_req rq = d->req[b];
    const int j0 = rq.j_begin, n = rq.j_end - rq.j_begin;
    if (n <= 0) return;
    const int G = d->n_heads / d->n_kv, nwin = G;
    const size_t row = ((size_t)b * d->n_kv + kvh) * d->max_J;
    float *f = ws.f + row, *r = ws.r + row, *z1 = ws.z1 + row, *z2 = ws.z2 + row;
    const float *nrm = norms + ((size_t)b * d->n_kv + kvh) * d->ld_logits + j0;

    /* step 1: softmax statistics of each window query over J */
    float mw[8], sw[8];
    for (int w = 0; w < nwin; w++) {
        const float *lw = logits + ((size_t)b * d->n_heads + kvh * G + w) * d->ld_logits + j0;
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, lw[i]);
        mx = block_max(mx, sh); /* a max of finite values: any order */
        /* e = exp(l - max) into z1 (scratch), then its sum */
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            z1[i] = sfi_dev_expf(__fsub_rn(lw[i], mx));
        mw[w] = mx;
        sw[w] = row_sum<EXACT>(z1, n, sh);
        __syncthreads();
    }
    /* steps 2-4: g = (mean of p^a)^(1/a) (f = p when n_win == 1), and the
     * unnormalised prior w */
    const float inv_alpha = __fdiv_rn(1.0f, prm.alpha);
    const float span = __fadd_rn((float)(n - 1), prm.eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float fu;
        if (nwin == 1) {
            const float *lw = logits + ((size_t)b * d->n_heads + kvh * G) * d->ld_logits + j0;
            fu = __fdiv_rn(sfi_dev_expf(__fsub_rn(lw[i], mw[0])), sw[0]);
        } else {
            float mu = 0.f;
            for (int w = 0; w < nwin; w++) {
                const float *lw =
                    logits + ((size_t)b * d->n_heads + kvh * G + w) * d->ld_logits + j0;
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

/* Step 8, cross-head exclusivity. Launch: grid (ceil(max_J/256), batch),
 * block 256; thread = one position j, loops over the n_kv heads in order
 * (softmax over heads: max, exp, ascending sum, divide, as sfi_softmax),
 * writes z3 into ws.z1. */
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
        t[h] = sfi_dev_expf(__fsub_rn(t[h], mx));
        sum = __fadd_rn(sum, t[h]);
    }
    for (int h = 0; h < H; h++) {
        const size_t o = ((size_t)b * H + h) * d->max_J + i;
        float rh = __fdiv_rn(t[h], sum);
        rh = rh > prm.eps ? rh : prm.eps;
        ws.z1[o] = __fadd_rn(ws.z2[o], __fmul_rn(prm.alpha_cross, sfi_dev_logf(rh)));
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
 * Radix select on 32-bit order-preserving keys, 8 bits per pass from the
 * top (4 passes of a 256-bin shared histogram over the elements still
 * matching the prefix) finds the K-th largest key T and how many of the
 * elements equal to T are taken (need). Then an ordered compaction: thread
 * t owns the contiguous slice [t*c, (t+1)*c), counts keys > T and == T,
 * two block scans give each slice its output offset, and an element at
 * index j goes to slot (#greater before j) + min(#equal before j, need)
 * when taken. Equal keys are therefore taken smallest index first and the
 * output is in ascending index order, deterministic by construction. */
__global__ void __launch_bounds__(kTopkThreads)
topk_kernel(const sfi_gpu_step_desc *__restrict__ d, const float *__restrict__ scores, int ld,
            int32_t *__restrict__ out) {
    __shared__ int hist[256];
    __shared__ int sh[64];
    __shared__ uint32_t s_prefix;
    __shared__ int s_need;
    const int kvh = blockIdx.x, b = blockIdx.y;
    const sfi_gpu_req rq = d->req[b];
    const int n = rq.j_end - rq.j_begin;
    if (n <= 0) return;
    const int K = d->K;
    int32_t *o = out + ((size_t)b * d->n_kv + kvh) * K;
    const float *x = scores + ((size_t)b * d->n_kv + kvh) * ld;
    if (n <= K) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = rq.j_begin + i;
        return;
    }
    uint32_t prefix = 0, mask = 0;
    int need = K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t k = fkey(x[i]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int acc = 0, bin = 255;
            for (; bin > 0; bin--) {
                if (acc + hist[bin] >= need) break;
                acc += hist[bin];
            }
            s_prefix = prefix | ((uint32_t)bin << shift);
            s_need = need - acc;
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 255u << shift;
        __syncthreads();
    }
    const uint32_t T = prefix;
    const int c = (n + blockDim.x - 1) / blockDim.x;
    const int a0 = min(n, (int)threadIdx.x * c), a1 = min(n, a0 + c);
    int gt = 0, eq = 0;
    for (int i = a0; i < a1; i++) {
        const uint32_t k = fkey(x[i]);
        gt += k > T;
        eq += k == T;
    }
    int tot;
    int gt_before = block_excl_scan(gt, sh, &tot);
    int eq_before = block_excl_scan(eq, sh, &tot);
    for (int i = a0; i < a1; i++) {
        const uint32_t k = fkey(x[i]);
        if (k > T) {
            o[gt_before + min(eq_before, need)] = rq.j_begin + i;
            gt_before++;
        } else if (k == T) {
            if (eq_before < need) o[gt_before + eq_before] = rq.j_begin + i;
            eq_before++;
        }
    }
}

/* Reorg gather. Launch: grid (ceil(rows*W/256), n_kv, batch), block 256,
 * W = D*sizeof(T)/16 sixteen-byte words per row: one thread copies one
 * word of K and the same word of V, so a warp reads and writes whole rows
 * contiguously. Row r < n_sink is position r, else selected[r - n_sink]. */
__global__ void reorg_kernel(const sfi_gpu_step_desc *__restrict__ d, int row_words,
                             const uint4 *__restrict__ kp, const uint4 *__restrict__ vp,
                             const int32_t *__restrict__ sel, uint4 *__restrict__ ck,
                             uint4 *__restrict__ cv, int32_t *__restrict__ comp_pos) {
    const int kvh = blockIdx.y, b = blockIdx.z;
    const sfi_gpu_req rq = d->req[b];
    const int nJ = rq.j_end - rq.j_begin;
    const int kout = nJ <= 0 ? 0 : min(d->K, nJ);
    const int rows = d->n_sink + kout;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int r = t / row_words, w = t % row_words;
    if (r >= rows) return;
    const int pos = r < d->n_sink ? r : sel[((size_t)b * d->n_kv + kvh) * d->K + (r - d->n_sink)];
    const int blk = d->block_table[(size_t)b * d->max_blocks + pos / d->page];
    const size_t src = (((size_t)blk * d->n_kv + kvh) * d->page + pos % d->page) * row_words + w;
    const size_t dst = (((size_t)b * d->n_kv + kvh) * d->compact_cap + r) * row_words + w;
    ck[dst] = __ldg(kp + src);
    cv[dst] = __ldg(vp + src);
    if (comp_pos && w == 0) comp_pos[((size_t)b * d->n_kv + kvh) * d->compact_cap + r] = pos;
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

int sfi_gpu_topk(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, const float *scores,
                 int ld, int32_t *out, cudaStream_t st) {
    topk_kernel<<<dim3(h->n_kv, h->batch), kTopkThreads, 0, st>>>(d, scores, ld, out);
    return (int)cudaGetLastError();
}

int sfi_gpu_selector(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                     const sfi_gpu_sel_params *prm, const float *logits, const float *key_norms,
                     const sfi_gpu_sel_ws *ws, float *s_out, int32_t *selected, int exact,
                     cudaStream_t st) {
    if (h->n_kv > 16 || h->n_heads / h->n_kv > 8) return (int)cudaErrorInvalidValue;
    dim3 g(h->n_kv, h->batch);
    if (exact)
        sel_main_kernel<true><<<g, kSelThreads, 0, st>>>(d, *prm, logits, key_norms, *ws, s_out);
    else
        sel_main_kernel<false><<<g, kSelThreads, 0, st>>>(d, *prm, logits, key_norms, *ws, s_out);
    sel_cross_kernel<<<dim3((h->max_J + 255) / 256, h->batch), 256, 0, st>>>(d, *prm, *ws);
    topk_kernel<<<g, kTopkThreads, 0, st>>>(d, ws->z1, h->max_J, selected);
    return (int)cudaGetLastError();
}

int sfi_gpu_reorg(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                  const void *k_pool, const void *v_pool, const int32_t *selected, void *ck,
                  void *cv, int32_t *comp_pos, cudaStream_t st) {
    const int esz = dtype == SFI_GPU_BF16 ? 2 : 4;
    const int row_words = h->head_dim * esz / 16;
    const int rows = h->n_sink + h->K;
    dim3 g((rows * row_words + 255) / 256, h->n_kv, h->batch);
    reorg_kernel<<<g, 256, 0, st>>>(d, row_words, (const uint4 *)k_pool, (const uint4 *)v_pool,
                                    selected, (uint4 *)ck, (uint4 *)cv, comp_pos);
    return (int)cudaGetLastError();
}

} // extern "C"
