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

/* 16 bytes of K or V (raw) to floats. */
__device__ __forceinline__ void cvt16(const uint4 w, float *x, float) {
    x[0] = __uint_as_float(w.x); x[1] = __uint_as_float(w.y);
    x[2] = __uint_as_float(w.z); x[3] = __uint_as_float(w.w);
}
__device__ __forceinline__ void cvt16(const uint4 w, float *x, __nv_bfloat16) {
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        x[2 * i] = __uint_as_float(u[i] << 16);
        x[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    const int n = valid ? 16 : 0; /* 0: zero-fill, nothing read */
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

constexpr int kTileRows = 32;

template <typename T, int D, int G, int kStages> struct SplitCfg {
    static constexpr int VEC = 16 / (int)sizeof(T);        /* elements per lane */
    static constexpr int LPR = D / VEC;                      /* lanes per row */
    static constexpr int RPW = 32 / LPR;                     /* rows per warp step */
    static constexpr int NSUB = kWarps * RPW;                /* row slots per CTA */
    static constexpr int U = kTileRows / NSUB;               /* rows per slot per tile */
    static constexpr int W16 = D * (int)sizeof(T) / 16;      /* 16-byte words per row */
    static constexpr int TILE_WORDS = kTileRows * W16;       /* per tensor */
    static constexpr size_t PIPE_BYTES = (size_t)kStages * 2 * TILE_WORDS * 16;
    static constexpr size_t MERGE_BYTES = (size_t)kWarps * G * (D + 2) * 4;
    static constexpr size_t SMEM = PIPE_BYTES > MERGE_BYTES ? PIPE_BYTES : MERGE_BYTES;
};

/* Split kernel (flash-decoding partition with a cp.async pipeline).
 * Launch: grid (n_splits, n_kv, batch), block 256 = 8 warps, dynamic shared
 * memory SplitCfg::SMEM (2 CTAs per SM for bf16, D 128). A CTA owns about
 * n_rows/n_splits rows of one (request, KV head) and all G query heads of
 * the group, so K/V are read from HBM once per group. It streams its rows in
 * tiles of 32 through a kStages-deep ring of shared-memory buffers
 * (cp.async, 16 bytes per thread per copy; rows past the end are
 * zero-filled and masked), so about (kStages-1) tiles of K and V per CTA
 * are in flight while the warps compute on the oldest one. Compute: LPR =
 * D*sizeof(T)/16 lanes share a row (each lane its 16-byte slice), a warp
 * covers RPW rows at a time; per head a lane keeps an online softmax in
 * base 2 (max m, sum l, acc of its slice), rescaling only when the max
 * grows. At the end the row groups merge by shuffles, the warps through
 * shared memory, and the CTA writes one partial per head: part_ml
 * [b][h][split] = (m in log2 units, l), part_acc [b][h][split][D]; the
 * last CTA of the (request, KV head) merges them into out (one split:
 * out directly). A CTA's tiles are split, split + ns, ... (strided; see
 * below). Rows: dense = positions; sparse = compact rows 0..n_compact-1,
 * then the recent window in place (block ids from the table, L1/L2-hot).
 * The logits (slow steps) go through shared memory, one tile late. */
template <typename T, int D, int G, int kStages>
__global__ void __launch_bounds__(kWarps * 32, 2)
attn_split_kernel(const sfi_gpu_step_desc *__restrict__ d, const float *__restrict__ q,
                  const T *__restrict__ kp, const T *__restrict__ vp,
                  const T *__restrict__ ck, const T *__restrict__ cv, int sparse, int chunk,
                  float *__restrict__ logits, float *__restrict__ part_ml,
                  float *__restrict__ part_acc, int *__restrict__ counters,
                  float *__restrict__ out) {
    using C = SplitCfg<T, D, G, kStages>;
    extern __shared__ __align__(16) unsigned char smem[];
    uint4 *pipe = reinterpret_cast<uint4 *>(smem);
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const sfi_gpu_req rq = d->req[b];
    const int n_kv = d->n_kv, page = d->page, H = d->n_heads, ld = d->ld_logits;
    const int cap = d->compact_cap;
    const int32_t *bt = d->block_table + (size_t)b * d->max_blocks;
    const int n_compact = sparse ? rq.n_compact : 0;
    const int rb = sparse ? rq.recent_begin : 0;
    const int n_rows = sparse ? n_compact + (rq.ctx_len - rq.recent_begin) : rq.ctx_len;
    /* this CTA's tiles: split, split + ns, split + 2 ns, ... (strided, so
     * the CTAs running at one time read neighbouring tiles: a long
     * contiguous stream per CTA would have every CTA hit the same DRAM
     * channels at once) */
    const int ns = (n_rows + chunk - 1) / chunk;
    if (split >= ns) return;
    const int n_all_tiles = (n_rows + kTileRows - 1) / kTileRows;
    const int n_tiles = (n_all_tiles - split + ns - 1) / ns;
    const int end = n_rows;
    /* Each (request, KV head) starts its walk at a different tile: the
     * compact buffers of all pairs have the same size, so without this
     * rotation every pair would read the same offset of its buffer at the
     * same time, addresses a multiple of the buffer size apart. */
    const int rot = n_tiles > 0 ? (int)(((unsigned)(b * n_kv + kvh) * 2654435761u) % (unsigned)n_tiles) : 0;
    auto tile_row0 = [&](int tile) {
        const int tt = tile + rot < n_tiles ? tile + rot : tile + rot - n_tiles;
        return (split + tt * ns) * kTileRows;
    };
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rg = lane / C::LPR, li = lane % C::LPR;
    const int sub = warp * C::RPW + rg;
    const float scale = rsqrtf((float)D);
    const float scale2 = scale * kLog2e;

    auto load_tile = [&](int tile, int stage) {
        uint4 *sk = pipe + (size_t)stage * 2 * C::TILE_WORDS;
        uint4 *sv = sk + C::TILE_WORDS;
        const int r0 = tile_row0(tile);
#pragma unroll
        for (int i = 0; i < (C::TILE_WORDS + kWarps * 32 - 1) / (kWarps * 32); i++) {
            const int w = threadIdx.x + i * kWarps * 32;
            if (w < C::TILE_WORDS) {
                const int rr = w / C::W16, cw = w % C::W16, r = r0 + rr;
                const bool ok = r < end;
                size_t off;
                const T *kb, *vb;
                if (!ok) { /* zero-filled: any valid address, nothing is read */
                    off = 0;
                    kb = kp; vb = vp;
                } else if (r < n_compact) {
                    off = (((size_t)b * n_kv + kvh) * cap + r) * D;
                    kb = ck; vb = cv;
                } else {
                    const int pos = rb + (r - n_compact);
                    const int blk = __ldg(bt + pos / page);
                    off = (((size_t)blk * n_kv + kvh) * page + pos % page) * D;
                    kb = kp; vb = vp;
                }
                cp_async16(sk + w, reinterpret_cast<const uint4 *>(kb + off) + cw, ok);
                cp_async16(sv + w, reinterpret_cast<const uint4 *>(vb + off) + cw, ok);
            }
        }
    };

    /* Logits of a tile are staged in shared memory (lane li == g writes
     * head g's) and written one tile later, after the barrier, as G rows of
     * 32 consecutive floats: coalesced, instead of G scattered 4-byte
     * stores per row. Two buffers by tile parity. */
    __shared__ float s_lg[2][G][kTileRows];
    auto flush_logits = [&](int tile) {
        const int r0 = tile_row0(tile);
        for (int i = threadIdx.x; i < G * kTileRows; i += kWarps * 32) {
            const int g = i / kTileRows, rr = i % kTileRows, r = r0 + rr;
            if (r < end && r >= n_compact)
                logits[((size_t)b * H + kvh * G + g) * ld + rb + (r - n_compact)] = s_lg[tile & 1][g][rr];
        }
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
        if (s < n_tiles) load_tile(s, s);
        cp_async_commit();
    }
    /* q after the first tiles are on their way: its latency overlaps theirs */
    float qr[G][C::VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qp = q + ((size_t)b * H + kvh * G + g) * D + li * C::VEC;
#pragma unroll
        for (int i = 0; i < C::VEC; i++) qr[g][i] = qp[i];
    }
    float m[G], l[G], acc[G][C::VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = kNegBig; l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < C::VEC; i++) acc[g][i] = 0.f;
    }

    for (int t = 0; t < n_tiles; t++) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (t + kStages - 1 < n_tiles) load_tile(t + kStages - 1, (t + kStages - 1) % kStages);
        cp_async_commit();
        if (logits && t > 0) flush_logits(t - 1);
        const uint4 *sk = pipe + (size_t)(t % kStages) * 2 * C::TILE_WORDS;
        const uint4 *sv = sk + C::TILE_WORDS;
        const int r0 = tile_row0(t);
        float s2[C::U][G];
#pragma unroll
        for (int u = 0; u < C::U; u++) {
            const int rr = u * C::NSUB + sub, r = r0 + rr;
            float kx[C::VEC];
            cvt16(sk[rr * C::W16 + li], kx, T());
#pragma unroll
            for (int g = 0; g < G; g++) {
                float a = 0.f;
#pragma unroll
                for (int i = 0; i < C::VEC; i++) a = fmaf(qr[g][i], kx[i], a);
#pragma unroll
                for (int off = C::LPR / 2; off > 0; off >>= 1)
                    a += __shfl_xor_sync(0xffffffffu, a, off);
                s2[u][g] = r < end ? a * scale2 : -INFINITY;
                if (logits && li == g) s_lg[t & 1][g][rr] = a * scale;
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < C::U; u++) mx = fmaxf(mx, s2[u][g]);
            if (mx > m[g]) { /* rescale only when the running max grows */
                const float corr = fast_exp2(m[g] - mx);
                l[g] *= corr;
#pragma unroll
                for (int i = 0; i < C::VEC; i++) acc[g][i] *= corr;
                m[g] = mx;
            }
        }
#pragma unroll
        for (int u = 0; u < C::U; u++) {
            const int rr = u * C::NSUB + sub;
            float vx[C::VEC];
            cvt16(sv[rr * C::W16 + li], vx, T());
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float p = fast_exp2(s2[u][g] - m[g]);
                l[g] += p;
#pragma unroll
                for (int i = 0; i < C::VEC; i++) acc[g][i] = fmaf(p, vx[i], acc[g][i]);
            }
        }
    }
    cp_async_wait<0>();
    if (logits && n_tiles > 0) {
        __syncthreads();
        flush_logits(n_tiles - 1);
    }

    /* merge the RPW row groups of the warp (lanes li, li+LPR, ...) */
#pragma unroll
    for (int off = C::LPR; off < 32; off <<= 1) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], off);
            const float lo = __shfl_xor_sync(0xffffffffu, l[g], off);
            const float mx = fmaxf(m[g], mo);
            const float a = exp2f(m[g] - mx), c = exp2f(mo - mx);
            l[g] = l[g] * a + lo * c;
#pragma unroll
            for (int i = 0; i < C::VEC; i++) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], off);
                acc[g][i] = acc[g][i] * a + ao * c;
            }
            m[g] = mx;
        }
    }
    __syncthreads(); /* the pipeline buffers become the merge buffers */
    float *sm_acc = reinterpret_cast<float *>(smem);           /* [kWarps][G][D] */
    float *sm_m = sm_acc + kWarps * G * D, *sm_l = sm_m + kWarps * G;
    if (rg == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (li == 0) { sm_m[warp * G + g] = m[g]; sm_l[warp * G + g] = l[g]; }
#pragma unroll
            for (int i = 0; i < C::VEC; i++) sm_acc[(warp * G + g) * D + li * C::VEC + i] = acc[g][i];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
        const int g = idx / D, dd = idx % D;
        float mx = kNegBig;
        for (int w = 0; w < kWarps; w++) mx = fmaxf(mx, sm_m[w * G + g]);
        float L = 0.f, A = 0.f;
        for (int w = 0; w < kWarps; w++) {
            const float c = exp2f(sm_m[w * G + g] - mx);
            L += sm_l[w * G + g] * c;
            A += sm_acc[(w * G + g) * D + dd] * c;
        }
        if (ns == 1) { /* the only split: the output directly */
            out[((size_t)b * H + kvh * G + g) * D + dd] = A / L;
            continue;
        }
        const size_t ph = ((size_t)b * H + kvh * G + g) * SFI_GPU_MAX_SPLITS + split;
        part_acc[ph * D + dd] = A;
        if (dd == 0) { part_ml[ph * 2] = mx; part_ml[ph * 2 + 1] = L; }
    }
    if (ns == 1) return;
    /* The last CTA of this (request, KV head) to finish merges all splits
     * (ascending) and writes the output: no separate combine launch. The
     * counter is reset by that CTA, so the workspace stays reusable. */
    __shared__ int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[b * n_kv + kvh], 1) == ns - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
        const int g = idx / D, dd = idx % D;
        const size_t ph = ((size_t)b * H + kvh * G + g) * SFI_GPU_MAX_SPLITS;
        float mx = kNegBig;
        for (int s = 0; s < ns; s++) mx = fmaxf(mx, __ldcg(part_ml + (ph + s) * 2));
        float L = 0.f, A = 0.f;
        for (int s = 0; s < ns; s++) {
            const float c = exp2f(__ldcg(part_ml + (ph + s) * 2) - mx);
            L += __ldcg(part_ml + (ph + s) * 2 + 1) * c;
            A += __ldcg(part_acc + (ph + s) * D + dd) * c;
        }
        out[((size_t)b * H + kvh * G + g) * D + dd] = A / L;
    }
    if (threadIdx.x == 0) counters[b * n_kv + kvh] = 0;
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

int g_waves = 1;
int g_stages = 4;

/* Split size: the grid is sized to g_waves waves of resident CTAs
 * (occupancy x SM count), split evenly over the (request, KV head) pairs;
 * one wave by default, because each CTA's start (block ids, first tiles)
 * costs a few microseconds that later waves would pay again, and equal
 * chunks finish together. Rounded to whole tiles, at most MAX_SPLITS. */
template <typename T, int D, int G, int S>
cudaError_t launch_split(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, const float *q,
                         const void *kp, const void *vp, const void *ck, const void *cv,
                         int sparse, int max_rows, float *logits, float *out,
                         const sfi_gpu_attn_ws *ws, cudaStream_t st) {
    using C = SplitCfg<T, D, G, S>;
    const size_t smem = C::SMEM;
    /* opt in to more than 48 KiB of dynamic shared memory and read the
     * occupancy (once per instantiation; no allocation) */
    static int occ = 0, sms = 0;
    if (!occ) {
        cudaError_t e = cudaFuncSetAttribute(attn_split_kernel<T, D, G, S>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        int dev = 0;
        if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
        if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
            return e;
        if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, attn_split_kernel<T, D, G, S>,
                                                               kWarps * 32, smem)) != cudaSuccess)
            return e;
        if (occ < 1) occ = 1;
    }
    const long pairs = (long)h->batch * h->n_kv;
    long splits = (long)g_waves * occ * sms / pairs;
    /* short rows (fast steps): at least ~1024 rows per split, since a
     * split costs a start-up and the last one a merge; one split writes
     * the output directly */
    if (splits > max_rows / 1024) splits = max_rows / 1024;
    if (splits < 1) splits = 1;
    long chunk = (max_rows + splits - 1) / splits;
    chunk = (chunk + kTileRows - 1) / kTileRows * kTileRows;
    while ((max_rows + chunk - 1) / chunk > SFI_GPU_MAX_SPLITS) chunk += kTileRows;
    const int ns = (int)((max_rows + chunk - 1) / chunk);
    dim3 grid(ns, h->n_kv, h->batch);
    attn_split_kernel<T, D, G, S><<<grid, kWarps * 32, smem, st>>>(
        d, q, (const T *)kp, (const T *)vp, (const T *)ck, (const T *)cv, sparse, (int)chunk,
        logits, ws->part_ml, ws->part_acc, ws->counters, out);
    return cudaGetLastError();
}

template <typename T, int D>
cudaError_t dispatch_g(int G, const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                       const float *q, const void *kp, const void *vp, const void *ck,
                       const void *cv, int sparse, int rows, float *logits, float *out,
                       const sfi_gpu_attn_ws *ws, cudaStream_t st) {
    switch (G) {
    case 1: return launch_split<T, D, 1, 4>(h, d, q, kp, vp, ck, cv, sparse, rows, logits, out, ws, st);
    case 2: return launch_split<T, D, 2, 4>(h, d, q, kp, vp, ck, cv, sparse, rows, logits, out, ws, st);
    case 4:
        /* the benchmarked shape may use a deeper pipeline (see the bench's
         * sweep); 4 stages elsewhere */
        if (g_stages == 6 && sizeof(T) == 2 && D == 128)
            return launch_split<T, D, 4, 6>(h, d, q, kp, vp, ck, cv, sparse, rows, logits, out, ws, st);
        return launch_split<T, D, 4, 4>(h, d, q, kp, vp, ck, cv, sparse, rows, logits, out, ws, st);
    case 8: return launch_split<T, D, 8, 4>(h, d, q, kp, vp, ck, cv, sparse, rows, logits, out, ws, st);
    default: return cudaErrorInvalidValue;
    }
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
    cudaError_t e;
    if (dtype == SFI_GPU_BF16) {
        if (D == 128)
            e = dispatch_g<__nv_bfloat16, 128>(G, h, d, q, kp, vp, ck, cv, sparse, max_rows, logits, out, ws, st);
        else if (D == 64)
            e = dispatch_g<__nv_bfloat16, 64>(G, h, d, q, kp, vp, ck, cv, sparse, max_rows, logits, out, ws, st);
        else
            return (int)cudaErrorInvalidValue;
    } else {
        if (D == 128)
            e = dispatch_g<float, 128>(G, h, d, q, kp, vp, ck, cv, sparse, max_rows, logits, out, ws, st);
        else if (D == 64)
            e = dispatch_g<float, 64>(G, h, d, q, kp, vp, ck, cv, sparse, max_rows, logits, out, ws, st);
        else
            return (int)cudaErrorInvalidValue;
    }
    return (int)e;
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

/* Launch: 1 block of 32 threads; does nothing (launch-overhead probe). */
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
    return (size_t)batch * n_heads * SFI_GPU_MAX_SPLITS * (2 + head_dim) * sizeof(float) +
           (size_t)batch * n_heads * sizeof(int);
}

void sfi_gpu_attn_ws_carve(sfi_gpu_attn_ws *ws, void *base, int batch, int n_heads, int head_dim) {
    ws->part_ml = (float *)base;
    ws->part_acc = ws->part_ml + (size_t)batch * n_heads * SFI_GPU_MAX_SPLITS * 2;
    ws->counters = (int *)(ws->part_acc + (size_t)batch * n_heads * SFI_GPU_MAX_SPLITS * head_dim);
    ws->n_counters = batch * n_heads;
}

int sfi_gpu_attn_ws_init(const sfi_gpu_attn_ws *ws, cudaStream_t st) {
    return (int)cudaMemsetAsync(ws->counters, 0, (size_t)ws->n_counters * sizeof(int), st);
}

void sfi_gpu_attn_set_waves(int waves) { g_waves = waves > 0 ? waves : 1; }
void sfi_gpu_attn_set_stages(int stages) { g_stages = stages == 6 ? 6 : 4; }

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
