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
#include "sfi_gpu_tma.cuh"

namespace {

constexpr float kLog2e = 1.4426950408889634f;
/* Running-max sentinel: finite so that exp2(m_old - m_new) never sees
 * (-inf) - (-inf); real scores are far above it. */
constexpr float kNegBig = -1e30f;
constexpr int kWarps = 8;
/* Fewest rows per split (see launch_split). */
constexpr int kMinSplitRows = 1024;

/* Attention launch modes: every request dense, every request sparse, or
 * each by its SFI_GPU_REQ_SPARSE flag (IDLE requests skipped). */
enum { kModeDense = 0, kModeSparse = 1, kModeMixed = 2 };
__device__ __forceinline__ int req_sparse(int mode, const sfi_gpu_req &rq) {
    return mode == kModeMixed ? (rq.flags & SFI_GPU_REQ_SPARSE) != 0 : mode;
}
__device__ __forceinline__ bool req_idle(int mode, const sfi_gpu_req &rq) {
    return mode == kModeMixed && (rq.flags & SFI_GPU_REQ_IDLE) != 0;
}

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
            const int cb = (d->req[b].flags & SFI_GPU_REQ_ALT) ? b + d->alt_rows : b;
            return comp + (((size_t)cb * d->n_kv + kvh) * d->compact_cap + r) * D;
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

/* End of a split CTA: merges the warps' (m, l, acc) through shared memory
 * (smem: the pipeline buffers, free now; the caller synchronises first),
 * writes the output (one split) or this split's partial, and lets the
 * last CTA of the (request, KV head, head slice) merge all splits
 * (ascending) into the output: no separate combine launch. hb: the
 * global index of the CTA's first query head; pair: its counter,
 * ((b * n_kv + kvh) * n_sl + slice). The counter is reset by that CTA, so
 * the workspace stays reusable. */
template <int G, int D, int VEC>
__device__ __forceinline__ void split_epilogue(float *smem, int warp, int rg, int li, const float (&m)[G],
                                               const float (&l)[G], const float (&acc)[G][VEC], int b,
                                               int hb, int pair, int H, int split, int ns,
                                               float *__restrict__ part_ml, float *__restrict__ part_acc,
                                               int *__restrict__ counters, float *__restrict__ out,
                                               __nv_bfloat16 *__restrict__ out_b) {
    float *sm_acc = smem; /* [kWarps][G][D] */
    float *sm_m = sm_acc + kWarps * G * D, *sm_l = sm_m + kWarps * G;
    if (rg == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (li == 0) { sm_m[warp * G + g] = m[g]; sm_l[warp * G + g] = l[g]; }
#pragma unroll
            for (int i = 0; i < VEC; i++) sm_acc[(warp * G + g) * D + li * VEC + i] = acc[g][i];
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
            const size_t o = ((size_t)b * H + hb + g) * D + dd;
            out[o] = A / L;
            if (out_b) out_b[o] = __float2bfloat16_rn(A / L);
            continue;
        }
        const size_t ph = ((size_t)b * H + hb + g) * SFI_GPU_MAX_SPLITS + split;
        part_acc[ph * D + dd] = A;
        if (dd == 0) { part_ml[ph * 2] = mx; part_ml[ph * 2 + 1] = L; }
    }
    if (ns == 1 || !counters) return;
    __shared__ int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[pair], 1) == ns - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int idx = threadIdx.x; idx < G * D; idx += kWarps * 32) {
        const int g = idx / D, dd = idx % D;
        const size_t ph = ((size_t)b * H + hb + g) * SFI_GPU_MAX_SPLITS;
        float mx = kNegBig;
        for (int s = 0; s < ns; s++) mx = fmaxf(mx, __ldcg(part_ml + (ph + s) * 2));
        float L = 0.f, A = 0.f;
        for (int s = 0; s < ns; s++) {
            const float c = exp2f(__ldcg(part_ml + (ph + s) * 2) - mx);
            L += __ldcg(part_ml + (ph + s) * 2 + 1) * c;
            A += __ldcg(part_acc + (ph + s) * D + dd) * c;
        }
        const size_t o = ((size_t)b * H + hb + g) * D + dd;
        out[o] = A / L;
        if (out_b) out_b[o] = __float2bfloat16_rn(A / L);
    }
    if (threadIdx.x == 0) counters[pair] = 0;
}

/* ---- TMA bulk-copy pipeline (the default fast path; sfi_gpu_tma.cuh) ---- */
/* Transposed reduction of N = 2*O partial sums over 2*O lanes (xor
 * offsets O, O/2, ..., 1): at offset o a lane keeps the half of its values
 * selected by its bit o and sends the other half, so after log2(2*O)
 * steps lane i holds the full sum of value i, with 2*O-1 shuffles in all. */
template <int O, int N>
__device__ __forceinline__ void butterfly(float (&v)[N], int li) {
    if constexpr (O >= 1) {
        const bool up = (li & O) != 0;
#pragma unroll
        for (int k = 0; k < O; k++) {
            const float lo = v[k], hi = v[k + O];
            const float recv = __shfl_xor_sync(0xffffffffu, up ? lo : hi, O);
            v[k] = (up ? hi : lo) + recv;
        }
        butterfly<O / 2>(v, li);
    }
}

template <typename T, int D, int G, int kStages> struct BulkCfg {
    static constexpr int RB = D * (int)sizeof(T);            /* bytes per row */
    static constexpr int ROWS = 2048 * kWarps / RB;          /* rows per tile: 2 KiB per warp per tensor */
    static constexpr int VEC = 16 / (int)sizeof(T);
    static constexpr int LPR = D / VEC;                      /* lanes per row */
    static constexpr int RPW = 32 / LPR;                     /* rows per warp step */
    static constexpr int RW = ROWS / kWarps;                 /* rows per warp per tile */
    static constexpr int U = RW / RPW;                       /* warp steps per tile */
    /* transposed (butterfly) reduction of the U*G partial dot products
     * when they fill the lanes of a row exactly */
    static constexpr bool BFLY = U * G == LPR;
    static constexpr int TILE_BYTES = ROWS * RB;
    static constexpr size_t PIPE_BYTES = (size_t)kStages * 2 * TILE_BYTES;
    static constexpr size_t MERGE_BYTES = (size_t)kWarps * G * (D + 2) * 4;
    static constexpr size_t SMEM = PIPE_BYTES > MERGE_BYTES ? PIPE_BYTES : MERGE_BYTES;
    static_assert(RW % RPW == 0 && U >= 1, "tile rows must cover the warps");
};

/* Split kernel (flash-decoding partition) with a TMA bulk-copy pipeline.
 * Launch: grid (n_splits * n_sl, n_kv, batch), block kWarps*32 = 256,
 * dynamic shared memory BulkCfg::SMEM: kStages stages, each a tile of K
 * and one of V of 2 KiB per warp (bf16, D 128: 64 rows, 16 KiB each; 3
 * stages = 96 KiB). A CTA owns about n_rows/n_splits rows of one
 * (request, KV head) and G query heads of the group: all of them (n_sl =
 * 1), so K/V are read from HBM once per group, or, where no instantiation
 * takes the model's group Gm whole (Qwen3-235B-A22B: 16; slice_heads),
 * slice s of n_sl = Gm / G head slices, query heads kvh*Gm + s*G ..
 * + G - 1, with split = blockIdx.x / n_sl, s = blockIdx.x % n_sl. The
 * slices of a split are neighbours in the launch order, so they run at
 * about the same time, and walk the same tiles in the same order (the
 * same rotation below): all but the first to read a K/V row mostly hit
 * L2, so HBM traffic stays about once per group and the slices cost L2
 * bandwidth and the per-CTA work of the split. Its tiles
 * are split, split + ns, ... (strided, so the CTAs running at one time
 * read neighbouring tiles rather than all
 * streaming from the same offsets), and each (request, KV head) starts its
 * walk at a different tile: the compact buffers of all pairs have the
 * same size, so without this rotation every pair would read the same
 * offset of its buffer at the same time. Rows: dense = positions; sparse
 * = compact rows 0..n_compact-1, then the recent window in place.
 * Loads: thread 0 issues, per tile and tensor, one cp.async.bulk per
 * contiguous run of rows (the compact segment; each page of the paged
 * segment: a dense tile of 64 bf16 rows is one page, one copy), so no
 * thread spends instructions on addresses and there is no block-wide
 * barrier in the loop: threads wait on the stage's full barrier and
 * release it through its empty barrier (one arrive per thread); thread 0
 * refills a stage one tile after it was released. Rows past the end are never copied (stale shared
 * memory): their scores are -inf and their V is skipped.
 * Compute: warp w owns rows [w*RW, (w+1)*RW) of a tile, RPW at a time, LPR
 * lanes per row (16 bytes each). With BFLY the U*G partial dot products
 * of a lane are reduced by a transposed butterfly (LPR-1 shuffles instead
 * of U*G*log2(LPR)), leaving lane li with the score of (step li/G, head
 * li%G): one exp per lane, the probabilities broadcast by shuffles for
 * P.V. Otherwise every dot product is reduced across its LPR lanes. The
 * online softmax (base 2, rescaling only when the max grows) keeps a
 * warp-uniform max per head; at the end the row groups, the warps and the
 * splits merge (split_epilogue). Logits (slow steps) are staged per warp
 * and written as G runs of RW consecutive floats. */
/* Launch bounds: two CTAs per SM up to G = 4; G = 5 at two (128
 * registers) spills 68-80 bytes a thread in bf16 (ptxas, sm_90) and uses
 * 186-191 at one, G = 8 242-249: one CTA per SM from G = 5 on. */
template <typename T, int D, int G, int kStages, bool kSliced>
__global__ void __launch_bounds__(kWarps * 32, G >= 5 ? 1 : 2)
attn_bulk_kernel(const sfi_gpu_step_desc *__restrict__ d, const float *__restrict__ q,
                 const T *__restrict__ kp, const T *__restrict__ vp,
                 const T *__restrict__ ck, const T *__restrict__ cv, int mode, int chunk,
                 int dense_chunk, float *__restrict__ logits, float *__restrict__ part_ml,
                 float *__restrict__ part_acc, int *__restrict__ counters,
                 float *__restrict__ out, __nv_bfloat16 *__restrict__ out_b,
                 sfi_gpu_attn_fuse fz) {
    using C = BulkCfg<T, D, G, kStages>;
    /* programmatic dependent launch (the engine's steps): this kernel may
     * start while the one before it (q/k norm, RoPE, KV append) still
     * runs. Everything it reads was written before that kernel started
     * (the step's descriptor, the compact segment, every cached row but
     * the current token's) except q and the current token's K/V row: the
     * first tiles without that row are requested before waiting, so that
     * their HBM round trip overlaps the previous kernel's tail; q and the
     * rest come after griddepcontrol.wait (a no-op without PDL). */
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint64_t full_bar[kStages], empty_bar[kStages];
    __shared__ float s_lg[kWarps][G][C::RW];
    /* grid (splits * n_sl, n_kv, batch): a split-major order (every pair's split
     * 0 dispatched first) measured slower on the H100, 0.6B batch 16 fast
     * steps 3.16 against 2.96 ms */
    /* head slice sl of n_sl: first head hb = kvh * Gm + sl * G. n_sl is a
     * constant 1 in the unsliced instance (kSliced false) and the split is
     * made before the idle return, as before head slices existed: with
     * n_sl read at run time, after that return, the G = 2 bf16 kernel had
     * 103 registers instead of 96 and 0.6B batch 16 32K fast steps took
     * 3.01 against 2.95 ms (H100, ncu: attention 1.99 against 1.93 ms a
     * step) */
    const int n_sl = kSliced ? d->n_heads / (d->n_kv * G) : 1;
    const int split = blockIdx.x / n_sl, sl = blockIdx.x % n_sl, kvh = blockIdx.y, b = blockIdx.z;
    const sfi_gpu_req rq = d->req[b];
    if (req_idle(mode, rq)) return;
    const int sparse = req_sparse(mode, rq);
    if (sparse) logits = nullptr; /* logits are a dense step's */
    const int n_kv = d->n_kv, page = d->page, H = d->n_heads, ld = d->ld_logits;
    const int hb = (kvh * n_sl + sl) * G, pair = (b * n_kv + kvh) * n_sl + sl;
    const int grid_splits = (int)gridDim.x / n_sl;
    const int cap = d->compact_cap;
    const int32_t *bt = d->block_table + (size_t)b * d->max_blocks;
    const int n_compact = sparse ? rq.n_compact : 0;
    const int rb = sparse ? rq.recent_begin : 0;
    const int n_rows = sparse ? n_compact + (rq.ctx_len - rq.recent_begin) : rq.ctx_len;
    if (n_rows <= 0) return;
    const int cb = (rq.flags & SFI_GPU_REQ_ALT) ? b + d->alt_rows : b; /* compact row */
    if (chunk <= 0) {
        /* per request: its rows over the grid's splits, at least -chunk
         * (or kMinSplitRows) a split, whole tiles (launch_split's rule) */
        /* a dense request may have its own floor (dense_chunk > 0): the
         * small splits that spread few fast pairs over the SMs would cut
         * a long context into too many pieces */
        const int floor_rows = (!sparse && dense_chunk > 0) ? dense_chunk
                               : chunk < 0                  ? -chunk
                                                            : kMinSplitRows;
        chunk = max((n_rows + grid_splits - 1) / grid_splits, floor_rows);
        chunk = (chunk + C::ROWS - 1) / C::ROWS * C::ROWS;
    }
    const int ns = (n_rows + chunk - 1) / chunk;
    if (split >= ns) return;
    const int n_all_tiles = (n_rows + C::ROWS - 1) / C::ROWS;
    const int n_tiles = (n_all_tiles - split + ns - 1) / ns;
    const int end = n_rows;
    /* by (request, KV head), not slice: the slices read the same rows
     * together (L2 hits) */
    const int rot = n_tiles > 0 ? (int)(((unsigned)(b * n_kv + kvh) * 2654435761u) % (unsigned)n_tiles) : 0;
    auto tile_row0 = [&](int tile) {
        const int tt = tile + rot < n_tiles ? tile + rot : tile + rot - n_tiles;
        return (split + tt * ns) * C::ROWS;
    };
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rg = lane / C::LPR, li = lane % C::LPR;
    const float scale = rsqrtf((float)D);
    const float scale2 = scale * kLog2e;

    auto issue = [&](int tile, int stage) {
        unsigned char *sk = smem + (size_t)stage * 2 * C::TILE_BYTES;
        unsigned char *sv = sk + C::TILE_BYTES;
        const int r0 = tile_row0(tile), r1 = min(r0 + C::ROWS, end);
        mbar_expect_tx(&full_bar[stage], 2u * (unsigned)(r1 - r0) * C::RB);
        int r = r0;
        if (r < n_compact) {
            const int e = min(r1, n_compact);
            const size_t off = (((size_t)cb * n_kv + kvh) * cap + r) * D;
            bulk_g2s(sk, ck + off, (unsigned)(e - r) * C::RB, &full_bar[stage]);
            bulk_g2s(sv, cv + off, (unsigned)(e - r) * C::RB, &full_bar[stage]);
            r = e;
        }
        while (r < r1) {
            const int pos = rb + (r - n_compact), pg = pos / page, o = pos - pg * page;
            const int n = min(r1 - r, page - o);
            const size_t off = (((size_t)__ldg(bt + pg) * n_kv + kvh) * page + o) * D;
            bulk_g2s(sk + (size_t)(r - r0) * C::RB, kp + off, (unsigned)n * C::RB, &full_bar[stage]);
            bulk_g2s(sv + (size_t)(r - r0) * C::RB, vp + off, (unsigned)n * C::RB, &full_bar[stage]);
            r += n;
        }
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; s++) {
            mbar_init(&full_bar[s], 1);
            mbar_init(&empty_bar[s], kWarps * 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int s = 0; s < kStages && s < n_tiles; s++)
            if (tile_row0(s) + C::ROWS < n_rows) issue(s, s);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    /* fused q/k norm, RoPE and append (sfi_gpu_attn_fuse): warp g < G
     * makes query head hb + g into s_q; in the CTA that owns the last
     * tile (the current position) warp G appends the key, warp G + 1 the
     * value, before that tile is requested (the bulk copy reads what
     * these stores wrote: a proxy fence orders them) */
    constexpr bool kFusable = D == 128 && !kSliced && G + 2 <= kWarps && sizeof(T) == 2;
    __shared__ float s_q[kFusable ? G : 1][kFusable ? D : 1];
    if constexpr (kFusable) {
        if (fz.qkv) {
            const int pos = rq.ctx_len - 1;
            const bool owner = (n_all_tiles - 1) % ns == split;
            const int kind = warp < G ? 0 : warp == G && owner ? 1 : warp == G + 1 && owner ? 2 : -1;
            if (kind >= 0) {
                constexpr int J = D / 32;
                const int slot = kind == 0 ? hb + warp : kind == 1 ? H + kvh : H + n_kv + kvh;
                const float *src = fz.qkv + (size_t)b * (H + 2 * n_kv) * D + (size_t)slot * D;
                float v[J];
#pragma unroll
                for (int j = 0; j < J; j++) v[j] = src[lane + 32 * j];
                const size_t dst = (((size_t)__ldg(bt + pos / page) * n_kv + kvh) * page + pos % page) * D;
                if (kind == 2) {
#pragma unroll
                    for (int j = 0; j < J; j++)
                        const_cast<T *>(vp)[dst + lane + 32 * j] = __float2bfloat16_rn(v[j]);
                } else {
                    float o[J];
                    sfi_dev_warp_norm_rope<J>(v, kind == 0 ? fz.q_norm : fz.k_norm, fz.eps,
                                              fz.cs + (size_t)pos * (D / 2),
                                              fz.sn + (size_t)pos * (D / 2), o);
                    if (kind == 0) {
#pragma unroll
                        for (int j = 0; j < J; j++) s_q[warp][lane + 32 * j] = o[j];
                    } else {
                        float kn = 0.f;
#pragma unroll
                        for (int j = 0; j < J; j++) {
                            const __nv_bfloat16 kb = __float2bfloat16_rn(o[j]);
                            const_cast<T *>(kp)[dst + lane + 32 * j] = kb;
                            const float stored = __bfloat162float(kb);
                            kn += stored * stored;
                        }
                        if (fz.key_norms) {
                            for (int off = 16; off > 0; off >>= 1) kn += __shfl_xor_sync(0xffffffffu, kn, off);
                            if (lane == 0) fz.key_norms[((size_t)b * n_kv + kvh) * fz.ld_norms + pos] = sqrtf(kn);
                        }
                    }
                }
                if (kind > 0) asm volatile("fence.proxy.async.global;\n" ::: "memory");
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0)
        for (int s = 0; s < kStages && s < n_tiles; s++)
            if (tile_row0(s) + C::ROWS >= n_rows) issue(s, s);

    float qr[G][C::VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float *qp = q + ((size_t)b * H + hb + g) * D + li * C::VEC;
#pragma unroll
        for (int i = 0; i < C::VEC; i++) {
            if constexpr (kFusable) qr[g][i] = fz.qkv ? s_q[g][li * C::VEC + i] : qp[i];
            else qr[g][i] = qp[i];
        }
    }
    float m[G], l[G], acc[G][C::VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = kNegBig; l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < C::VEC; i++) acc[g][i] = 0.f;
    }
    /* BFLY: this lane's (step, head) after the butterfly, and its partial
     * softmax sum (combined over the lanes of that head at the end) */
    const int my_u = li / G, my_g = li % G;
    float l_own = 0.f;
    (void)my_u; (void)my_g; (void)l_own;

    for (int t = 0; t < n_tiles; t++) {
        const int stage = t % kStages;
        if (threadIdx.x == 0 && t >= 1 && t - 1 + kStages < n_tiles) {
            const int ps = (t - 1) % kStages;
            mbar_wait(&empty_bar[ps], (unsigned)(((t - 1) / kStages) & 1));
            issue(t - 1 + kStages, ps);
        }
        mbar_wait(&full_bar[stage], (unsigned)((t / kStages) & 1));
        const uint4 *sk = reinterpret_cast<const uint4 *>(smem + (size_t)stage * 2 * C::TILE_BYTES);
        const uint4 *sv = sk + C::TILE_BYTES / 16;
        const int r0 = tile_row0(t);
        const int nvalid = min(C::ROWS, end - r0);
        const int wrow0 = warp * C::RW;
        if constexpr (C::BFLY) {
            float v[C::U * G];
#pragma unroll
            for (int u = 0; u < C::U; u++) {
                const int rr = wrow0 + u * C::RPW + rg;
                float kx[C::VEC];
                cvt16(sk[rr * (C::RB / 16) + li], kx, T());
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float a = 0.f;
#pragma unroll
                    for (int i = 0; i < C::VEC; i++) a = fmaf(qr[g][i], kx[i], a);
                    v[u * G + g] = a;
                }
            }
            /* butterfly: at offset o, lanes with bit o keep the upper half */
            butterfly<C::LPR / 2>(v, li);
            const int my_rr = wrow0 + my_u * C::RPW + rg;
            const bool my_ok = my_rr < nvalid;
            const float sc = my_ok ? v[0] * scale2 : -INFINITY;
            if (logits) s_lg[warp][my_g][my_u * C::RPW + rg] = v[0] * scale;
            /* tile max per head: over the lanes of that head (offsets that
             * are multiples of G, and the other row groups) */
            float tm = sc;
#pragma unroll
            for (int o = G; o < 32; o <<= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float mx = __shfl_sync(0xffffffffu, tm, g);
                if (mx > m[g]) {
                    const float corr = fast_exp2(m[g] - mx);
#pragma unroll
                    for (int i = 0; i < C::VEC; i++) acc[g][i] *= corr;
                    if (g == my_g) l_own *= corr;
                    m[g] = mx;
                }
            }
            float mine = 0.f;
#pragma unroll
            for (int g = 0; g < G; g++)
                if (g == my_g) mine = m[g];
            const float p_own = my_ok ? fast_exp2(sc - mine) : 0.f;
            l_own += p_own;
#pragma unroll
            for (int u = 0; u < C::U; u++) {
                const int rr = wrow0 + u * C::RPW + rg;
                float pu[G];
#pragma unroll
                for (int g = 0; g < G; g++) pu[g] = __shfl_sync(0xffffffffu, p_own, rg * C::LPR + u * G + g);
                if (rr < nvalid) {
                    float vx[C::VEC];
                    cvt16(sv[rr * (C::RB / 16) + li], vx, T());
#pragma unroll
                    for (int g = 0; g < G; g++)
#pragma unroll
                        for (int i = 0; i < C::VEC; i++) acc[g][i] = fmaf(pu[g], vx[i], acc[g][i]);
                }
            }
        } else {
            float s2[C::U][G];
#pragma unroll
            for (int u = 0; u < C::U; u++) {
                const int rr = wrow0 + u * C::RPW + rg;
                float kx[C::VEC];
                cvt16(sk[rr * (C::RB / 16) + li], kx, T());
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float a = 0.f;
#pragma unroll
                    for (int i = 0; i < C::VEC; i++) a = fmaf(qr[g][i], kx[i], a);
#pragma unroll
                    for (int off = C::LPR / 2; off > 0; off >>= 1)
                        a += __shfl_xor_sync(0xffffffffu, a, off);
                    s2[u][g] = rr < nvalid ? a * scale2 : -INFINITY;
                    if (logits && li == g) s_lg[warp][g][u * C::RPW + rg] = a * scale;
                }
            }
#pragma unroll
            for (int g = 0; g < G; g++) {
                float mx = m[g];
#pragma unroll
                for (int u = 0; u < C::U; u++) mx = fmaxf(mx, s2[u][g]);
#pragma unroll
                for (int off = C::LPR; off < 32; off <<= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                if (mx > m[g]) {
                    const float corr = fast_exp2(m[g] - mx);
                    l[g] *= corr;
#pragma unroll
                    for (int i = 0; i < C::VEC; i++) acc[g][i] *= corr;
                    m[g] = mx;
                }
            }
#pragma unroll
            for (int u = 0; u < C::U; u++) {
                const int rr = wrow0 + u * C::RPW + rg;
                if (rr < nvalid) {
                    float vx[C::VEC];
                    cvt16(sv[rr * (C::RB / 16) + li], vx, T());
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        const float p = fast_exp2(s2[u][g] - m[g]);
                        l[g] += p;
#pragma unroll
                        for (int i = 0; i < C::VEC; i++) acc[g][i] = fmaf(p, vx[i], acc[g][i]);
                    }
                }
            }
        }
        /* every thread releases the stage itself (not one lane per warp
         * after a __syncwarp): then each read is ordered before the refill
         * by the barrier alone, which compute-sanitizer's racecheck can
         * follow */
        mbar_arrive(&empty_bar[stage]);
        if (logits) {
            __syncwarp();
            for (int i = lane; i < G * C::RW; i += 32) {
                const int g = i / C::RW, rr = i % C::RW, r = r0 + wrow0 + rr;
                if (r < end && r >= n_compact)
                    logits[((size_t)b * H + hb + g) * ld + rb + (r - n_compact)] = s_lg[warp][g][rr];
            }
            __syncwarp();
        }
    }
    if constexpr (C::BFLY) {
        /* l of head g, row group rg: the sum over the lanes li = u*G + g */
#pragma unroll
        for (int o = G; o < C::LPR; o <<= 1) l_own += __shfl_xor_sync(0xffffffffu, l_own, o);
#pragma unroll
        for (int g = 0; g < G; g++) l[g] = __shfl_sync(0xffffffffu, l_own, rg * C::LPR + g);
    }
    /* m is warp-uniform here, so merging the row groups is a plain sum */
#pragma unroll
    for (int off = C::LPR; off < 32; off <<= 1) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
#pragma unroll
            for (int i = 0; i < C::VEC; i++) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], off);
        }
    }
    /* the next kernel may start launching now: earlier, its CTAs would
     * share the SMs with this streaming loop (measured slower) */
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    __syncthreads(); /* the pipeline buffers become the merge buffers */
    split_epilogue<G, D, C::VEC>(reinterpret_cast<float *>(smem), warp, rg, li, m, l, acc, b, hb,
                                 pair, H, split, ns, part_ml, part_acc, counters, out, out_b);
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
 * cases keep selected below recent_begin as sfi(7) MANAGED STATE requires). */
__device__ __forceinline__ const float *exact_row(const sfi_gpu_step_desc *d, const float *pool,
                                                  const float *comp, int b, int kvh, int r,
                                                  int sparse, int n_compact, int rb) {
    int pos;
    return row_ptr<float>(d, pool, comp, b, kvh, r, sparse, n_compact, rb, &pos);
}

__global__ void exact_logits_kernel(const sfi_gpu_step_desc *__restrict__ d,
                                    const float *__restrict__ q, const float *__restrict__ kp,
                                    const float *__restrict__ ck, int mode,
                                    float *__restrict__ rowbuf, int ld, float *__restrict__ logits) {
    const int h = blockIdx.y, b = blockIdx.z, D = d->head_dim;
    const int G = d->n_heads / d->n_kv, kvh = h / G;
    const sfi_gpu_req rq = d->req[b];
    if (req_idle(mode, rq)) return;
    const int sparse = req_sparse(mode, rq);
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

__global__ void exact_softmax_kernel(const sfi_gpu_step_desc *__restrict__ d, int mode,
                                     float *__restrict__ rowbuf, int ld) {
    const int h = blockIdx.x, b = blockIdx.y;
    const sfi_gpu_req rq = d->req[b];
    if (req_idle(mode, rq)) return;
    const int sparse = req_sparse(mode, rq);
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
                                 int mode, const float *__restrict__ rowbuf, int ld,
                                 float *__restrict__ out) {
    const int h = blockIdx.x, b = blockIdx.y, dd = threadIdx.x, D = d->head_dim;
    const int G = d->n_heads / d->n_kv, kvh = h / G;
    const sfi_gpu_req rq = d->req[b];
    if (req_idle(mode, rq)) return;
    const int sparse = req_sparse(mode, rq);
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

/* Per host thread: `sfi-gpu run --tp N` drives each GPU from its own
 * thread, and these settings (like the one-time state below, which is per
 * device) belong to that thread's device. */
thread_local int g_waves = 1;
thread_local int g_stages = 3;
thread_local int g_pdl = 0;

/* Split size: one CTA per SM and wave (g_waves, default 1), the SMs shared
 * evenly by the (request, KV head) pairs. With batch 16 x 8 KV heads that
 * is one split per pair: measured on the H100, one CTA per SM streaming a
 * whole pair beat two per SM with two splits (the second CTA and the
 * split merge cost 10-20 us per launch: sfi-gpu bench's rows-per-split
 * and grid-size sweeps), while small batches still spread each pair over
 * many SMs. Short rows (fast steps) keep at least kMinSplitRows rows
 * per split, since a split costs a start-up and the last one a merge; one
 * split writes the output directly. At most MAX_SPLITS. With head slices
 * (the model's group n_heads / n_kv a multiple n_sl > 1 of G) each
 * (request, KV head) has n_sl CTAs per split, and they share the SMs as
 * pairs do. */
template <typename T, int D, int G, int S>
cudaError_t launch_split(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, const float *q,
                         const void *kp, const void *vp, const void *ck, const void *cv,
                         int mode, int max_rows, float *logits, float *out,
                         const sfi_gpu_attn_ws *ws, cudaStream_t st) {
    using C = BulkCfg<T, D, G, S>;
    const int n_sl = h->n_heads / (h->n_kv * G);
    auto kern = n_sl > 1 ? attn_bulk_kernel<T, D, G, S, true> : attn_bulk_kernel<T, D, G, S, false>;
    /* opt in to more than 48 KiB of dynamic shared memory and read the SM
     * count (once per instantiation; no allocation) */
    static thread_local int sms = 0; /* per thread = per device (--tp) */
    if (!sms) {
        cudaError_t e = cudaFuncSetAttribute(attn_bulk_kernel<T, D, G, S, false>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(attn_bulk_kernel<T, D, G, S, true>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM);
        if (e != cudaSuccess) return e;
        int dev = 0;
        if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
        if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
            return e;
    }
    const long pairs = (long)h->batch * h->n_kv * n_sl;
    long splits = (long)(ws->waves > 0 ? ws->waves : g_waves) * sms / pairs;
    if (splits > max_rows / kMinSplitRows) splits = max_rows / kMinSplitRows;
    if (mode == kModeMixed && ws->min_split_rows > 0) {
        const int dmin = ws->dense_min_rows > 0 ? ws->dense_min_rows : ws->min_split_rows;
        splits = (max_rows + dmin - 1) / dmin;
        if (splits < ws->fast_splits) splits = ws->fast_splits;
    }
    if (splits > SFI_GPU_MAX_SPLITS) splits = SFI_GPU_MAX_SPLITS;
    if (splits < 1) splits = 1;
    long chunk = (max_rows + splits - 1) / splits;
    chunk = (chunk + C::ROWS - 1) / C::ROWS * C::ROWS;
    while ((max_rows + chunk - 1) / chunk > SFI_GPU_MAX_SPLITS) chunk += C::ROWS;
    const int ns = (int)((max_rows + chunk - 1) / chunk);
    dim3 grid(ns * n_sl, h->n_kv, h->batch);
    /* mixed mode: each request sizes its own splits on the device */
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kWarps * 32);
    cfg.dynamicSmemBytes = C::SMEM;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = g_pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kern, d, q, (const T *)kp, (const T *)vp, (const T *)ck,
                              (const T *)cv, mode,
                              mode == kModeMixed ? -ws->min_split_rows : (int)chunk,
                              mode == kModeMixed ? ws->dense_min_rows : 0, logits,
                              ws->part_ml, ws->part_acc, ws->counters, out,
                              (__nv_bfloat16 *)ws->out_bf16, ws->fuse);
}

#define SFI_LAUNCH(G_, S_) \
    launch_split<T, D, G_, S_>(h, d, q, kp, vp, ck, cv, mode, rows, logits, out, ws, st)

/* The query heads a CTA takes for a group of G (the rest of the group
 * goes to further head slices, launch_split): the largest instantiated
 * size that divides G, 0 for none. Qwen3-235B-A22B's 16 -> 2 slices of 8,
 * Qwen3-14B's 5 -> one CTA of 5, 6 -> 2 of 3, 12 -> 3 of 4, 7 -> 7 of 1;
 * D = 16 (the test fixtures) has groups of 2 only. */
int slice_heads(int G, int D) {
    if (G < 1 || G > SFI_GPU_MAX_GROUP) return 0;
    if (D == 16) return G % 2 == 0 ? 2 : 0;
    static const int k_sizes[] = {8, 5, 4, 3, 2, 1};
    for (int g : k_sizes)
        if (G % g == 0) return g;
    return 0;
}

template <typename T, int D>
cudaError_t dispatch_g(int G, const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                       const float *q, const void *kp, const void *vp, const void *ck,
                       const void *cv, int mode, int rows, float *logits, float *out,
                       const sfi_gpu_attn_ws *ws, cudaStream_t st) {
    const int gs = slice_heads(G, D);
    if constexpr (D == 16) { /* the test fixtures' shape only */
        return gs == 2 ? SFI_LAUNCH(2, 3) : cudaErrorInvalidValue;
    } else {
    switch (gs) {
    case 1: return SFI_LAUNCH(1, 3);
    case 2:
        if (sizeof(T) == 2 && D == 128 && g_stages == 4) return SFI_LAUNCH(2, 4);
        if (sizeof(T) == 2 && D == 128 && g_stages == 6) return SFI_LAUNCH(2, 6);
        /* 7 x 32 KiB: the deepest pipeline in an SM's 227 KiB (the fast body) */
        if (sizeof(T) == 2 && D == 128 && g_stages == 7) return SFI_LAUNCH(2, 7);
        return SFI_LAUNCH(2, 3);
    case 3: return SFI_LAUNCH(3, 3); /* sfi-small-qwen3: 6 heads over 2 */
    case 5: return SFI_LAUNCH(5, 3); /* Qwen3-14B: 40 heads over 8 */
    case 4:
        /* the benchmarked shape: the bench's sweep may pick another depth */
        if (sizeof(T) == 2 && D == 128 && g_stages == 2) return SFI_LAUNCH(4, 2);
        if (sizeof(T) == 2 && D == 128 && g_stages >= 4) return SFI_LAUNCH(4, 4);
        return SFI_LAUNCH(4, 3);
    case 8: return SFI_LAUNCH(8, 3);
    default: return cudaErrorInvalidValue;
    }
    }
}
#undef SFI_LAUNCH

cudaError_t attn_common(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                        const float *q, const void *kp, const void *vp, const void *ck,
                        const void *cv, int mode, float *out, float *logits,
                        const sfi_gpu_attn_ws *ws, int exact, cudaStream_t st) {
    const int D = h->head_dim, G = h->n_heads / h->n_kv;
    int max_rows = 0;
    for (int b = 0; b < h->batch; b++) {
        const sfi_gpu_req *r = &h->req[b];
        const int ns = r->n_compact + (r->ctx_len - r->recent_begin);
        const int n = mode == kModeSparse ? ns
                      : mode == kModeMixed && ws->fast_rows > 0 ? ws->fast_rows
                      : mode == kModeMixed                      ? max(ns, r->ctx_len)
                                                                : r->ctx_len;
        if (n > max_rows) max_rows = n;
    }
    if (max_rows <= 0) return cudaErrorInvalidValue;
    if (exact) {
        if (dtype != SFI_GPU_F32) return cudaErrorInvalidValue;
        /* row buffer: the partial-acc scratch holds MAX_SPLITS*D floats
         * per head, enough for rows up to that many positions */
        const int ld = SFI_GPU_MAX_SPLITS * D;
        if (max_rows > ld) return cudaErrorInvalidValue;
        float *rowbuf = ws->part_acc;
        dim3 g1((max_rows + 127) / 128, h->n_heads, h->batch);
        exact_logits_kernel<<<g1, 128, 0, st>>>(d, q, (const float *)kp, (const float *)ck,
                                                mode, rowbuf, ld, logits);
        exact_softmax_kernel<<<dim3(h->n_heads, h->batch), 32, 0, st>>>(d, mode, rowbuf, ld);
        exact_out_kernel<<<dim3(h->n_heads, h->batch), D, 0, st>>>(
            d, (const float *)vp, (const float *)cv, mode, rowbuf, ld, out);
        return cudaGetLastError();
    }
    cudaError_t e;
    if (dtype == SFI_GPU_BF16) {
        if (D == 128)
            e = dispatch_g<__nv_bfloat16, 128>(G, h, d, q, kp, vp, ck, cv, mode, max_rows, logits, out, ws, st);
        else if (D == 64)
            e = dispatch_g<__nv_bfloat16, 64>(G, h, d, q, kp, vp, ck, cv, mode, max_rows, logits, out, ws, st);
        else if (D == 16)
            e = dispatch_g<__nv_bfloat16, 16>(G, h, d, q, kp, vp, ck, cv, mode, max_rows, logits, out, ws, st);
        else
            return cudaErrorInvalidValue;
    } else {
        if (D == 128)
            e = dispatch_g<float, 128>(G, h, d, q, kp, vp, ck, cv, mode, max_rows, logits, out, ws, st);
        else if (D == 64)
            e = dispatch_g<float, 64>(G, h, d, q, kp, vp, ck, cv, mode, max_rows, logits, out, ws, st);
        else if (D == 16)
            e = dispatch_g<float, 16>(G, h, d, q, kp, vp, ck, cv, mode, max_rows, logits, out, ws, st);
        else
            return cudaErrorInvalidValue;
    }
    return e;
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

cudaError_t sfi_gpu_fill_random(void *p, size_t n, int dtype, uint32_t seed, float scale,
                                cudaStream_t st) {
    fill_kernel<<<132 * 16, 256, 0, st>>>(p, n, dtype, seed, scale);
    return cudaGetLastError();
}

cudaError_t sfi_gpu_noop(cudaStream_t st) {
    noop_kernel<<<1, 32, 0, st>>>();
    return cudaGetLastError();
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
    ws->waves = 0;
    ws->min_split_rows = 0;
    ws->dense_min_rows = 0;
    ws->fast_splits = 0;
    ws->fast_rows = 0;
    ws->out_bf16 = nullptr;
    ws->fuse = sfi_gpu_attn_fuse{};
}

cudaError_t sfi_gpu_attn_ws_init(const sfi_gpu_attn_ws *ws, cudaStream_t st) {
    return cudaMemsetAsync(ws->counters, 0, (size_t)ws->n_counters * sizeof(int), st);
}

int sfi_gpu_attn_slices(int G, int head_dim) {
    if (head_dim != 16 && head_dim != 64 && head_dim != 128) return 0;
    const int gs = slice_heads(G, head_dim);
    return gs > 0 ? G / gs : 0;
}

void sfi_gpu_set_pdl(int on) { g_pdl = on != 0; }
int sfi_gpu_pdl(void) { return g_pdl; }

void sfi_gpu_attn_set_waves(int waves) { g_waves = waves > 0 ? waves : 1; }
void sfi_gpu_attn_set_stages(int stages) {
    g_stages = stages == 2 || stages == 4 || stages == 6 || stages == 7 ? stages : 3;
}

cudaError_t sfi_gpu_attn_dense(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                               const float *q, const void *k_pool, const void *v_pool, float *out,
                               float *logits, const sfi_gpu_attn_ws *ws, int exact, cudaStream_t st) {
    return attn_common(h, d, dtype, q, k_pool, v_pool, nullptr, nullptr, 0, out, logits, ws,
                       exact, st);
}

cudaError_t sfi_gpu_attn_mixed(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                               const float *q, const void *k_pool, const void *v_pool, const void *ck,
                               const void *cv, float *out, float *logits, const sfi_gpu_attn_ws *ws,
                               int exact, cudaStream_t st) {
    return attn_common(h, d, dtype, q, k_pool, v_pool, ck, cv, kModeMixed, out, logits, ws,
                       exact, st);
}

cudaError_t sfi_gpu_attn_sparse(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                                const float *q, const void *k_pool, const void *v_pool, const void *ck,
                                const void *cv, const int32_t *comp_pos, float *out,
                                const sfi_gpu_attn_ws *ws, int exact, cudaStream_t st) {
    (void)comp_pos; /* rows are already in ascending position order */
    return attn_common(h, d, dtype, q, k_pool, v_pool, ck, cv, 1, out, nullptr, ws, exact, st);
}

cudaError_t sfi_gpu_key_norms(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                              const void *k_pool, float *norms, cudaStream_t st) {
    dim3 grid((h->max_ctx + 7) / 8, h->n_kv, h->batch);
    if (dtype == SFI_GPU_BF16)
        key_norms_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>(d, (const __nv_bfloat16 *)k_pool, norms);
    else
        key_norms_kernel<float><<<grid, 256, 0, st>>>(d, (const float *)k_pool, norms);
    return cudaGetLastError();
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
