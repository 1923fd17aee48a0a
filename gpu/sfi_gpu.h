/* The CUDA path of SFI (sfi(7) GPU PATH): kernels a serving engine needs
 * for SFI decode steps, as a C API over the CUDA runtime.
 *
 * Memory layouts (all device memory, row-major, innermost last):
 *   paged KV cache of one layer: k_pool/v_pool [n_blocks][n_kv][page][D]
 *     (a block holds `page` consecutive positions of every KV head, so a
 *     (request, KV head) pair reads page*D contiguous elements per block);
 *   block table: [batch][max_blocks] int32 block ids, position p of request
 *     b lives in block block_table[b][p / page], row p % page;
 *   queries q: [batch][n_heads][D] float32; query head h uses KV head
 *     h / G (G = n_heads / n_kv, the GQA group);
 *   outputs: [batch][n_heads][D] float32;
 *   logits (slow steps): [batch][n_heads][ld_logits] float32, the scaled
 *     pre-softmax scores q.k/sqrt(D) at every position 0..ctx_len-1; for a
 *     decode step (W = 1) row (b, kvh*G + g) is window query g of KV head
 *     kvh, i.e. the Selector input layout [n_kv][n_win][n_pos];
 *   compact buffer (two-segment layout, per layer): ck/cv
 *     [batch][n_kv][compact_cap][D], rows 0..n_sink-1 = sink, then the
 *     selected positions in ascending order;
 *   key norms: [batch][n_kv][ld_logits] float32, ||k_h(j)||_2, the cached
 *     statistic the Selector's prior reads.
 *
 * No function here allocates device memory: the caller sizes a workspace
 * once (sfi_gpu_ws_bytes) and every decode-path call only launches kernels
 * on the stream it is given.
 *
 * Errors, one convention for gpu/: the kernel launchers (this header and
 * sfi_gpu_model.h) return cudaError_t, as CUDA's own launch APIs do:
 * cudaSuccess, the launch's error, or cudaErrorInvalidValue /
 * cudaErrorNotSupported for arguments they cannot take. The C modules
 * above them (engine, verify, the sfi-gpu commands) speak sfi_status with
 * a message like the rest of sfi, and turn a cudaError_t into one through
 * SFI_GPU_STATUS (sfi_gpu_status.h), which names the failed call; only a
 * failure with a better message of its own (the engine's out-of-memory)
 * is worded by hand. */
#ifndef SFI_GPU_H
#define SFI_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SFI_GPU_MAX_BATCH 64
/* Largest GQA group (query heads per KV head) the kernels take: a decode
 * attention CTA takes up to 8 (or 5) of them, a larger group is split
 * into head slices (sfi_gpu_attn.cu); the Selector sums over all of them. */
#define SFI_GPU_MAX_GROUP 16
/* Most splits of the flash-decoding partition per (request, head). */
#define SFI_GPU_MAX_SPLITS 1024

typedef enum { SFI_GPU_F32 = 0, SFI_GPU_BF16 = 1 } sfi_gpu_dtype;

/* One request's entry of the per-step descriptor. */
typedef struct {
    int32_t ctx_len;      /* cached positions, the current token included */
    int32_t recent_begin; /* first position of the recent window */
    int32_t n_compact;    /* rows of the compact buffer in use (sink+sel) */
    int32_t j_begin;      /* J = [j_begin, j_end) for the Selector */
    int32_t j_end;
    int32_t flags; /* SFI_GPU_REQ_* (0: dense, active) */
    int32_t pad[2];
} sfi_gpu_req;

/* sfi_gpu_req.flags, read by the attention kernels in mixed mode (the
 * engine's batch steps, where each request is slow or fast on its own):
 * SPARSE: this request's step is fast (two-segment rows); IDLE: the
 * request has finished, the attention skips it (its output rows are left
 * as they are). The Selector, Top-K and reorg skip a request whose J is
 * empty (j_end <= j_begin); the reorg still refreshes its sink rows. */
#define SFI_GPU_REQ_SPARSE 1
#define SFI_GPU_REQ_IDLE 2
/* ALT (the engine's deferred refresh, two buffers per layer): the
 * request's compact rows and selected set are row b + alt_rows of the
 * compact buffer and of selected (the second buffer) instead of row b;
 * read by the attention (sparse rows), the Top-K and the reorg. */
#define SFI_GPU_REQ_ALT 4

/* The packed per-step descriptor: built once per decode step on the host,
 * copied to device memory with one cudaMemcpyAsync, read by every kernel of
 * the step (cache boundaries, block-table pointer, layout strides). The
 * host keeps its copy too: grid sizes come from its max_* fields. */
typedef struct {
    int32_t batch, n_heads, n_kv, head_dim;
    int32_t page;        /* positions per KV block */
    int32_t max_blocks;  /* block-table row stride */
    int32_t ld_logits;   /* logits / key-norm row stride (>= max ctx) */
    int32_t compact_cap; /* compact-buffer rows per (request, KV head) */
    int32_t n_sink;
    int32_t K;                  /* selected positions per KV head */
    int32_t max_ctx;            /* max ctx_len over the batch (host: grids) */
    int32_t max_J;              /* max |J| over the batch (also the Selector
                             scratch row stride) */
    int32_t n_win;              /* Selector window rows per KV head: 0 = G (a
                             decode step, W = 1); W * G for a window of
                             W queries (prefill), logits row (b, kvh, w)
                             at ((b * n_kv + kvh) * n_win + w) * ld_logits */
    int32_t alt_rows;           /* row offset of the second compact / selected
                             buffer (SFI_GPU_REQ_ALT); 0: none */
    const int32_t *block_table; /* device pointer */
    sfi_gpu_req req[SFI_GPU_MAX_BATCH];
} sfi_gpu_step_desc;

/* Selector parameters (sfi(7) SELECTOR), as in sfi_params. */
typedef struct {
    float alpha, gamma, beta, p, eta, lambda_clip, alpha_soft, T, alpha_cross, eps;
    int nms_radius;
} sfi_gpu_sel_params;

/* The q/k norm, RoPE and KV append of the current token made inside the
 * attention (the engine's bf16 decode steps, sfi_gpu_attn_ws.fuse): each
 * CTA makes its query heads from the raw QKV row of its request, and the
 * CTA whose rows end at the current position first appends its key
 * (normed, rotated, ||k|| into key_norms) and value, with the arithmetic
 * of sfi_gpu_qkv_post's warp form, so the results are the same bits.
 * Head dimension 128, bf16, one CTA per (request, KV head, split) (no
 * head slices), no QKV biases, at most 6 query heads a KV head. */
typedef struct {
    const float *qkv;             /* [batch][(n_heads + 2 n_kv) D], this step's rows; NULL: off */
    const float *q_norm, *k_norm; /* [D] */
    const float *cs, *sn;         /* RoPE tables [pos][D / 2] */
    float eps;
    float *key_norms; /* [batch][n_kv][ld_norms], or NULL */
    int ld_norms;
} sfi_gpu_attn_fuse;

/* Device scratch of one attention call (split partials, and the counters
 * by which the last CTA of a (request, KV head) finds it is last). Zero the
 * counters once with sfi_gpu_attn_ws_init; the kernels leave them zero. */
typedef struct {
    float *part_ml;  /* [batch][n_heads][MAX_SPLITS][2] (max in log2 units, sum) */
    float *part_acc; /* [batch][n_heads][MAX_SPLITS][D] */
    int *counters;   /* [batch][n_kv] (sized batch * n_heads) */
    int n_counters;
    /* grid size of calls with this workspace, in waves of one CTA per SM
     * (0 = the default, 1). A slow step overlapped with the Selector may
     * want 2: smaller CTAs, so a pair whose SM is shared with Selector
     * CTAs does not hold up the whole layer. */
    int waves;
    /* mixed-mode calls (sfi_gpu_attn_mixed) with min_split_rows > 0: the
     * grid has ceil(rows / min_split_rows) splits per (request, KV head)
     * and each request uses as many as its own rows need at that size, so
     * one long dense request among short sparse ones is still spread over
     * many SMs. 0: the default rule (waves of one CTA per SM). */
    int min_split_rows;
    /* with min_split_rows: dense (slow) requests' own floor of rows per
     * split (0: min_split_rows), so that small splits meant for short fast
     * rows do not cut a slow request's context into hundreds of pieces;
     * and the fewest splits of the grid (0: none), so that a fast request
     * gets its ceil(rows / min_split_rows) */
    int dense_min_rows;
    int fast_splits;
    /* mixed-mode calls: when > 0, no request of the step is dense (the
     * engine's step graph for steps without a slow request) and none has
     * more rows than this, so the grid is sized for them instead of the
     * context */
    int fast_rows;
    /* when set, the fast kernels also write the output rounded to bf16
     * here ([batch][n_heads][D]): the next GEMM's input, without a
     * conversion launch */
    void *out_bf16;
    /* when fuse.qkv is set, the kernels make q and append the current
     * token's K/V themselves (sfi_gpu_attn_fuse; q is then not read) */
    sfi_gpu_attn_fuse fuse;
} sfi_gpu_attn_ws;

/* Device scratch of one Selector call (one ring slot). Each [batch][n_kv]
 * [max_J] float32, plus lambda [batch][n_kv]. */
typedef struct {
    float *f, *r, *z1, *z2;
    float *lambda;
} sfi_gpu_sel_ws;

size_t sfi_gpu_attn_ws_bytes(int batch, int n_heads, int head_dim);
void sfi_gpu_attn_ws_carve(sfi_gpu_attn_ws *ws, void *base, int batch, int n_heads, int head_dim);
cudaError_t sfi_gpu_attn_ws_init(const sfi_gpu_attn_ws *ws, cudaStream_t st);
size_t sfi_gpu_sel_ws_bytes(int batch, int n_kv, int max_J);
void sfi_gpu_sel_ws_carve(sfi_gpu_sel_ws *ws, void *base, int batch, int n_kv, int max_J);

/* Head slices of the decode attention per (request, KV head) for groups
 * of G query heads at head_dim D: 1 when one CTA takes the whole group,
 * n > 1 when n CTAs take G/n heads each (sfi_gpu_attn.cu), 0 when the
 * kernels do not take the shape. Every G in 1..SFI_GPU_MAX_GROUP at D =
 * 64 and 128, even G at D = 16 (the test fixtures' shape). */
int sfi_gpu_attn_slices(int G, int head_dim);

/* Grid size of the split attention kernels in waves of one CTA per SM
 * (default 1; see launch_split in sfi_gpu_attn.cu). For the benchmark's
 * sweep; a setting of the calling host thread (one thread per GPU under
 * sfi-gpu run --tp). */
void sfi_gpu_attn_set_waves(int waves);
/* Pipeline depth of the bf16, D = 128, G = 4 instance: 2, 3 (default) or
 * 4 stages of 64-row tiles. Same purpose. */
void sfi_gpu_attn_set_stages(int stages);

/* Attention of a batch step whose requests are each dense or fast by
 * their flags (SFI_GPU_REQ_SPARSE, SFI_GPU_REQ_IDLE): one launch for the
 * whole batch. The split size is chosen per request on the device from
 * its own row count, so the host copy h only sizes the grid: give it the
 * largest rows a request can have (the run's capacity), and the same
 * launch stays valid for every later step (CUDA graph replay). logits
 * (may be NULL) are written for the dense requests. */
cudaError_t sfi_gpu_attn_mixed(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                               const float *q, const void *k_pool, const void *v_pool,
                               const void *ck, const void *cv, float *out, float *logits,
                               const sfi_gpu_attn_ws *ws, int exact, cudaStream_t st);

/* Dense decode attention over the paged cache, positions 0..ctx_len-1 of
 * each request; writes out and, when logits != NULL, the scaled logits.
 * h: host copy of the descriptor, d: the same in device memory. exact = 1
 * selects the bit-exact f32 path (the reference's order of operations and
 * its exp, one thread per sequential sum; slow, for the checker). */
cudaError_t sfi_gpu_attn_dense(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                               const float *q, const void *k_pool, const void *v_pool, float *out,
                               float *logits, const sfi_gpu_attn_ws *ws, int exact,
                               cudaStream_t st);

/* Fast-step attention on the two-segment layout: rows 0..n_compact-1 of the
 * compact buffer, then positions recent_begin..ctx_len-1 in place in the
 * paged cache. exact as above. */
cudaError_t sfi_gpu_attn_sparse(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                                const float *q, const void *k_pool, const void *v_pool,
                                const void *ck, const void *cv, const int32_t *comp_pos, float *out,
                                const sfi_gpu_attn_ws *ws, int exact, cudaStream_t st);

/* Key norms ||k(j)||_2 for positions [0, ctx_len) (cached statistic). */
cudaError_t sfi_gpu_key_norms(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                              const void *k_pool, float *norms, cudaStream_t st);

/* Selector steps 1-8 and Top-K for one layer: reads logits (n_win = G
 * window queries per KV head, decode W = 1) and key norms, writes
 * selected [batch][n_kv][K] ascending absolute positions (K_out =
 * min(K, |J|) per request; the rest untouched). s_out (may be NULL):
 * [batch][n_kv][max_J] the fused distribution s; lambda lands in ws.
 * exact = 1: the reference's sequential sums (bit-exact). */
cudaError_t sfi_gpu_selector(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                             const sfi_gpu_sel_params *prm, const float *logits,
                             const float *key_norms, const sfi_gpu_sel_ws *ws, float *s_out,
                             int32_t *selected, int exact, cudaStream_t st);

/* sfi_gpu_selector in two halves, for tensor parallelism (sfi-gpu run
 * --tp), where step 8's softmax over a layer's KV heads needs every
 * rank's scores: _local runs steps 1-7 for this rank's n_kv heads, z2 into
 * ws->z2 (rows [batch][n_kv][max_J]); _pack copies the rows of the
 * requests whose J is not empty, the i-th such request (batch order) to
 * slot i < n_slots, into send [n_slots][n_kv][max_J] (n_slots at least
 * that count: the rest are not sent); the caller all-gathers every rank's
 * send into z_all [n_ranks][n_slots][n_kv][max_J]; _cross_tp runs step 8
 * over all n_ranks * n_kv heads (<= 16) in their global order and step 9
 * (Top-K) for this rank's heads (global heads rank * n_kv ..). With one
 * rank the three compute what sfi_gpu_selector does, bit for bit. */
cudaError_t sfi_gpu_selector_local(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                                   const sfi_gpu_sel_params *prm, const float *logits,
                                   const float *key_norms, const sfi_gpu_sel_ws *ws, float *s_out,
                                   int exact, cudaStream_t st);
cudaError_t sfi_gpu_selector_pack(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                                  const sfi_gpu_sel_ws *ws, int n_slots, float *send,
                                  cudaStream_t st);
cudaError_t sfi_gpu_selector_cross_tp(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                                      const sfi_gpu_sel_params *prm, const float *z_all,
                                      int n_slots, int n_ranks, int rank, const sfi_gpu_sel_ws *ws,
                                      int32_t *selected, int exact, cudaStream_t st);

/* Deterministic Top-K of rows of scores (radix select, ties to the smaller
 * index), one row per (request, KV head): row length n[b] = j_end - j_begin,
 * row stride ld; writes j_begin + index ascending into out [rows][K].
 * Exposed for the checker. */
cudaError_t sfi_gpu_topk(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d,
                         const float *scores, int ld, int32_t *out, cudaStream_t st);

/* Reorg: compact rows = sink 0..n_sink-1 then selected[b][kvh][0..K_out),
 * copied from the paged cache; sets nothing in the descriptor (the host
 * sets n_compact = n_sink + K_out for the next fast steps). comp_pos
 * (may be NULL) receives each row's position. */
cudaError_t sfi_gpu_reorg(const sfi_gpu_step_desc *h, const sfi_gpu_step_desc *d, int dtype,
                          const void *k_pool, const void *v_pool, const int32_t *selected, void *ck,
                          void *cv, int32_t *comp_pos, cudaStream_t st);

/* Two-stream slow step over n_layers (sfi(7) GPU PATH): main stream
 * runs Attn_i; after it, the side (lower-priority) stream runs Sel_i then
 * Reorg_i using ring slot i mod R (R = 4) for logits and Selector scratch;
 * an event per slot guards reuse; the main stream waits once at the end.
 * Layer i uses kv[i] / compact[i] / selected[i] (arrays of n_layers
 * pointers; entries may repeat). overlap = 0 runs everything on the main
 * stream in order (the baseline). */
#define SFI_GPU_RING 4
typedef struct {
    int n_layers;
    const void *const *k_pool, *const *v_pool;
    void *const *ck, *const *cv;
    int32_t *const *selected;
    const float *q;
    float *out;
    const float *const *key_norms;
    float *logits[SFI_GPU_RING];
    sfi_gpu_sel_ws sel_ws[SFI_GPU_RING];
    sfi_gpu_attn_ws attn_ws;
    cudaEvent_t ev_attn[SFI_GPU_RING], ev_free[SFI_GPU_RING], ev_done;
    cudaStream_t main_st, side_st;
} sfi_gpu_slow_plan;

cudaError_t sfi_gpu_slow_step(const sfi_gpu_slow_plan *pl, const sfi_gpu_step_desc *h,
                              const sfi_gpu_step_desc *d, int dtype, const sfi_gpu_sel_params *prm,
                              int overlap);

/* Utilities for tests and benchmarks: uniform values in [-scale, scale)
 * from a counter hash of (seed, index) (n elements of dtype); an empty
 * kernel (launch-overhead measurement). */
cudaError_t sfi_gpu_fill_random(void *p, size_t n, int dtype, uint32_t seed, float scale,
                                cudaStream_t st);
cudaError_t sfi_gpu_noop(cudaStream_t st);

/* Programmatic dependent launch for the launches that follow (the
 * engine's decode steps): each kernel may start while the one before it
 * in the stream finishes, and waits (griddepcontrol.wait) before reading
 * its results. Default off; per host thread, as the waves. */
void sfi_gpu_set_pdl(int on);
int sfi_gpu_pdl(void);

/* 1 when a usable CUDA device is present; else 0 and why in msg. A probe
 * (the callers' skip), not a failed call: its reason is worded here, as
 * the .cu files never see sfi_status. */
int sfi_gpu_device_ok(char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif
