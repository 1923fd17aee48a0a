/* The Qwen3 forward pass on the GPU, as kernels the engine
 * (sfi_gpu_engine.h) strings together: embedding, RMSNorm, the bit-exact
 * matrix-vector product, q/k norm + RoPE + paged KV append, SwiGLU,
 * Qwen3-MoE routing and experts, greedy argmax, causal prefill attention,
 * the Selector's prefill window logits and the per-step plan (trigger
 * decisions and the step descriptor, made on the device).
 *
 * exact = 1 selects the bit-exact f32 variants: every sum is one
 * sequential loop in the reference's order (ref/sfi_qwen3.c's header
 * says which), every float operation an explicit round-to-nearest
 * intrinsic, exp through sfi_dev_expf: the bits equal sfi-ref's scalar
 * backend. Dense GEMMs of the fast path are cuBLAS calls made by the
 * engine, not here.
 *
 * Every function launches on the stream it is given, allocates nothing
 * and returns a cudaError_t (the convention: sfi_gpu.h). */
#ifndef SFI_GPU_MODEL_H
#define SFI_GPU_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "sfi_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x[t][0..H) = float(E[tok[t]][0..H)), E of dtype [V][H]. */
cudaError_t sfi_gpu_embed(const int32_t *tok, int T, const void *E, int dtype, int H, float *x,
                          cudaStream_t st);

/* RMSNorm of T rows of n: y = w * (x * (1 / sqrt(mean(x^2) + eps))).
 * yf (f32) and yb (bf16) may each be NULL. */
cudaError_t sfi_gpu_rmsnorm(const float *x, const float *w, int T, int n, float eps, float *yf,
                            void *yb, int exact, cudaStream_t st);

/* Bit-exact Y[t][i] (= or +=) (sum_j W[i][j] X[t][j] ascending) + b[i];
 * accumulate: Y[t][i] = Y[t][i] + that (the reference's h += tmp). */
cudaError_t sfi_gpu_gemv_exact(const float *W, const float *X, const float *b, float *Y, int T,
                               int M, int N, int accumulate, cudaStream_t st);

/* y[t][i] += b[i] */
cudaError_t sfi_gpu_add_bias(float *y, const float *b, int T, int M, cudaStream_t st);

/* After the QKV product: per token t, qkv[t] = [q heads | k heads | v
 * heads] (f32). Adds the biases (may be NULL), RMSNorms each q and k head
 * (q_norm, k_norm), rotates them (RoPE tables cs/sn [pos][D/2]), writes q
 * to q_out [T][n_heads][D] and appends k and v at position pos into the
 * paged pools of dtype (row rq of the block table), with ||k|| into
 * key_norms[rq][kvh][pos] (stride ld_norms; may be NULL). Position and
 * row of token t: pos_arr[t] / row_arr[t] when given, else pos0 + t /
 * row0 (row0 < 0: row t). A negative position skips the token (a
 * finished request). */
typedef struct {
    const float *qkv;
    const float *bq, *bk, *bv;
    const float *q_norm, *k_norm;
    const float *cs, *sn;
    const int32_t *pos_arr, *row_arr;
    int pos0, row0;
    int T, n_heads, n_kv, head_dim;
    float eps;
    const int32_t *block_table;
    int max_blocks, page;
    void *k_pool, *v_pool;
    int dtype;
    float *key_norms;
    int ld_norms;
    float *q_out;
} sfi_gpu_qkv_args;
cudaError_t sfi_gpu_qkv_post(const sfi_gpu_qkv_args *a, int exact, cudaStream_t st);

/* act[t][i] = silu(gate) * up from the fused product gu [T][2I]: the gate
 * rows first, then the up rows, or (tiled) in the gate/up tiles of
 * sfi_gpu_gemm_skinny's SwiGLU form; act is f32 or bf16 (adtype). */
cudaError_t sfi_gpu_silu_mul(const float *gu, int T, int I, int tiled, void *act, int adtype,
                             int exact, cudaStream_t st);

/* bf16 copy of n floats. */
cudaError_t sfi_gpu_to_bf16(const float *x, size_t n, void *y, cudaStream_t st);

/* out[t] = argmax of logits[t][0..V), ties to the smaller id. When
 * active is given, rows whose active[t] is 0 are left alone. slots: T
 * zeroed 64-bit words of scratch (left zeroed again). */
cudaError_t sfi_gpu_argmax(const float *logits, int T, int V, const int32_t *active, int32_t *out,
                           unsigned long long *slots, cudaStream_t st);

/* Decode GEMM on tensor cores over W bf16 [M][N] and X bf16 [T][N] (T <=
 * 64, N a multiple of 32), in a fixed summation order. epi 0: Y f32
 * [T][M] = X W^T; 1: Y += X W^T; 2 (SwiGLU): W's rows are gate/up tiles
 * (rows 16j..16j+7 the gate rows 8j..8j+7, rows 16j+8..16j+15 the same up
 * rows) and Y is bf16 act [T][M/2] = silu(gate) * up. */
#define SFI_GPU_EPI_STORE 0
#define SFI_GPU_EPI_ACCUMULATE 1
#define SFI_GPU_EPI_SWIGLU 2
cudaError_t sfi_gpu_gemm_skinny(const void *W, const void *X, void *Y, int T, int M, int N, int epi,
                                cudaStream_t st);
/* sfi_gpu_gemm_skinny of X = RMSNorm(x) * norm_w (x f32 [T][N], the
 * residual; rmsnorm_kernel's formula) without materialising X: the norm
 * is made inside the GEMM's CTAs, saving the norm's launch. Only the
 * shared-memory (slab) kernel does this, and under the default selection
 * only while T * N <= 4096 (every CTA reads the whole residual):
 * cudaErrorNotSupported, with nothing launched, where it does not apply
 * (the caller then runs sfi_gpu_rmsnorm and sfi_gpu_gemm_skinny). */
cudaError_t sfi_gpu_gemm_norm(const void *W, const float *x, const float *norm_w, float eps,
                              void *Y, int T, int M, int N, int epi, cudaStream_t st);
/* The deferred RMSNorm of the decode GEMMs (bf16 slab products; the
 * engine on one GPU, see sfi-gpu(1)). A product that adds into the
 * residual (SFI_GPU_EPI_ACCUMULATE) also writes its updated rows in bf16
 * (xb_out, [T][M]) and their sums of squares over each 8 columns (ss_out,
 * [T][M / 8]); the next product takes those bf16
 * rows as its X, its weights' columns already scaled by the norm's
 * weights (sfi_gpu_scale_cols), and scales each token's outputs by
 * rsqrt(sum / N + eps) of ss_in ([T][N / 8], summed in a fixed order).
 * The RMSNorm launch between the two is gone. */
typedef struct {
    const float *ss_in; /* consumer: partial sums of squares, or NULL */
    float *ss_out;      /* producer (accumulate epilogue), or NULL */
    void *xb_out;       /* producer: the updated rows in bf16 */
    float eps;
} sfi_gpu_rownorm;
/* sfi_gpu_gemm_skinny with a deferred norm (rn): only the slab kernel
 * does this; cudaErrorNotSupported, with nothing launched, where it does
 * not apply (sfi_gpu_gemm_rownorm_applies says so beforehand; consumer:
 * with ss_in, whose partial sums take shared memory too). */
cudaError_t sfi_gpu_gemm_rownorm(const void *W, const void *X, void *Y, int T, int M, int N,
                                 int epi, const sfi_gpu_rownorm *rn, cudaStream_t st);
int sfi_gpu_gemm_rownorm_applies(int T, int M, int N, int epi, int consumer);
/* W bf16 [M][N] in place: column k times w[k] (f32), rounded to bf16. */
cudaError_t sfi_gpu_scale_cols(void *W, int M, int N, const float *w, cudaStream_t st);
/* sfi_gpu_embed that also writes the rows in bf16 (xb [T][H]) and the
 * sums of squares of each 8 columns (ss [T][H / 8]), as a deferred-norm
 * producer does; H a multiple of 8. */
cudaError_t sfi_gpu_embed_rownorm(const int32_t *tok, int T, const void *E, int dtype, int H,
                                  float *x, float *ss, void *xb, cudaStream_t st);
/* Which kernel sfi_gpu_gemm_skinny runs: SFI_GPU_GEMM_SLAB (default:
 * weights staged through shared memory by bulk copies for the products
 * where that measured faster -- at most 13 MiB of weights and a side of
 * at most 1024, or with slab_max_mb >= 0 every product of at most that
 * many MiB; the others stream through registers) or SFI_GPU_GEMM_REGS
 * (always through registers). Per host thread; for checks and
 * experiments. */
#define SFI_GPU_GEMM_SLAB 0
#define SFI_GPU_GEMM_REGS 1
void sfi_gpu_gemm_select(int kernel, int slab_max_mb);
/* Where the slab kernel's programmatic-dependent-launch trigger sits: 0
 * after its products (default), 1 right after its wait for the kernel
 * before it, so that the next product's CTAs take their SMs and request
 * their weights while this one computes. On one H100 (Qwen3-0.6B batch
 * 16, 32K) 1 gave fast steps 2.578 -> 2.551 ms but steps with a slow
 * request 5.20 -> 5.36 ms (the Selector chain's CTAs on the side stream
 * find the SMs taken); a trigger before the wait, 2.549 and 5.44 ms. Per
 * host thread. */
void sfi_gpu_gemm_set_trigger(int after_wait);
/* Split-K scratch of sfi_gpu_gemm_skinny (device): part_floats floats of
 * partial sums (64 * M per split) and max_tiles zeroed counters (M / 16
 * row tiles); without it every product runs unsplit. Per host thread
 * (each GPU of sfi-gpu run --tp has its own thread and scratch). */
void sfi_gpu_gemm_set_ws(float *part, size_t part_floats, int *counters, int max_tiles);

/* Qwen3-MoE routing of T tokens from router logits rl[t][E] (turned into
 * probabilities in place): softmax,
 * the top `top` experts by probability (ties to the smaller expert),
 * weights divided by their sum when norm; writes sel_e[t][k] in
 * ascending expert order and sel_w[t][k] their weights. */
cudaError_t sfi_gpu_moe_route(float *rl, int T, int E, int top, int norm, int32_t *sel_e,
                              float *sel_w, int exact, cudaStream_t st);

/* Expert products for the T*top (token, expert) pairs: y[p][0..M) =
 * W_e[M][N] x[t] with e = sel_e[p], t = p / top, W_e = w[e] (an array of
 * E device pointers of dtype). x is f32 [T][N] (x_stride floats per
 * token) or, for the down projection, per pair (x_per_pair: [T*top][N]). */
cudaError_t sfi_gpu_moe_gemv(void *const *w, int dtype, const int32_t *sel_e, int T, int top,
                             const float *x, int x_per_pair, int M, int N, float *y, int exact,
                             cudaStream_t st);

/* h[t][i] = h[t][i] + (sum over k ascending of y[t*top+k][i] * w[t][k]),
 * the sum from 0 (the reference's acc). */
cudaError_t sfi_gpu_moe_combine(float *h, const float *y, const float *sel_w, int T, int top, int H,
                                int exact, cudaStream_t st);

/* The grouped form of the experts (prefill; sfi_gpu_moe.h). Counting sort
 * of the pairs p = 0..pairs-1 by expert sel_e[p] in [0, E): cnt[e] = how
 * many pairs chose e, pos[p] = p's row in the sorted order (expert by
 * expert ascending, pair order inside an expert; deterministic). */
cudaError_t sfi_gpu_moe_sort(const int32_t *sel_e, int pairs, int E, int32_t *cnt, int32_t *pos,
                             cudaStream_t st);
/* xs[pos[p]] = x[p / top] (rows of H floats) converted to dtype (bf16 or
 * f32): the GEMM input of every pair in sorted order. */
cudaError_t sfi_gpu_moe_gather(const float *x, int H, int top, int pairs, const int32_t *pos,
                               void *xs, int dtype, cudaStream_t st);
/* sfi_gpu_moe_combine (its summation order) over y in sorted order: pair
 * t*top+k's row is y[pos[t*top+k]]. */
cudaError_t sfi_gpu_moe_combine_pos(float *h, const float *y, const int32_t *pos,
                                    const float *sel_w, int T, int top, int H, cudaStream_t st);

/* Causal attention of a prefill chunk: queries q [T][n_heads][D] (f32) at
 * positions pos0..pos0+T-1 of request row `row`, over keys 0..pos of each
 * in the paged pools (already appended); out [T][n_heads][D] f32. bf16
 * pools with D 64 or 128 use tensor cores (mma.sync); other shapes return
 * cudaErrorNotSupported (the engine then uses the decode kernels). */
cudaError_t sfi_gpu_prefill_attn(const float *q, int T, int pos0, int row, int n_heads, int n_kv,
                                 int head_dim, const int32_t *block_table, int max_blocks, int page,
                                 const void *k_pool, const void *v_pool, int dtype, float *out,
                                 cudaStream_t st);

/* Window logits for the Selector at prefill (method.md section 4, W > 1):
 * for the nw queries qwin [nw][n_heads][D] (f32, roped) at positions
 * first..first+nw-1 of request row `row`, the scaled logits over
 * positions 0..n_ctx-1 (-inf past a query's own position), written as
 * rows (kvh * nw * G + w * G + g) * ld of out: the reference's window
 * order. Sums as the reference's (sequential over D, then * scale). */
cudaError_t sfi_gpu_window_logits(const float *qwin, int nw, int first, int n_ctx, int row,
                                  int n_heads, int n_kv, int head_dim, const int32_t *block_table,
                                  int max_blocks, int page, const void *k_pool, int dtype,
                                  float *out, int ld, cudaStream_t st);

/* Random weights: p[i] = offset + uniform[-scale, scale) from a counter
 * hash of (seed, i). */
cudaError_t sfi_gpu_fill_uniform(void *p, size_t n, int dtype, uint32_t seed, float scale,
                                 float offset, cudaStream_t st);

/* ---- the per-step plan (trigger decisions on the device) ---- */

/* Trigger policies, as sfi_trigger_kind (ref/sfi_state.h). */
typedef struct {
    int batch;
    int sfi;    /* 1: SFI mode; 0: dense (every step slow, ALWAYS) */
    int policy; /* sfi_trigger_kind value */
    int T_max, interval;
    int n_sink, n_recent, K;
    int max_new;           /* steps per request (step 0 is the prefill's) */
    int32_t stop_token;    /* -1: none */
    int32_t stop_more[16]; /* more tokens that stop (a config's eos list) */
    int n_stop_more;
    const uint8_t *is_trigger; /* device [n_vocab] 0/1, may be NULL */
    int32_t n_vocab;
    const int32_t *force; /* device [batch][max_new] teacher-forced inputs, or NULL */
    /* deferred refresh (refresh_delay d >= 2; 0 off): a slow step's sets
     * are computed during the next step into the request's second buffer
     * and made active at step t + d (see sfi_gpu_plan_step) */
    int refresh_delay;
} sfi_gpu_plan_cfg;

/* Device state the plan kernel and the end-of-step kernel keep. */
typedef struct {
    int32_t step; /* the step being run (1 = first decode step) */
    /* set by the end of step t: how many requests step t + 1 runs the
     * Selector chain for (slow then, or their sink not yet whole in the
     * cache; every active one with deferred refresh), at least as many
     * as will have a Selector (J not empty); read by the host under tensor
     * parallelism to replay the step without the chain (0) or with the
     * scores' all-gather sized for that many */
    int32_t next_slow;
    int32_t ctx[SFI_GPU_MAX_BATCH]; /* cached positions, current token's included */
    int32_t since_slow[SFI_GPU_MAX_BATCH];
    int32_t active[SFI_GPU_MAX_BATCH];
    int32_t kout[SFI_GPU_MAX_BATCH];   /* |selected| at the last slow step */
    int32_t tok[SFI_GPU_MAX_BATCH];    /* x_{t-1}: the last generated token */
    int32_t in_tok[SFI_GPU_MAX_BATCH]; /* this step's input */
    int32_t pos[SFI_GPU_MAX_BATCH];    /* this step's position, -1: idle */
    /* deferred refresh */
    int32_t buf[SFI_GPU_MAX_BATCH];       /* active buffer (0, 1: SFI_GPU_REQ_ALT) */
    int32_t pend[SFI_GPU_MAX_BATCH];      /* slow step whose sets are pending; 0: none */
    int32_t kpend[SFI_GPU_MAX_BATCH];     /* their |selected| */
    int32_t installed[SFI_GPU_MAX_BATCH]; /* slow step whose sets this step made active; -1 */
} sfi_gpu_run_state;

/* Start of a step: advances st->step, decides each active request's kind
 * (step 0 is the prefill's), sets its input token and position and the
 * descriptor d->req[b] (ctx_len, recent window, compact rows, J for the
 * Selector when slow, flags), and records kind | reason << 4 into
 * hist_kind[step][b].
 * Deferred refresh (cfg->refresh_delay = d >= 2): d->req[b] carries no J
 * (the step's Selector does not run for it); a slow step t records its J's
 * size as pending (dropping a pending set not yet active); at step t + 1,
 * unless slow again, dsel->req[b] (only req[] is written) gives step t's
 * ctx_len and J with the flag of the inactive buffer, for the Selector and
 * reorg of that step (idle for every other request); at the start of step
 * t + d the pending buffer becomes the active one (buf, kout; installed[b]
 * = t). A fast step reads the active buffer (SFI_GPU_REQ_ALT when it is
 * the second). dsel may be NULL when the delay is 0. */
cudaError_t sfi_gpu_plan_step(const sfi_gpu_plan_cfg *cfg, sfi_gpu_run_state *st,
                              sfi_gpu_step_desc *d, sfi_gpu_step_desc *dsel, int32_t *hist_kind,
                              cudaStream_t st_);

/* End of a step: tok[b] = next[b] for active requests, hist_tok[step][b]
 * = it; a request stops after max_new steps or its stop token; and
 * st->next_slow (above) from the plan's trigger rules. */
cudaError_t sfi_gpu_end_step(const sfi_gpu_plan_cfg *cfg, sfi_gpu_run_state *st,
                             const int32_t *next, int32_t *hist_tok, cudaStream_t st_);

/* Sets the condition h of a step graph's conditional node to whether no
 * request needs the Selector chain in the step about to run
 * (st->next_slow == 0, written by the last step's sfi_gpu_end_step):
 * the body without the chain and with the fast-only attention grid. One
 * thread, no PDL (a graph's first node). */
cudaError_t sfi_gpu_set_step_cond(cudaGraphConditionalHandle h, const sfi_gpu_run_state *st,
                                  cudaStream_t st_);

#ifdef __cplusplus
}
#endif
#endif
