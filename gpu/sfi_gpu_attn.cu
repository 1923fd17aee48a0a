/* Decode attention kernels: dense over the paged cache (flash-decoding
 * split, logits exposed for slow steps), two-segment sparse for fast steps,
 * the bit-exact f32 variants for the checker, and key norms.
 * Layouts: see sfi_gpu.h. */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include "sfi_gpu.h"
#include "sfi_gpu_math.cuh"

namespace {

constexpr float kLog2e = 1.4426950408889634f;
/* Running-max sentinel: finite so that exp2(m_old - m_new) never sees
 * (-inf) - (-inf); real scores are far above it. */
constexpr float kNegBig = -1e30f;
constexpr int kWarps = 8;
constexpr int kUnroll = 4;

/* 16 bytes of K or V as floats. */
template <typename T> struct Row16;
template <> struct Row16<float> {
    static constexpr int N = 4;
    __device__ static void load(const float *p, float *x) {
        float4 v = __ldg(reinterpret_cast<const float4 *>(p));
        x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    }
};
template <> struct Row16<__nv_bfloat16> {
    static constexpr int N = 8;
    __device__ static void load(const __nv_bfloat16 *p, float *x) {
        uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
        uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[2 * i] = __uint_as_float(w[i] << 16);
            x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};

/* Address of row r of (b, kvh): dense rows are positions; sparse rows are
 * compact rows 0..n_compact-1 then the recent window in the paged cache. */
template <typename T>
__device__ __forceinline__ const T *row_ptr(const sfi_gpu_step_desc *d, const T *pool,
                                            const T *comp, int b, int kvh, int r,
                                            int sparse, int n_compact, int recent_begin,
                                            int *pos_out) {
    const int D = d->head_dim;
    int pos = r;
    if (sparse) {
        if (r < n_compact) {
            *pos_out = -1;
            return comp + (((size_t)b * d->n_kv + kvh) * d->compact_cap + r) * D;
        }
        pos = recent_begin + (r - n_compact);
    }
    *pos_out = pos;
    int blk = d->block_table[(size_t)b * d->max_blocks + pos / d->page];
    return pool + (((size_t)blk * d->n_kv + kvh) * d->page + pos % d->page) * D;
}

/* Split kernel.
 * Launch: grid (n_splits, n_kv, batch), block 256 = 8 warps. A CTA owns
 * rows [split*chunk, (split+1)*chunk) of one (request, KV head) and all G
 * query heads of that group, so K/V are read from HBM once per group.
 * Inside a warp, LPR = D / (16 B / sizeof(T)) lanes share one row (each
 * lane loads 16 contiguous bytes: a row is one coalesced segment), and the
 * warp covers RPW = 32 / LPR rows at a time; kUnroll row batches of K and V
 * are in flight per warp. Each lane keeps an online softmax (max, sum,
 * acc of its 16-byte slice) per head; at the end the row groups merge by
 * shuffles, the warps through shared memory, and the CTA writes one
 * partial (max, sum, acc[D]) per head to part_ml/part_acc at
 * [b][h][split]. Rows past the request's end are skipped; CTAs with no row
 * exit (the combine kernel knows how many splits each request has). */
template <typename T, int D, int G>
__global__ void __launch_bounds__(kWarps * 32)
attn_split_kernel(const sfi_gpu_step_desc *__restrict__ d, const float *__restrict__ q,
                  const T *__restrict__ kp, const T *__restrict__ vp,
                  const T *__restrict__ ck, const T *__restrict__ cv, int sparse, int chunk,
                  float *__restrict__ logits, float *__restrict__ part_ml,
                  float *__restrict__ part_acc) {
    constexpr int VEC = Row16<T>::N;
    constexpr int LPR = D / VEC;
    constexpr int RPW = 32 / LPR;
    constexpr int NSUB = kWarps * RPW;
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const sfi_gpu_req rq = d->req[b];
    const int n_compact = sparse ? rq.n_compact : 0;
    const int n_rows = sparse ? n_compact + (rq.ctx_len - rq.recent_begin) : rq.ctx_len;
    const int start = split * chunk;
    if (start >= n_rows) return;
    const int end = min(n_rows, start + chunk);
    const int H = d->n_heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rg = lane / LPR, li = lane % LPR;
    const int sub = warp * RPW + rg;
    const float scale = rsqrtf((float)D);

    float qr[G][VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qp = q + ((size_t)b * H + kvh * G + g) * D + li * VEC;
#pragma unroll
        for (int i = 0; i < VEC; i++) qr[g][i] = qp[i];
    }
    float m[G], l[G], acc[G][VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = kNegBig; l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; i++) acc[g][i] = 0.f;
    }

    for (int base = start; base < end; base += kUnroll * NSUB) {
        float kx[kUnroll][VEC], vx[kUnroll][VEC];
        int pos[kUnroll];
        bool ok[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int r = base + u * NSUB + sub;
            ok[u] = r < end;
            pos[u] = -1;
            if (ok[u]) {
                const T *kr = row_ptr<T>(d, kp, ck, b, kvh, r, sparse, n_compact,
                                         rq.recent_begin, &pos[u]);
                const T *vr = row_ptr<T>(d, vp, cv, b, kvh, r, sparse, n_compact,
                                         rq.recent_begin, &pos[u]);
                Row16<T>::load(kr + li * VEC, kx[u]);
                Row16<T>::load(vr + li * VEC, vx[u]);
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++) { kx[u][i] = 0.f; vx[u][i] = 0.f; }
            }
        }
        float s[kUnroll][G];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
#pragma unroll
            for (int g = 0; g < G; g++) {
                float a = 0.f;
#pragma unroll
                for (int i = 0; i < VEC; i++) a = fmaf(qr[g][i], kx[u][i], a);
#pragma unroll
                for (int off = LPR / 2; off > 0; off >>= 1)
                    a += __shfl_xor_sync(0xffffffffu, a, off);
                s[u][g] = ok[u] ? a * scale : -INFINITY;
            }
            if (logits && ok[u] && li < G) {
                /* lane li of the row group writes head li's logit */
#pragma unroll
                for (int g = 0; g < G; g++)
                    if (g == li)
                        logits[((size_t)b * H + kvh * G + g) * d->ld_logits + pos[u]] = s[u][g];
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) mx = fmaxf(mx, s[u][g]);
            const float corr = exp2f((m[g] - mx) * kLog2e);
            m[g] = mx;
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < VEC; i++) acc[g][i] *= corr;
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                const float p = exp2f((s[u][g] - mx) * kLog2e);
                l[g] += p;
#pragma unroll
                for (int i = 0; i < VEC; i++) acc[g][i] = fmaf(p, vx[u][i], acc[g][i]);
            }
        }
    }

    /* merge the RPW row groups of the warp (lanes li, li+LPR, ...) */
#pragma unroll
    for (int off = LPR; off < 32; off <<= 1) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], off);
            const float lo = __shfl_xor_sync(0xffffffffu, l[g], off);
            const float mx = fmaxf(m[g], mo);
            const float a = exp2f((m[g] - mx) * kLog2e), c = exp2f((mo - mx) * kLog2e);
            l[g] = l[g] * a + lo * c;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], off);
                acc[g][i] = acc[g][i] * a + ao * c;
            }
            m[g] = mx;
        }
    }
    __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
    __shared__ float sm_acc[kWarps][G][D];
    if (rg == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (li == 0) { sm_m[warp][g] = m[g]; sm_l[warp][g] = l[g]; }
#pragma unroll
            for (int i = 0; i < VEC; i++) sm_acc[warp][g][li * VEC + i] = acc[g][i];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
        const int g = idx / D, dd = idx % D;
        float mx = kNegBig;
        for (int w = 0; w < kWarps; w++) mx = fmaxf(mx, sm_m[w][g]);
        float L = 0.f, A = 0.f;
        for (int w = 0; w < kWarps; w++) {
            const float c = exp2f((sm_m[w][g] - mx) * kLog2e);
            L += sm_l[w][g] * c;
            A += sm_acc[w][g][dd] * c;
        }
        const size_t ph = ((size_t)b * H + kvh * G + g) * SFI_GPU_MAX_SPLITS + split;
        part_acc[ph * D + dd] = A;
        if (dd == 0) { part_ml[ph * 2] = mx; part_ml[ph * 2 + 1] = L; }
    }
}

/* Combine kernel. Launch: grid (n_heads, batch), block D threads; thread dd
 * merges output dimension dd over the request's splits (ascending). */
__global__ void attn_combine_kernel(const sfi_gpu_step_desc *__restrict__ d, int sparse,
                                    int chunk, const float *__restrict__ part_ml,
                                    const float *__restrict__ part_acc, float *__restrict__ out) {
    const int h = blockIdx.x, b = blockIdx.y, dd = threadIdx.x, D = d->head_dim;
    const sfi_gpu_req rq = d->req[b];
    const int n_rows = sparse ? rq.n_compact + (rq.ctx_len - rq.recent_begin) : rq.ctx_len;
    const int ns = (n_rows + chunk - 1) / chunk;
    const size_t ph = ((size_t)b * d->n_heads + h) * SFI_GPU_MAX_SPLITS;
    float mx = kNegBig;
    for (int s = 0; s < ns; s++) mx = fmaxf(mx, part_ml[(ph + s) * 2]);
    float L = 0.f, A = 0.f;
    for (int s = 0; s < ns; s++) {
        const float c = exp2f((part_ml[(ph + s) * 2] - mx) * kLog2e);
        L += part_ml[(ph + s) * 2 + 1] * c;
        A += part_acc[(ph + s) * D + dd] * c;
    }
    out[((size_t)b * d->n_heads + h) * D + dd] = n_rows > 0 ? A / L : 0.f;
}

/* ---- bit-exact f32 path (checker) ----
 * The reference (ref/sfi_attention.c) computes, per query head: logits
 * l_j = sfi_dot(q, k_j) * scale with scale = 1/sfi_sqrtf(D), j ascending;
 * then sfi_softmax over the row (max, exp(x - max) with sfi_expf, sum in
 * ascending order, divide); then out[d] = sum_j p_j * v_j[d], j ascending,
 * one float accumulator. Each of those sums is one sequential loop in one
 * thread here, with FMA contraction off (__fmul_rn/__fadd_rn), so the bits
 * equal the host's. Launch: exact_logits grid (ceil(rows/128), n_heads,
 * batch) x 128 threads, one thread per row; exact_softmax grid (n_heads,
 * batch) x 32 threads (lane 0 does the sums, all lanes the elementwise
 * parts); exact_out grid (n_heads, batch) x D threads, thread dd sums its
 * dimension over rows. Row order: dense = positions ascending; sparse =
 * the reference's ascending position order, which the two-segment layout
 * keeps (sink, selected ascending, then the recent window; the checker's
 * cases keep selected below recent_begin as method.md section 2 requires). */
__device__ __forceinline__ const float *exact_row(const sfi_gpu_step_desc *d, const float *pool,
                                                  const float *comp, int b, int kvh, int r,
                                                  int sparse, int n_compact, int rb) {
    int pos;
    return row_ptr<float>(d, pool, comp, b, kvh, r, sparse, n_compact, rb, &pos);
}

__global__ void exact_logits_kernel(const sfi_gpu_step_desc *__restrict__ d,
                                    const float *__restrict__ q, const float *__restrict__ kp,
                                    const float *__restrict__ ck, int sparse,
                                    float *__restrict__ rowbuf, int ld, float *__restrict__ logits) {
    const int h = blockIdx.y, b = blockIdx.z, D = d->head_dim;
    const int G = d->n_heads / d->n_kv, kvh = h / G;
    const sfi_gpu_req rq = d->req[b];
    const int n_compact = sparse ? rq.n_compact : 0;
    const int n_rows = sparse ? n_compact + (rq.ctx_len - rq.recent_begin) : rq.ctx_len;
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows) return;
    const float *kr = exact_row(d, kp, ck, b, kvh, r, sparse, n_compact, rq.recent_begin);
    const float *qp = q + ((size_t)b * d->n_heads + h) * D;
    float acc = 0.f;
    for (int i = 0; i < D; i++) acc = __fadd_rn(acc, __fmul_rn(qp[i], kr[i]));
    const float sc = __fdiv_rn(1.0f, __fsqrt_rn((float)D));
    const float lg = __fmul_rn(acc, sc);
    rowbuf[((size_t)b * d->n_heads + h) * ld + r] = lg;
    if (logits && !sparse) logits[((size_t)b * d->n_heads + h) * d->ld_logits + r] = lg;
}

__global__ void exact_softmax_kernel(const sfi_gpu_step_desc *__restrict__ d, int sparse,
                                     float *__restrict__ rowbuf, int ld) {
    const int h = blockIdx.x, b = blockIdx.y;
    const sfi_gpu_req rq = d->req[b];
    const int n_rows = sparse ? rq.n_compact + (rq.ctx_len - rq.recent_begin) : rq.ctx_len;
    float *x = rowbuf + ((size_t)b * d->n_heads + h) * ld;
    __shared__ float sh;
    if (threadIdx.x == 0) {
        float mx = x[0];
        for (int i = 1; i < n_rows; i++) mx = x[i] > mx ? x[i] : mx;
        sh = mx;
    }
    __syncthreads();
    const float mx = sh;
    for (int i = threadIdx.x; i < n_rows; i += blockDim.x) x[i] = sfi_dev_expf(__fsub_rn(x[i], mx));
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (int i = 0; i < n_rows; i++) s = __fadd_rn(s, x[i]);
        sh = s;
    }
    __syncthreads();
    const float s = sh;
    for (int i = threadIdx.x; i < n_rows; i += blockDim.x) x[i] = __fdiv_rn(x[i], s);
}

__global__ void exact_out_kernel(const sfi_gpu_step_desc *__restrict__ d,
                                 const float *__restrict__ vp, const float *__restrict__ cv,
                                 int sparse, const float *__restrict__ rowbuf, int ld,
                                 float *__restrict__ out) {
    const int h = blockIdx.x, b = blockIdx.y, dd = threadIdx.x, D = d->head_dim;
    const int G = d->n_heads / d->n_kv, kvh = h / G;
    const sfi_gpu_req rq = d->req[b];
    const int n_compact = sparse ? rq.n_compact : 0;
    const int n_rows = sparse ? n_compact + (rq.ctx_len - rq.recent_begin) : rq.ctx_len;
    const float *p = rowbuf + ((size_t)b * d->n_heads + h) * ld;
    float acc = 0.f;
    for (int r = 0; r < n_rows; r++) {
        const float *vr = exact_row(d, vp, cv, b, kvh, r, sparse, n_compact, rq.recent_begin);
        acc = __fadd_rn(acc, __fmul_rn(p[r], vr[dd]));
    }
    out[((size_t)b * d->n_heads + h) * D + dd] = acc;
}

/* Key norms. Launch: grid (ceil(max_ctx/8), n_kv, batch), block 256: one
 * warp per position, lanes stride over D; sequential-per-lane sums then a
 * fixed shuffle tree (deterministic, not the reference's order: the
 * checker feeds the Selector the reference's norms). */
template <typename T>
__global__ void key_norms_kernel(const sfi_gpu_step_desc *__restrict__ d,
                                 const T *__restrict__ kp, float *__restrict__ norms) {
    const int kvh = blockIdx.y, b = blockIdx.z;
    const int pos = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (pos >= d->req[b].ctx_len) return;
    int p2;
    const T *kr = row_ptr<T>(d, kp, (const T *)nullptr, b, kvh, pos, 0, 0, 0, &p2);
    float a = 0.f;
    for (int i = lane; i < d->head_dim; i += 32) {
        const float x = (float)kr[i];
        a += x * x;
    }
    for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
    if (lane == 0) norms[((size_t)b * d->n_kv + kvh) * d->ld_logits + pos] = sqrtf(a);
}

template <typename T, int D, int G>
cudaError_t launch_split(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, const float *q,
                         const void *kp, const void *vp, const void *ck, const void *cv,
                         int sparse, int chunk, int n_splits, float *logits,
                         const sfi_gpu_attn_ws *ws, cudaStream_t st) {
    dim3 grid(n_splits, h->n_kv, h->batch);
    attn_split_kernel<T, D, G><<<grid, kWarps * 32, 0, st>>>(
        d, q, (const T *)kp, (const T *)vp, (const T *)ck, (const T *)cv, sparse, chunk, logits,
        ws->part_ml, ws->part_acc);
    return cudaGetLastError();
}

template <typename T, int D>
cudaError_t dispatch_g(int G, const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                       const float *q, const void *kp, const void *vp, const void *ck,
                       const void *cv, int sparse, int chunk, int ns, float *logits,
                       const sfi_gpu_attn_ws *ws, cudaStream_t st) {
    switch (G) {
    case 1: return launch_split<T, D, 1>(h, d, q, kp, vp, ck, cv, sparse, chunk, ns, logits, ws, st);
    case 2: return launch_split<T, D, 2>(h, d, q, kp, vp, ck, cv, sparse, chunk, ns, logits, ws, st);
    case 4: return launch_split<T, D, 4>(h, d, q, kp, vp, ck, cv, sparse, chunk, ns, logits, ws, st);
    case 8: return launch_split<T, D, 8>(h, d, q, kp, vp, ck, cv, sparse, chunk, ns, logits, ws, st);
    default: return cudaErrorInvalidValue;
    }
}

int rows_per_iter(int D, int dtype) {
    const int vec = dtype == SFI_GPU_BF16 ? 8 : 4;
    return kUnroll * kWarps * (32 / (D / vec));
}

int attn_common(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                const float *q, const void *kp, const void *vp, const void *ck,
                const void *cv, int sparse, float *out, float *logits,
                const sfi_gpu_attn_ws *ws, int exact, cudaStream_t st) {
    const int D = h->head_dim, G = h->n_heads / h->n_kv;
    int max_rows = 0;
    for (int b = 0; b < h->batch; b++) {
        const sfi_gpu_req *r = &h->req[b];
        const int n = sparse ? r->n_compact + (r->ctx_len - r->recent_begin) : r->ctx_len;
        if (n > max_rows) max_rows = n;
    }
    if (max_rows <= 0) return (int)cudaErrorInvalidValue;
    if (exact) {
        if (dtype != SFI_GPU_F32) return (int)cudaErrorInvalidValue;
        /* row buffer: the partial-acc scratch holds MAX_SPLITS*D floats
         * per head, enough for rows up to that many positions */
        const int ld = SFI_GPU_MAX_SPLITS * D;
        if (max_rows > ld) return (int)cudaErrorInvalidValue;
        float *rowbuf = ws->part_acc;
        dim3 g1((max_rows + 127) / 128, h->n_heads, h->batch);
        exact_logits_kernel<<<g1, 128, 0, st>>>(d, q, (const float *)kp, (const float *)ck,
                                                sparse, rowbuf, ld, logits);
        exact_softmax_kernel<<<dim3(h->n_heads, h->batch), 32, 0, st>>>(d, sparse, rowbuf, ld);
        exact_out_kernel<<<dim3(h->n_heads, h->batch), D, 0, st>>>(
            d, (const float *)vp, (const float *)cv, sparse, rowbuf, ld, out);
        return (int)cudaGetLastError();
    }
    const int chunk = sfi_gpu_attn_chunk(h, max_rows, dtype);
    const int ns = (max_rows + chunk - 1) / chunk;
    if (ns > SFI_GPU_MAX_SPLITS) return (int)cudaErrorInvalidValue;
    cudaError_t e;
    if (dtype == SFI_GPU_BF16) {
        if (D == 128)
            e = dispatch_g<__nv_bfloat16, 128>(G, h, d, q, kp, vp, ck, cv, sparse, chunk, ns, logits, ws, st);
        else if (D == 64)
            e = dispatch_g<__nv_bfloat16, 64>(G, h, d, q, kp, vp, ck, cv, sparse, chunk, ns, logits, ws, st);
        else
            return (int)cudaErrorInvalidValue;
    } else {
        if (D == 128)
            e = dispatch_g<float, 128>(G, h, d, q, kp, vp, ck, cv, sparse, chunk, ns, logits, ws, st);
        else if (D == 64)
            e = dispatch_g<float, 64>(G, h, d, q, kp, vp, ck, cv, sparse, chunk, ns, logits, ws, st);
        else
            return (int)cudaErrorInvalidValue;
    }
    if (e != cudaSuccess) return (int)e;
    attn_combine_kernel<<<dim3(h->n_heads, h->batch), D, 0, st>>>(d, sparse, chunk, ws->part_ml,
                                                                   ws->part_acc, out);
    return (int)cudaGetLastError();
}

__device__ __forceinline__ uint32_t hash32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}

/* Launch: grid-stride, 256 threads; element i from hash(seed, i). */
__global__ void fill_kernel(void *p, size_t n, int dtype, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint32_t h = hash32((uint32_t)i ^ hash32(seed + (uint32_t)(i >> 32) * 0x9e3779b9u));
        const float x = ((float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
        if (dtype == SFI_GPU_BF16)
            ((__nv_bfloat16 *)p)[i] = __float2bfloat16(x);
        else
            ((float *)p)[i] = x;
    }
}

__global__ void noop_kernel() {}

} // namespace

extern "C" {

int sfi_gpu_fill_random(void *p, size_t n, int dtype, uint32_t seed, float scale,
                        cudaStream_t st) {
    fill_kernel<<<132 * 16, 256, 0, st>>>(p, n, dtype, seed, scale);
    return (int)cudaGetLastError();
}

int sfi_gpu_noop(cudaStream_t st) {
    noop_kernel<<<1, 32, 0, st>>>();
    return (int)cudaGetLastError();
}

size_t sfi_gpu_attn_ws_bytes(int batch, int n_heads, int head_dim) {
    return (size_t)batch * n_heads * SFI_GPU_MAX_SPLITS * (2 + head_dim) * sizeof(float);
}

void sfi_gpu_attn_ws_carve(sfi_gpu_attn_ws *ws, void *base, int batch, int n_heads, int head_dim) {
    (void)head_dim;
    ws->part_ml = (float *)base;
    ws->part_acc = ws->part_ml + (size_t)batch * n_heads * SFI_GPU_MAX_SPLITS * 2;
}

/* Split size: enough CTAs to cover every SM several times (132 SMs on an
 * H100, 2 CTAs of 256 threads resident each: aim at >= 8 waves' worth of
 * CTAs so the tail is short), never below one row iteration, rounded to a
 * whole number of row iterations, and at most MAX_SPLITS splits. */
int sfi_gpu_attn_chunk(const sfi_gpu_step_desc *h, int rows, int dtype) {
    const int it = rows_per_iter(h->head_dim, dtype);
    const long pairs = (long)h->batch * h->n_kv;
    const long target_ctas = 2048;
    long splits = (target_ctas + pairs - 1) / pairs;
    long chunk = (rows + splits - 1) / splits;
    if (chunk < it) chunk = it;
    chunk = (chunk + it - 1) / it * it;
    while ((rows + chunk - 1) / chunk > SFI_GPU_MAX_SPLITS) chunk += it;
    return (int)chunk;
}

int sfi_gpu_attn_dense(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                       const float *q, const void *k_pool, const void *v_pool, float *out,
                       float *logits, const sfi_gpu_attn_ws *ws, int exact, cudaStream_t st) {
    return attn_common(h, d, dtype, q, k_pool, v_pool, nullptr, nullptr, 0, out, logits, ws,
                       exact, st);
}

int sfi_gpu_attn_sparse(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                        const float *q, const void *k_pool, const void *v_pool, const void *ck,
                        const void *cv, const int32_t *comp_pos, float *out,
                        const sfi_gpu_attn_ws *ws, int exact, cudaStream_t st) {
    (void)comp_pos; /* rows are already in ascending position order */
    return attn_common(h, d, dtype, q, k_pool, v_pool, ck, cv, 1, out, nullptr, ws, exact, st);
}

int sfi_gpu_key_norms(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                      const void *k_pool, float *norms, cudaStream_t st) {
    dim3 grid((h->max_ctx + 7) / 8, h->n_kv, h->batch);
    if (dtype == SFI_GPU_BF16)
        key_norms_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>(d, (const __nv_bfloat16 *)k_pool, norms);
    else
        key_norms_kernel<float><<<grid, 256, 0, st>>>(d, (const float *)k_pool, norms);
    return (int)cudaGetLastError();
}

int sfi_gpu_device_ok(char *msg, size_t msg_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (msg && msg_len)
            snprintf(msg, msg_len, "no CUDA device (%s)",
                     e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
        cudaGetLastError();
        return 0;
    }
    if (msg && msg_len) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
            snprintf(msg, msg_len, "%s, %d SMs, sm_%d%d", p.name, p.multiProcessorCount, p.major,
                     p.minor);
        else
            snprintf(msg, msg_len, "CUDA device 0");
    }
    return 1;
}

} // extern "C"
