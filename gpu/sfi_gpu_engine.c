/* The GPU decode engine; see sfi_gpu_engine.h.
 *
 * One step of the batch (step t >= 1; step 0 is each request's prefill):
 *   plan (device: trigger decisions, descriptor) -> embedding ->
 *   per layer: RMSNorm -> QKV GEMM -> q/k norm + RoPE + KV append (+ key
 *   norm; inside the attention in steps without a slow request,
 *   sfi_gpu_attn_fuse) -> attention (one launch: dense with logits for
 *   slow requests, two-segment sparse for fast ones) -> [second stream:
 *   Selector, Top-K, reorg of this layer, ring slot layer mod R] -> O GEMM
 *   (+= residual) ->
 *   RMSNorm -> gate/up GEMM -> SwiGLU -> down GEMM (+= residual) or the
 *   MoE experts -> final RMSNorm -> LM head GEMM -> argmax -> end of step
 *   (device: next inputs, histories).
 * Every launch reads the step's descriptor from device memory and sizes
 * its grid for the run's capacity, so the same sequence serves every step
 * and is captured once into a CUDA graph.
 *
 * Deferred refresh (refresh_delay = d >= 2, sfi(7) DECODE LOOP): a slow
 * request's attention writes its logits into a buffer per layer (kept
 * until the next step, not the ring) and no Selector runs in that step.
 * In step t + 1 the side stream, forked right after the plan kernel, runs
 * every layer's Selector, Top-K and reorg for the requests slow at t (and
 * not slow again) through a second descriptor (d_dsel, written by the
 * plan kernel) into their inactive buffer: each layer has two selected /
 * compact buffers, rows b and b + max_batch, picked per request by
 * SFI_GPU_REQ_ALT. The main stream reads only active buffers; the plan
 * kernel of step t + d flips the request's active buffer. The side stream
 * joins at the very end of the step (after the argmax), so the Selector
 * overlaps the whole fast step; nothing of it is left in the slow step. */
#include <config.h>

#include "sfi_gpu_engine.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "sfi_clock.h"
#include "sfi_digest.h"
#include "sfi_gpu.h"
#include "sfi_gpu_model.h"
#include "sfi_gpu_moe.h"
#include "sfi_gpu_nccl.h"
#include "sfi_gpu_status.h"
#include "sfi_gpu_tp.h"
#include "sfi_state.h"

#define R_SLOTS SFI_GPU_RING
#define SEL_CLASSES 7 /* slot counts 1, 2, 4, .., 64 (SFI_GPU_MAX_BATCH) */
/* pseudo-requests per prefill attention call of the decode kernels */
#define PF_PSEUDO 64

typedef struct {
    float *in_norm, *post_norm, *q_norm, *k_norm; /* f32 */
    void *wqkv;                                   /* [nq + 2 nkv][H] */
    float *bqkv;                                  /* [nq + 2 nkv] or NULL */
    void *wo;                                     /* [H][nq] */
    float *bo;                                    /* [H] or NULL */
    int moe;
    void *wgu;              /* [2 I][H] */
    void *wd;               /* [H][I] */
    float *router;          /* [E][H] f32 */
    void **e_gu, **e_d;     /* device arrays of E pointers */
    void **h_e_gu, **h_e_d; /* host copies (for freeing) */
} dlayer;

struct sfi_gpu_engine {
    sfi_model_config c;
    sfi_gpu_engine_opts o;
    sfi_gpu_engine_mem mem;
    int L, H, nh, nkv, D, G, nq, nkvd, V, I, E, top, Im, esz, exact;
    int gu_tiled; /* gate/up rows in SwiGLU tiles (bf16 fast path) */
    /* timing experiments only (SFI_GPU_SKIP=norm,qkv,attn,gemm,allreduce,
     * reorg,selchain,tailN,lmhead): decode steps leave those launches out (reorg:
     * the Selector chain's reorg; selchain: its Selector and Top-K; tailN:
     * the whole chain of the last N layers), so results are wrong but the
     * step's time without them can be measured inside the graph */
    int skip_norm, skip_qkv, skip_attn, skip_gemm, skip_ar, skip_reorg, skip_sel, skip_tail;
    int skip_lm;
    /* the attention makes q and appends K/V (sfi_gpu_attn_fuse): 0 never,
     * 1 in steps without a slow request (the fast body), 2 in every step */
    int qkv_fuse;
    int decoding;  /* inside enqueue_layers (where the skips apply) */
    int fuse_norm; /* decode GEMMs make their RMSNorm input themselves (1) */
    /* decode steps run the deferred RMSNorm (sfi_gpu_rownorm; one GPU,
     * bf16, dense layers, every product on the slab kernel): no norm
     * launch in a layer, QKV and gate/up weights folded with the norms'
     * weights, ss the producers' partial sums of squares [T][H / 8] */
    int dnorm;
    float *ss;
    int moe_grouped; /* prefill MoE layers run the grouped experts (1) */
    /* tensor parallelism (sfi_gpu_engine_opts): nh, nkv, nq, nkvd, I, Im
     * above are this rank's share, V the whole vocabulary of which this
     * rank's LM head has rows [v0, v0 + Vl) (Vc per rank but the last) */
    int tp, rank, Vl, v0, Vc, nkv_g, nq_g, I_g, Im_g;
    void *comm;
    unsigned long long *amax_keys, *amax_all; /* argmax keys [64], gathered [tp][64] */
    float *z_all;        /* Selector scores gathered, a [tp][B][nkv][capJ] block per ring slot */
    size_t z_all_floats; /* one slot's */
    float *lg_all;       /* observed logits gathered [B][tp][Vc] */
    int32_t *sel_all;    /* observed sets gathered [tp][nkv][K] */
    int cap;             /* positions per request */
    int max_blocks, ld, capJ, ccap, rows_act;
    float eps;
    /* weights */
    void *embed, *lm_head;
    float *final_norm;
    dlayer *lay;
    uint64_t weight_bytes;
    /* state */
    void **kp, **vp, **ck, **cv; /* per layer */
    float **knorm;               /* per layer [B][nkv][ld] */
    int32_t **sel;               /* per layer [B][nkv][K] */
    int32_t *bt, *bt_pf;         /* block table [B][max_blocks]; prefill pseudo [64][max_blocks] */
    float *cs, *sn;              /* RoPE tables [cap][D/2] */
    float *logits_ring[R_SLOTS];
    int defer;                 /* deferred refresh (refresh_delay >= 2, SFI mode) */
    float *lg_keep;            /* deferred: [L][B][nh][ld] a step's logits, kept a step */
    sfi_gpu_step_desc *d_dsel; /* deferred: the Selector's descriptor */
    sfi_gpu_sel_ws sel_ws[R_SLOTS];
    void *sel_ws_mem[R_SLOTS];
    sfi_gpu_attn_ws attn_ws;
    void *attn_ws_mem;
    float *win;  /* prefill window logits [nkv][Wmax*G][ld] */
    float *qwin; /* [L][Wmax][nh][D] */
    int Wmax;
    /* activations, rows_act rows */
    float *x, *xn, *qkv, *q, *att, *gu, *act_f, *logits;
    void *xn_b, *att_b, *act_b;
    float *rl, *sel_w, *y1, *y2, *act2;
    int32_t *sel_e;
    int32_t *moe_cnt, *moe_pos, *h_moe_cnt; /* grouped experts (sfi_gpu_moe.h) */
    int32_t *next;
    unsigned long long *slots; /* argmax scratch [64] */
    float *gemm_part;          /* split-K partials of the decode GEMMs */
    int *gemm_cnt;
    size_t gemm_part_floats;
    int gemm_tiles;
    int32_t *d_prompt; /* [cap] prompt ids of the request in prefill */
    uint8_t *d_trig;
    /* run */
    sfi_gpu_step_desc h_cap; /* grid-sizing host descriptor (capacity) */
    sfi_gpu_step_desc *d_desc, *d_desc1;
    sfi_gpu_step_desc *h_pin; /* pinned staging for descriptor uploads */
    sfi_gpu_run_state *d_state;
    int32_t *hist_kind, *hist_tok; /* [max_new][B] */
    int32_t *d_force;              /* [B][max_new] */
    sfi_gpu_plan_cfg plan;
    cublasHandle_t blas;
    void *blas_ws;
    cudaStream_t main_st, side_st;
    cudaEvent_t ev_attn[R_SLOTS], ev_free[R_SLOTS], ev_done, ev_plan;
    cudaEvent_t ev_gath[R_SLOTS]; /* tp > 1: a layer's scores all-gathered */
    cudaGraphExec_t graph_exec;
    int cond_graphs;         /* graph_exec picks its body on the device (capture_cond_step) */
    int stages, fast_stages; /* attention pipeline depth, and in the fast body */
    /* enqueueing the step body for steps with no slow request (one GPU's
     * conditional node, the step without the chain under --tp, an eager
     * step that needs no chain): no Selector chain, the fast rows'
     * attention grid and pipeline, the GEMMs' early trigger */
    int fast_body;
    int slab_trigger; /* the fast body's GEMMs trigger early (SFI_GPU_SLAB_TRIGGER) */
    /* tp > 1, SFI: a second graph of the step without the Selector chain
     * (pick_graph); the host reads d_state->next_slow through h_flag */
    int sel_graphs;
    cudaGraphExec_t graph_nosel;
    /* tp > 1, SFI: the scores' all-gather carries sel_slots requests'
     * rows (the step's; the capacity batch outside sel_graphs); one graph
     * per power of two below the batch, made when first needed */
    int sel_slots;
    cudaGraphExec_t graph_slots[SEL_CLASSES];
    int32_t *h_flag; /* pinned */
    cudaEvent_t ev_step;
};

#define CK(x) SFI_GPU_RETURN_IF_FAILED(x, #x)
#define CKB(x) SFI_GPU_BLAS_RETURN_IF_FAILED(x, #x)

void sfi_gpu_engine_opts_default(sfi_gpu_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->dtype = SFI_GPU_BF16;
    o->sfi = 1;
    sfi_params_default(&o->params);
    o->trigger = SFI_TRIG_SFI;
    o->interval = 16;
    o->max_batch = 1;
    o->max_new = 16;
    o->stop_token = -1;
    o->page = 64;
    o->prefill_chunk = 2048;
    o->graphs = 1;
    o->overlap = 1;
    o->pdl = -1;
    o->qkv_fuse = -1;
    o->tp_size = 1;
}

/* ---- shape, options, memory plan ---- */

/* Head, intermediate and vocabulary counts are this rank's share under
 * tensor parallelism (tp > 1); the _g fields keep the model's. */
typedef struct {
    int L, H, nh, nkv, D, G, nq, nkvd, V, I, E, top, Im, esz, cap, max_blocks, ld, capJ, ccap,
        rows_act, Wmax, B, any_moe, any_dense;
    int tp, rank, Vl, v0, Vc, nkv_g, nq_g, I_g, Im_g;
} shape;

static int round_up(int x, int m)
{
    return (x + m - 1) / m * m;
}

/* This rank's share of the heads, MLP columns and vocabulary (tp > 1):
 * whole GQA groups (a KV head and its query heads), so every kernel runs
 * unchanged on fewer heads. */
static sfi_status tp_shape(shape *s, const sfi_gpu_engine_opts *o, sfi_error *err)
{
    const int N = o->tp_size;
    s->tp = N;
    s->rank = o->tp_rank;
    s->nkv_g = s->nkv;
    s->nq_g = s->nq;
    s->I_g = s->I;
    s->Im_g = s->Im;
    s->Vl = s->Vc = s->V;
    s->v0 = 0;
    if (N < 1 || N > 64 || o->tp_rank < 0 || o->tp_rank >= N)
        return sfi_error_set(err, SFI_ERANGE, "tensor parallelism: rank %d of %d", o->tp_rank, N);
    if (N == 1)
        return SFI_OK;
    if (s->nkv % N)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "--tp %d: the model's %d KV heads do not split over %d GPUs (each "
                             "GPU takes whole GQA groups: --tp must divide %d)",
                             N, s->nkv, N, s->nkv);
    if ((s->any_dense && s->I % N) || (s->E && s->Im % N))
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "--tp %d: the MLP width %d%s does not split over %d GPUs", N, s->I,
                             s->E ? " or the expert width" : "", N);
    s->nkv /= N;
    s->nh /= N;
    s->nq = s->nh * s->D;
    s->nkvd = s->nkv * s->D;
    if (s->any_dense)
        s->I /= N;
    s->Im /= N;
    /* vocabulary rows: ceil(V / N) per rank, the last takes the rest */
    s->Vc = (s->V + N - 1) / N;
    s->v0 = s->Vc * o->tp_rank;
    s->Vl = s->V - s->v0 < s->Vc ? s->V - s->v0 : s->Vc;
    if ((long)s->Vc * (N - 1) >= s->V)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "--tp %d: a vocabulary of %d ids leaves a GPU without LM head rows", N,
                             s->V);
    return SFI_OK;
}

static sfi_status get_shape(const sfi_model_config *c, const sfi_gpu_engine_opts *o, shape *s,
                            sfi_error *err)
{
    sfi_status rc_tp;
    memset(s, 0, sizeof *s);
    const sfi_params *p = &o->params;
    s->L = c->num_hidden_layers;
    s->H = c->hidden_size;
    s->nh = c->num_attention_heads;
    s->nkv = c->num_key_value_heads;
    s->D = c->head_dim;
    s->G = s->nkv > 0 ? s->nh / s->nkv : 0;
    s->nq = s->nh * s->D;
    s->nkvd = s->nkv * s->D;
    s->V = c->vocab_size;
    s->I = c->intermediate_size;
    s->E = c->arch == SFI_ARCH_QWEN3_MOE ? c->num_experts : 0;
    s->top = c->arch == SFI_ARCH_QWEN3_MOE ? c->num_experts_per_tok : 0;
    s->Im = c->arch == SFI_ARCH_QWEN3_MOE ? c->moe_intermediate_size : 0;
    s->esz = o->dtype == SFI_GPU_BF16 ? 2 : 4;
    s->B = o->max_batch;
    for (int l = 0; l < s->L; l++) {
        if (c->arch == SFI_ARCH_QWEN3_MOE && sfi_model_layer_is_moe(c, l))
            s->any_moe = 1;
        else
            s->any_dense = 1;
    }
    if (o->dtype != SFI_GPU_BF16 && o->dtype != SFI_GPU_F32)
        return sfi_error_set(err, SFI_EINVAL, "dtype: expected bf16 or f32");
    if (o->exact && o->dtype != SFI_GPU_F32)
        return sfi_error_set(err, SFI_EINVAL, "--exact needs --dtype f32 (the reference's bits)");
    if (o->max_batch < 1 || o->max_batch > SFI_GPU_MAX_BATCH)
        return sfi_error_set(err, SFI_ERANGE, "batch %d: the engine takes 1..%d requests",
                             o->max_batch, SFI_GPU_MAX_BATCH);
    if (o->max_new < 1)
        return sfi_error_set(err, SFI_EINVAL, "max-new %d: must be >= 1", o->max_new);
    if (s->D != 16 && s->D != 64 && s->D != 128)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "head_dim %d: the GPU kernels take 16, 64 or 128", s->D);
    if (s->G < 1 || s->nh % s->nkv || s->nkv > 16 || !sfi_gpu_attn_slices(s->G, s->D))
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "%d query heads over %d KV heads: the GPU kernels take groups of "
                             "1 to %d query heads (an even number at head_dim 16) and at most "
                             "16 KV heads",
                             s->nh, s->nkv, SFI_GPU_MAX_GROUP);
    if (s->E && (s->top < 1 || s->top > 64 || s->top > s->E || s->H > 12288 || s->Im > 12288))
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "MoE with %d experts, %d per token, hidden %d, expert width %d: "
                             "the GPU experts take 1..64 per token and widths up to 12288",
                             s->E, s->top, s->H, s->Im);
    if (o->sfi && p->W_decode != 1)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "W_decode=%d: the GPU engine implements W_decode = 1 (method.md's "
                             "decode default)",
                             p->W_decode);
    if (o->sfi && p->refresh_delay != 0 && (p->refresh_delay < 2 || p->refresh_delay > 4))
        return sfi_error_set(err, SFI_ERANGE, "refresh_delay=%d: expected 0 (off) or 2..4",
                             p->refresh_delay);
    if (o->page < 1 || o->page > 4096)
        return sfi_error_set(err, SFI_ERANGE, "page %d: expected 1..4096", o->page);
    if (o->prefill_chunk < 1)
        return sfi_error_set(err, SFI_ERANGE, "prefill chunk %d: must be >= 1", o->prefill_chunk);
    if ((rc_tp = tp_shape(s, o, err)))
        return rc_tp;
    if (o->max_ctx < 2 || o->max_ctx > c->max_position_embeddings)
        return sfi_error_set(err, SFI_ERANGE,
                             "context %d positions: must be in 2..%d (the model's "
                             "max_position_embeddings)",
                             o->max_ctx, c->max_position_embeddings);
    s->cap = o->max_ctx;
    s->max_blocks = (s->cap + o->page - 1) / o->page;
    s->ld = round_up(s->cap, 64);
    s->capJ =
        round_up(s->cap - p->n_sink - p->n_recent > 1 ? s->cap - p->n_sink - p->n_recent : 1, 4);
    s->ccap = p->n_sink + p->K;
    int Wmax = p->W_prefill < s->cap ? p->W_prefill : s->cap;
    if (Wmax < 1)
        Wmax = 1;
    s->Wmax = Wmax;
    if (o->sfi && Wmax * s->G > 512)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "W_prefill=%d with %d query heads per KV head: the GPU Selector "
                             "takes at most 512 window rows",
                             p->W_prefill, s->G);
    if (o->exact && (long)s->cap > (long)SFI_GPU_MAX_SPLITS * s->D)
        return sfi_error_set(err, SFI_EUNSUPPORTED,
                             "--exact with %d positions: the bit-exact attention takes at most "
                             "%d at head_dim %d",
                             s->cap, SFI_GPU_MAX_SPLITS * s->D, s->D);
    int chunk = o->exact ? PF_PSEUDO : o->prefill_chunk;
    s->rows_act = chunk > s->B ? chunk : s->B;
    if (s->rows_act < PF_PSEUDO)
        s->rows_act = PF_PSEUDO;
    return SFI_OK;
}

sfi_status sfi_gpu_engine_mem_plan(const sfi_model_config *c, const sfi_gpu_engine_opts *o,
                                   sfi_gpu_engine_mem *m, sfi_error *err)
{
    memset(m, 0, sizeof *m);
    shape s;
    sfi_status rc = get_shape(c, o, &s, err);
    if (rc)
        return rc;
    uint64_t es = (uint64_t)s.esz;
    uint64_t w = 0;
    /* the embedding whole; the LM head's rows of this rank (tied: a view
     * of the embedding) */
    w += (uint64_t)s.V * s.H * es + (c->tie_word_embeddings ? 0 : (uint64_t)s.Vl * s.H * es) +
         (uint64_t)s.H * 4;
    for (int l = 0; l < s.L; l++) {
        w += (uint64_t)(2 * s.H + 2 * s.D) * 4;
        w += (uint64_t)(s.nq + 2 * s.nkvd) * s.H * es + (uint64_t)s.H * s.nq * es;
        if (c->attention_bias)
            w += (uint64_t)(s.nq + 2 * s.nkvd + s.H) * 4;
        if (c->arch == SFI_ARCH_QWEN3_MOE && sfi_model_layer_is_moe(c, l))
            w += (uint64_t)s.E * s.H * 4 + (uint64_t)s.E * 3 * s.Im * s.H * es +
                 (uint64_t)s.E * 2 * sizeof(void *);
        else
            w += (uint64_t)3 * s.I * s.H * es;
    }
    m->weights = w;
    uint64_t B = (uint64_t)s.B;
    m->kv = (uint64_t)s.L * B * s.max_blocks * o->page * s.nkvd * es * 2;
    if (o->sfi) {
        /* a deferred refresh keeps two selected / compact buffers, one
         * Selector scratch slot (its Selector runs on one stream) and a
         * step's logits of every layer instead of the ring */
        const int dfr = o->params.refresh_delay >= 2;
        const uint64_t nbuf = dfr ? 2 : 1, slots = dfr ? 1 : R_SLOTS;
        m->compact = nbuf * ((uint64_t)s.L * B * s.nkv * s.ccap * s.D * es * 2 +
                             (uint64_t)s.L * B * s.nkv * o->params.K * 4);
        m->key_norms = (uint64_t)s.L * B * s.nkv * s.ld * 4;
        m->selector = slots * sfi_gpu_sel_ws_bytes(s.B, s.nkv, s.capJ);
        m->logits = (dfr ? (uint64_t)s.L : (uint64_t)R_SLOTS) * B * s.nh * s.ld * 4 +
                    (uint64_t)s.nkv * s.Wmax * s.G * s.ld * 4 + (uint64_t)s.L * s.Wmax * s.nq * 4;
    }
    uint64_t rows = (uint64_t)s.rows_act;
    int Iw = s.I > s.Im ? s.I : s.Im;
    uint64_t act = rows * (s.H * 3ull + (s.nq + 2ull * s.nkvd) + 2ull * s.nq + 2ull * Iw + Iw) * 4 +
                   rows * (s.H + s.nq + Iw) * 2 + (B * s.Vc + (s.tp > 1 ? s.Vc : 0)) * 4ull +
                   64 * 4 + (s.H / 8 + 1) * 64ull * 4 /* the deferred norm's sums */;
    if (s.E) {
        uint64_t pairs = rows * s.top;
        act += rows * s.E * 4 + pairs * (4 + 4) + pairs * (2ull * s.Im + s.Im + s.H) * 4;
        if (!o->exact) /* the prefill's grouped experts (their other buffers are those above) */
            act += sfi_gpu_moe_grouped_ws_bytes(s.rows_act, s.top, s.E);
    }
    m->activations = act;
    m->prefill = (uint64_t)PF_PSEUDO * s.max_blocks * 4;
    m->other =
        (uint64_t)s.cap * s.D * 4 /* RoPE tables */ +
        sfi_gpu_attn_ws_bytes(s.B > PF_PSEUDO ? s.B : PF_PSEUDO, s.nh, s.D) + B * s.max_blocks * 4 +
        (uint64_t)o->max_new * B * 4 * 3 +
        (o->sfi && o->params.refresh_delay >= 2 ? 3 : 2) * sizeof(sfi_gpu_step_desc) +
        sizeof(sfi_gpu_run_state) + (uint64_t)s.V + ((uint64_t)32 << 20) /* cuBLAS workspace */ +
        (o->dtype == SFI_GPU_BF16 && !o->exact ? ((uint64_t)8 * 64 * 4224 + 64) * 4 + 1056 : 0);
    if (s.tp > 1) {
        /* the argmax's keys, gathered; the observers' gathered logits and
         * sets; the Selector's gathered scores */
        m->other += (uint64_t)64 * 8 * (1 + s.tp) + B * s.tp * s.Vc * 4ull +
                    (uint64_t)s.nkv_g * o->params.K * 4;
        if (o->sfi)
            m->selector += R_SLOTS * B * s.nkv_g * (uint64_t)s.capJ * 4; /* per ring slot */
    }
    m->total = m->weights + m->kv + m->compact + m->key_norms + m->selector + m->logits +
               m->activations + m->prefill + m->other;
    return SFI_OK;
}

/* ---- weights ---- */

static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static sfi_status dalloc(void **p, size_t n, sfi_error *err)
{
    *p = NULL;
    if (!n)
        return SFI_OK;
    cudaError_t e = cudaMalloc(p, n);
    if (e != cudaSuccess) {
        *p = NULL;
        return sfi_error_set(err, SFI_ENOMEM, "CUDA: cannot allocate %zu bytes: %s", n,
                             cudaGetErrorString(e));
    }
    return SFI_OK;
}

/* Uploads rows of several host f32 tensors, one after another, as one
 * device tensor of dtype. */
static sfi_status upload(void *dst, int dtype, const float *const *src, const size_t *n, int k,
                         sfi_error *err)
{
    size_t total = 0;
    for (int i = 0; i < k; i++)
        total += n[i];
    size_t esz = dtype == SFI_GPU_BF16 ? 2 : 4;
    unsigned char *buf = malloc(total * esz);
    if (!buf)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory staging weights");
    size_t off = 0;
    for (int i = 0; i < k; i++) {
        if (dtype == SFI_GPU_BF16) {
            uint16_t *b = (uint16_t *)buf;
            for (size_t j = 0; j < n[i]; j++)
                b[off + j] = to_bf16(src[i][j]);
        } else {
            memcpy(buf + off * 4, src[i], n[i] * 4);
        }
        off += n[i];
    }
    cudaError_t e = cudaMemcpy(dst, buf, total * esz, cudaMemcpyHostToDevice);
    free(buf);
    CK(e);
    return SFI_OK;
}

/* A tensor: allocated, then filled from host tensors (m != NULL) or with
 * random values (offset + uniform[-scale, scale)). */
static sfi_status wtensor(sfi_gpu_engine *e, void **p, int dtype, const float *const *src,
                          const size_t *n, int k, float scale, float offset, uint32_t *seed,
                          sfi_error *err)
{
    size_t total = 0;
    for (int i = 0; i < k; i++)
        total += n[i];
    size_t esz = dtype == SFI_GPU_BF16 ? 2 : 4;
    sfi_status rc = dalloc(p, total * esz, err);
    if (rc)
        return rc;
    e->weight_bytes += total * esz;
    if (src)
        return upload(*p, dtype, src, n, k, err);
    CK(sfi_gpu_fill_uniform(*p, total, dtype, (*seed)++ * 0x9e3779b1u, scale, offset, e->main_st));
    return SFI_OK;
}

/* A tensor's host sources as pieces (wtensor's src/n lists): this rank's
 * rows and columns of the model's matrices under tensor parallelism, the
 * whole matrix otherwise. Without a checkpoint (w == NULL: random weights)
 * only the element count is kept. */
typedef struct {
    const float **src;
    size_t *n;
    int k, cap, oom, have;
} pieces;

static void piece(pieces *g, const float *p, size_t n)
{
    if (!g->have && g->k == 1) { /* random weights: one count */
        g->n[0] += n;
        return;
    }
    if (g->k == g->cap) {
        int nc = g->cap ? 2 * g->cap : 8;
        const float **ns = realloc(g->src, (size_t)nc * sizeof *ns);
        if (ns)
            g->src = ns;
        size_t *nn = realloc(g->n, (size_t)nc * sizeof *nn);
        if (nn)
            g->n = nn;
        if (!ns || !nn) {
            g->oom = 1;
            return;
        }
        g->cap = nc;
    }
    g->src[g->k] = p;
    g->n[g->k++] = n;
}

/* Columns [c0, c0 + nc) of rows [r0, r0 + nr) of w (ld columns). */
static void piece_block(pieces *g, const float *w, int r0, int nr, int ld, int c0, int nc)
{
    if (!w) {
        piece(g, NULL, (size_t)nr * nc);
        return;
    }
    if (nc == ld) {
        piece(g, w + (size_t)r0 * ld, (size_t)nr * ld);
        return;
    }
    for (int i = 0; i < nr; i++)
        piece(g, w + (size_t)(r0 + i) * ld + c0, (size_t)nc);
}

static void pieces_reset(pieces *g, int have)
{
    g->k = 0;
    g->oom = 0;
    g->have = have;
}

static void pieces_free(pieces *g)
{
    free(g->src);
    free(g->n);
}

/* wtensor from pieces */
static sfi_status wpieces(sfi_gpu_engine *e, void **p, int dtype, pieces *g, float scale,
                          float offset, uint32_t *seed, sfi_error *err)
{
    if (g->oom)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    return wtensor(e, p, dtype, g->have ? g->src : NULL, g->n, g->k, scale, offset, seed, err);
}

static sfi_status load_weights_pieces(sfi_gpu_engine *e, const sfi_qwen3 *m, uint64_t seed64,
                                      pieces *g, sfi_error *err)
{
    const sfi_model_config *c = &e->c;
    int dt = e->o.dtype, H = e->H;
    uint32_t seed = (uint32_t)(seed64 ^ (seed64 >> 32)) * 2654435761u + 1;
    sfi_status rc;
    float s_mat_h = sqrtf(3.0f / (float)H);
    const int r = e->rank, D = e->D;
#define SRC1(id, l, x) (m ? (const float *[]){sfi_qwen3_weight(m, id, l, x)} : NULL)
#define W(id, l, x) (m ? sfi_qwen3_weight(m, id, l, x) : NULL)
    {
        size_t n = (size_t)e->V * H;
        float se = c->tie_word_embeddings ? s_mat_h : sqrtf(3.0f);
        if ((rc = wtensor(e, &e->embed, dt, SRC1(SFI_W_EMBED, 0, 0), &n, 1, se, 0, &seed, err)))
            return rc;
        if (c->tie_word_embeddings) {
            /* this rank's rows of the embedding */
            e->lm_head = (char *)e->embed + (size_t)e->v0 * H * e->esz;
        } else {
            pieces_reset(g, m != NULL);
            piece_block(g, W(SFI_W_LM_HEAD, 0, 0), e->v0, e->Vl, H, 0, H);
            if ((rc = wpieces(e, &e->lm_head, dt, g, s_mat_h, 0, &seed, err)))
                return rc;
        }
        size_t nh = (size_t)H;
        if ((rc = wtensor(e, (void **)&e->final_norm, SFI_GPU_F32, SRC1(SFI_W_FINAL_NORM, 0, 0),
                          &nh, 1, 0.2f, 1.0f, &seed, err)))
            return rc;
    }
    for (int l = 0; l < e->L; l++) {
        dlayer *Ly = &e->lay[l];
        size_t nH = (size_t)H, nD = (size_t)D;
        if ((rc = wtensor(e, (void **)&Ly->in_norm, SFI_GPU_F32, SRC1(SFI_W_IN_NORM, l, 0), &nH, 1,
                          0.2f, 1.0f, &seed, err)) ||
            (rc = wtensor(e, (void **)&Ly->post_norm, SFI_GPU_F32, SRC1(SFI_W_POST_NORM, l, 0), &nH,
                          1, 0.2f, 1.0f, &seed, err)) ||
            (rc = wtensor(e, (void **)&Ly->q_norm, SFI_GPU_F32, SRC1(SFI_W_Q_NORM, l, 0), &nD, 1,
                          0.2f, 1.0f, &seed, err)) ||
            (rc = wtensor(e, (void **)&Ly->k_norm, SFI_GPU_F32, SRC1(SFI_W_K_NORM, l, 0), &nD, 1,
                          0.2f, 1.0f, &seed, err)))
            return rc;
        /* Q rows of this rank's query heads, then K and V rows of its KV
         * heads (column-parallel) */
        pieces_reset(g, m != NULL);
        piece_block(g, W(SFI_W_Q, l, 0), r * e->nq, e->nq, H, 0, H);
        piece_block(g, W(SFI_W_K, l, 0), r * e->nkvd, e->nkvd, H, 0, H);
        piece_block(g, W(SFI_W_V, l, 0), r * e->nkvd, e->nkvd, H, 0, H);
        if ((rc = wpieces(e, &Ly->wqkv, dt, g, s_mat_h, 0, &seed, err)))
            return rc;
        /* O: the columns of those query heads (row-parallel) */
        pieces_reset(g, m != NULL);
        piece_block(g, W(SFI_W_O, l, 0), 0, H, e->nq_g, r * e->nq, e->nq);
        if ((rc = wpieces(e, &Ly->wo, dt, g, sqrtf(3.0f / e->nq_g), 0, &seed, err)))
            return rc;
        if (c->attention_bias) {
            pieces_reset(g, m != NULL);
            piece_block(g, W(SFI_W_BQ, l, 0), 0, 1, e->nq_g, r * e->nq, e->nq);
            piece_block(g, W(SFI_W_BK, l, 0), 0, 1, e->nkv_g * D, r * e->nkvd, e->nkvd);
            piece_block(g, W(SFI_W_BV, l, 0), 0, 1, e->nkv_g * D, r * e->nkvd, e->nkvd);
            /* bo whole: only rank 0 adds it (to its partial sum) */
            if ((rc = wpieces(e, (void **)&Ly->bqkv, SFI_GPU_F32, g, 0.02f, 0, &seed, err)) ||
                (rc = wtensor(e, (void **)&Ly->bo, SFI_GPU_F32, SRC1(SFI_W_BO, l, 0), &nH, 1, 0.02f,
                              0, &seed, err)))
                return rc;
        }
        Ly->moe = c->arch == SFI_ARCH_QWEN3_MOE && sfi_model_layer_is_moe(c, l);
        if (!Ly->moe) {
            /* gate and up rows of this rank's share, stacked: [gate; up],
             * or in tiles of 8 gate rows then the same 8 up rows (the
             * decode GEMM's SwiGLU epilogue); down: those columns */
            const float *wg = W(SFI_W_GATE, l, 0), *wu = W(SFI_W_UP, l, 0);
            const int I = e->I, i0 = r * I;
            pieces_reset(g, m != NULL);
            if (e->gu_tiled) {
                for (int j = 0; j < I / 8; j++) {
                    piece_block(g, wg, i0 + 8 * j, 8, H, 0, H);
                    piece_block(g, wu, i0 + 8 * j, 8, H, 0, H);
                }
            } else {
                piece_block(g, wg, i0, I, H, 0, H);
                piece_block(g, wu, i0, I, H, 0, H);
            }
            if ((rc = wpieces(e, &Ly->wgu, dt, g, s_mat_h, 0, &seed, err)))
                return rc;
            pieces_reset(g, m != NULL);
            piece_block(g, W(SFI_W_DOWN, l, 0), 0, H, e->I_g, i0, I);
            if ((rc = wpieces(e, &Ly->wd, dt, g, sqrtf(3.0f / e->I_g), 0, &seed, err)))
                return rc;
        } else {
            size_t nr = (size_t)e->E * H;
            if ((rc = wtensor(e, (void **)&Ly->router, SFI_GPU_F32, SRC1(SFI_W_ROUTER, l, 0), &nr,
                              1, s_mat_h, 0, &seed, err)))
                return rc;
            Ly->h_e_gu = calloc((size_t)e->E, sizeof(void *));
            Ly->h_e_d = calloc((size_t)e->E, sizeof(void *));
            if (!Ly->h_e_gu || !Ly->h_e_d)
                return sfi_error_set(err, SFI_ENOMEM, "out of memory");
            const int Im = e->Im, i0 = r * Im;
            for (int x = 0; x < e->E; x++) {
                /* every expert split the same way: the router (whole)
                 * picks the same experts on every rank */
                pieces_reset(g, m != NULL);
                piece_block(g, W(SFI_W_E_GATE, l, x), i0, Im, H, 0, H);
                piece_block(g, W(SFI_W_E_UP, l, x), i0, Im, H, 0, H);
                if ((rc = wpieces(e, &Ly->h_e_gu[x], dt, g, s_mat_h, 0, &seed, err)))
                    return rc;
                pieces_reset(g, m != NULL);
                piece_block(g, W(SFI_W_E_DOWN, l, x), 0, H, e->Im_g, i0, Im);
                if ((rc = wpieces(e, &Ly->h_e_d[x], dt, g, sqrtf(3.0f / e->Im_g), 0, &seed, err)))
                    return rc;
            }
            if ((rc = dalloc((void **)&Ly->e_gu, (size_t)e->E * sizeof(void *), err)) ||
                (rc = dalloc((void **)&Ly->e_d, (size_t)e->E * sizeof(void *), err)))
                return rc;
            CK(cudaMemcpy(Ly->e_gu, Ly->h_e_gu, (size_t)e->E * sizeof(void *),
                          cudaMemcpyHostToDevice));
            CK(cudaMemcpy(Ly->e_d, Ly->h_e_d, (size_t)e->E * sizeof(void *),
                          cudaMemcpyHostToDevice));
        }
    }
#undef SRC1
#undef W
    CK(cudaStreamSynchronize(e->main_st));
    return SFI_OK;
}

/* The weights of this rank (tensor parallelism: see sfi_gpu_engine_opts;
 * rank 0 of 1 holds everything): Q, K, V rows of its heads, O columns of
 * its query heads, gate/up rows and down columns of its share of the MLP
 * width (of every expert's), LM head rows of its vocabulary share. The
 * random weights' scales are the whole model's, so that every rank's
 * partial sums add up to activations of the usual size. */
static sfi_status load_weights(sfi_gpu_engine *e, const sfi_qwen3 *m, uint64_t seed64,
                               sfi_error *err)
{
    pieces g;
    memset(&g, 0, sizeof g);
    sfi_status rc = load_weights_pieces(e, m, seed64, &g, err);
    pieces_free(&g);
    return rc;
}

/* ---- create / free ---- */

static void fmt_gib(char *b, size_t n, uint64_t x)
{
    snprintf(b, n, "%.2f GiB", (double)x / (1024.0 * 1024.0 * 1024.0));
}

/* The engine's shape and memory plan, and a refusal, before anything is
 * allocated, when the plan does not fit the GPU's free memory. */
static sfi_status create_plan(const sfi_model_config *cfg, const sfi_gpu_engine_opts *o, shape *s,
                              sfi_gpu_engine_mem *mp, sfi_error *err)
{
    sfi_status rc = get_shape(cfg, o, s, err);
    if (rc)
        return rc;
    if ((rc = sfi_params_validate(&o->params, err)))
        return rc;
    if (o->tp_size > 1 && !o->tp_comm)
        return sfi_error_set(err, SFI_EINVAL,
                             "tensor parallelism over %d GPUs needs a communicator", o->tp_size);
    if ((rc = sfi_gpu_engine_mem_plan(cfg, o, mp, err)))
        return rc;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    /* the CUDA context, cuBLAS kernels and graph memory need some room too */
    const uint64_t margin = (uint64_t)768 << 20;
    if (mp->total + margin > free_b) {
        char a[32], b[32], kv[32], w[32], cmp[32], sel[32], act[32];
        fmt_gib(a, sizeof a, mp->total + margin);
        fmt_gib(b, sizeof b, free_b);
        fmt_gib(kv, sizeof kv, mp->kv);
        fmt_gib(w, sizeof w, mp->weights);
        fmt_gib(cmp, sizeof cmp, mp->compact + mp->key_norms);
        fmt_gib(sel, sizeof sel, mp->selector + mp->logits);
        fmt_gib(act, sizeof act, mp->activations + mp->prefill + mp->other);
        return sfi_error_set(err, SFI_ENOMEM,
                             "does not fit: needs %s (weights %s, KV cache %s for %d requests x "
                             "%d positions, compact segments + key norms %s, Selector scratch + "
                             "logits ring %s, activations and workspaces %s, 0.75 GiB headroom) "
                             "but the GPU has %s free; lower --batch, the context or --max-new%s",
                             a, w, kv, o->max_batch, o->max_ctx, cmp, sel, act, b,
                             o->sfi && o->params.refresh_delay >= 2
                                 ? " (refresh_delay keeps two compact segments and every "
                                   "layer's logits)"
                                 : "");
    }
    return SFI_OK;
}

/* The engine's host fields: options, shape, plan, this rank's share. */
static void init_fields(sfi_gpu_engine *e, const sfi_model_config *cfg,
                        const sfi_gpu_engine_opts *o, const shape *s, const sfi_gpu_engine_mem *mp)
{
    e->c = *cfg;
    e->o = *o;
    e->mem = *mp;
    e->L = s->L;
    e->H = s->H;
    e->nh = s->nh;
    e->nkv = s->nkv;
    e->D = s->D;
    e->G = s->G;
    e->nq = s->nq;
    e->nkvd = s->nkvd;
    e->V = s->V;
    e->I = s->I;
    e->E = s->E;
    e->top = s->top;
    e->Im = s->Im;
    e->esz = s->esz;
    e->exact = o->exact;
    e->cap = s->cap;
    e->max_blocks = s->max_blocks;
    e->ld = s->ld;
    e->capJ = s->capJ;
    e->ccap = s->ccap;
    e->rows_act = s->rows_act;
    e->Wmax = s->Wmax;
    e->tp = s->tp;
    e->rank = s->rank;
    e->Vl = s->Vl;
    e->v0 = s->v0;
    e->Vc = s->Vc;
    e->nkv_g = s->nkv_g;
    e->nq_g = s->nq_g;
    e->I_g = s->I_g;
    e->Im_g = s->Im_g;
    e->comm = o->tp_comm;
    /* tp > 1: every collective on the main stream, in one order on every
     * rank (NCCL collectives of one communicator on two streams can
     * deadlock; a second communicator is not worth its risk): the decode
     * step's Selector overlaps around its all-gather (tp_chain_rest); the
     * deferred Selector, which would need the all-gather on the side
     * stream, runs in line */
    if (e->tp > 1 && e->defer)
        e->o.overlap = 0;
    e->eps = (float)cfg->rms_norm_eps;
    e->gu_tiled = o->dtype == SFI_GPU_BF16 && !o->exact && e->I % 8 == 0;
    e->defer = o->sfi && o->params.refresh_delay >= 2;
    /* tp > 1 runs the Selector chain in line with its scores' all-gather
     * at the graph's capacity: in a step where no request is slow (about
     * half of them at batch 16) it is pure cost (H200, Qwen3-4B 8K, tp 2:
     * fast steps 5.691 ms with it, 4.303 without). The host waits for
     * each step's end and replays a second graph without the chain when
     * d_state->next_slow says no request needs it; tp 1 keeps its
     * overlapped chain and never reads per-step state back.
     * SFI_GPU_SEL_GRAPHS=0|1 overrides (measurements). */
    e->sel_graphs = o->sfi && e->tp > 1 && !o->skip_select && !e->defer;
    const char *sg = getenv("SFI_GPU_SEL_GRAPHS");
    if (sg && o->sfi && !o->skip_select && !e->defer)
        e->sel_graphs = atoi(sg) != 0;
    /* tp 1: the step graph chooses on the device, through a conditional
     * node, between the step as it is and, when no request needs the
     * Selector chain (next_slow == 0), the step without the chain and
     * with the attention grid sized for fast rows alone; the host still
     * reads nothing back. SFI_GPU_COND_GRAPH=0 switches it off
     * (measurements). */
    const char *cg = getenv("SFI_GPU_COND_GRAPH");
    e->cond_graphs =
        o->sfi && o->graphs && e->tp == 1 && !e->sel_graphs && !e->defer && !(cg && atoi(cg) == 0);
}

/* The create phases below return at the first failure and leave what they
 * made in e, for sfi_gpu_engine_free. They read the options as e->o, which
 * differs from the caller's only in overlap. */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        sfi_status try_ = (x);                                                                     \
        if (try_)                                                                                  \
            return try_;                                                                           \
    } while (0)

/* Streams (main high priority, side low), events, cuBLAS on main. */
static sfi_status create_streams(sfi_gpu_engine *e, sfi_error *err)
{
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    /* the side stream at the higher priority measured the same or slower
     * (H100, 0.6B batch 16 32K: slow steps 5.177 against 5.207 ms; with
     * the reorg's 32 CTAs 5.193 / 5.188 against 5.139 / 5.171; 2 x H100,
     * Qwen3-4B batch 16 at tp 2: 2687.1 against 2689.7 tok/s) */
    CK(cudaStreamCreateWithPriority(&e->main_st, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&e->side_st, cudaStreamNonBlocking, lo));
    for (int i = 0; i < R_SLOTS; i++) {
        CK(cudaEventCreateWithFlags(&e->ev_attn[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&e->ev_free[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&e->ev_gath[i], cudaEventDisableTiming));
    }
    CK(cudaEventCreateWithFlags(&e->ev_done, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&e->ev_plan, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&e->ev_step, cudaEventDisableTiming));
    if (cublasCreate(&e->blas) != CUBLAS_STATUS_SUCCESS)
        return sfi_error_set(err, SFI_EIO, "cuBLAS: cannot create a handle");
    TRY(dalloc(&e->blas_ws, (size_t)32 << 20, err));
    if (cublasSetWorkspace(e->blas, e->blas_ws, (size_t)32 << 20) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(e->blas, e->main_st) != CUBLAS_STATUS_SUCCESS)
        return sfi_error_set(err, SFI_EIO, "cuBLAS: cannot set the workspace or stream");
    return SFI_OK;
}

/* The host arrays of per-layer pointers. */
static sfi_status alloc_layer_arrays(sfi_gpu_engine *e, sfi_error *err)
{
    e->lay = calloc((size_t)e->L, sizeof *e->lay);
    e->kp = calloc((size_t)e->L, sizeof(void *));
    e->vp = calloc((size_t)e->L, sizeof(void *));
    e->ck = calloc((size_t)e->L, sizeof(void *));
    e->cv = calloc((size_t)e->L, sizeof(void *));
    e->knorm = calloc((size_t)e->L, sizeof(float *));
    e->sel = calloc((size_t)e->L, sizeof(int32_t *));
    if (!e->lay || !e->kp || !e->vp || !e->ck || !e->cv || !e->knorm || !e->sel)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    return SFI_OK;
}

/* Per layer: the paged KV pools and, for SFI, the compact segments, key
 * norms and selected sets. */
static sfi_status alloc_caches(sfi_gpu_engine *e, sfi_error *err)
{
    const sfi_gpu_engine_opts *o = &e->o;
    const int B = o->max_batch, K = o->params.K;
    size_t pool = (size_t)B * e->max_blocks * o->page * e->nkvd * e->esz;
    for (int l = 0; l < e->L; l++) {
        TRY(dalloc(&e->kp[l], pool, err));
        TRY(dalloc(&e->vp[l], pool, err));
        if (o->sfi) {
            /* deferred: rows B.. are the second buffer (SFI_GPU_REQ_ALT) */
            const size_t nb = e->defer ? 2 : 1;
            size_t cb = nb * B * e->nkv * e->ccap * e->D * e->esz;
            TRY(dalloc(&e->ck[l], cb, err));
            TRY(dalloc(&e->cv[l], cb, err));
            TRY(dalloc((void **)&e->knorm[l], (size_t)B * e->nkv * e->ld * 4, err));
            TRY(dalloc((void **)&e->sel[l], nb * B * e->nkv * K * 4, err));
            CK(cudaMemset(e->sel[l], 0, nb * B * e->nkv * K * 4));
        }
    }
    return SFI_OK;
}

/* The block table (each request owns a contiguous run of pages), the
 * prefill's, and the RoPE tables (the reference's values). */
static sfi_status upload_tables(sfi_gpu_engine *e, sfi_error *err)
{
    const int B = e->o.max_batch;
    sfi_status rc;
    int32_t *bt = malloc((size_t)B * e->max_blocks * sizeof(int32_t));
    if (!bt)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    for (int b = 0; b < B; b++)
        for (int i = 0; i < e->max_blocks; i++)
            bt[(size_t)b * e->max_blocks + i] = b * e->max_blocks + i;
    rc = dalloc((void **)&e->bt, (size_t)B * e->max_blocks * 4, err);
    if (!rc)
        rc = SFI_GPU_STATUS(
            err, cudaMemcpy(e->bt, bt, (size_t)B * e->max_blocks * 4, cudaMemcpyHostToDevice),
            "cudaMemcpy(e->bt, bt, ...)");
    free(bt);
    if (rc)
        return rc;
    TRY(dalloc((void **)&e->bt_pf, (size_t)PF_PSEUDO * e->max_blocks * 4, err));
    size_t nt = (size_t)e->cap * (e->D / 2);
    float *cs = malloc(nt * 4), *sn = malloc(nt * 4);
    if (!cs || !sn) {
        free(cs);
        free(sn);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    sfi_qwen3_rope_table(&e->c, 0, e->cap, cs, sn);
    rc = dalloc((void **)&e->cs, nt * 4, err);
    if (!rc)
        rc = dalloc((void **)&e->sn, nt * 4, err);
    if (!rc)
        rc = SFI_GPU_STATUS(err, cudaMemcpy(e->cs, cs, nt * 4, cudaMemcpyHostToDevice),
                            "cudaMemcpy(e->cs, cs, ...)");
    if (!rc)
        rc = SFI_GPU_STATUS(err, cudaMemcpy(e->sn, sn, nt * 4, cudaMemcpyHostToDevice),
                            "cudaMemcpy(e->sn, sn, ...)");
    free(cs);
    free(sn);
    return rc;
}

/* SFI: the logits ring (or every layer's logits, deferred), the
 * Selector's workspaces and the window queries. */
static sfi_status alloc_selector(sfi_gpu_engine *e, sfi_error *err)
{
    if (!e->o.sfi)
        return SFI_OK;
    const int B = e->o.max_batch;
    for (int i = 0; i < (e->defer ? 1 : R_SLOTS); i++) {
        if (!e->defer)
            TRY(dalloc((void **)&e->logits_ring[i], (size_t)B * e->nh * e->ld * 4, err));
        TRY(dalloc(&e->sel_ws_mem[i], sfi_gpu_sel_ws_bytes(B, e->nkv, e->capJ), err));
        sfi_gpu_sel_ws_carve(&e->sel_ws[i], e->sel_ws_mem[i], B, e->nkv, e->capJ);
    }
    if (e->defer) {
        TRY(dalloc((void **)&e->lg_keep, (size_t)e->L * B * e->nh * e->ld * 4, err));
        TRY(dalloc((void **)&e->d_dsel, sizeof(sfi_gpu_step_desc), err));
    }
    TRY(dalloc((void **)&e->win, (size_t)e->nkv * e->Wmax * e->G * e->ld * 4, err));
    TRY(dalloc((void **)&e->qwin, (size_t)e->L * e->Wmax * e->nq * 4, err));
    return SFI_OK;
}

/* SFI steps mix short sparse rows with a few long dense ones: split every
 * request into pieces of about a fast step's rows. */
static void plan_splits(sfi_gpu_engine *e)
{
    const sfi_gpu_engine_opts *o = &e->o;
    const int B = o->max_batch;
    int mr = o->params.n_sink + o->params.K + o->params.n_recent;
    int msr = mr < 1024 ? 1024 : round_up(mr, 64);
    /* with few (request, KV head) pairs a fast request's rows in
     * one CTA per pair leave most SMs idle (H100, Qwen3-30B-A3B
     * shape cut to 8 layers, batch 1 = 4 pairs: SFI fast steps
     * 5.16 ms against dense steps 3.87 ms at 8K): split them so
     * that the pairs fill the SMs once; 2 pairs per SM and more
     * (the benchmarked batch 16) keep one split */
    int sms = 0, dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess) {
        /* a CTA per head slice (a group of 16: two per KV head) */
        long pairs = (long)B * e->nkv * sfi_gpu_attn_slices(e->G, e->D);
        if (sms > 0 && 2 * pairs <= sms) {
            long per = (sms + pairs - 1) / pairs;
            int r = round_up((int)((mr + per - 1) / per), 64);
            if (r < 256)
                r = 256;
            if (r < msr) {
                /* a slow request beside the fast ones: where its rows
                 * are at most a quarter of a one-slow step's (the other
                 * requests' fast rows over three times its context) it is
                 * cut as finely as the fast ones; up to half, into pieces
                 * of half the large splits; above, it keeps the large
                 * ones (its pieces are then most of the launch). Slow
                 * steps measured, by the rows' share of a slow request:
                 * - 19 %, 2 x H200, Qwen3-4B batch 16 tp 2 8K: 832-row
                 *   pieces 5.613 ms, 1216 5.862 (2 x H100: 2368 7.107,
                 *   832 6.321)
                 * - 33 %, H200, 0.6B batch 8 8K: 2368 2.939 ms, 960
                 *   2.916, 1216 2.713
                 * - 48 %, 2 x H200, Qwen3-4B tp 2 32K: 2368 7.741 ms,
                 *   1280 6.944, 1216 6.905, 832 7.034
                 * - 66 %, H200, 0.6B batch 8 32K: 2368 3.531, 1216 3.858
                 * - 82 %, H100, 0.6B batch 4 32K: 2368 3.699 ms, 1856
                 *   3.773, 1536 4.042 */
                const long others = (long)(B - 1) * mr;
                const int half = round_up(msr / 2, 64);
                e->attn_ws.dense_min_rows = 3L * o->max_ctx < others           ? r
                                            : o->max_ctx <= others && half > r ? half
                                                                               : msr;
                e->attn_ws.fast_splits = (int)per;
                msr = r;
            }
        }
    }
    /* experiments: SFI_GPU_SPLIT_ROWS=N sets the rows per split,
     * SFI_GPU_DENSE_SPLIT_ROWS=N a slow request's where fast ones are cut
     * finer */
    const char *env = getenv("SFI_GPU_SPLIT_ROWS");
    if (env && atoi(env) >= 64)
        msr = round_up(atoi(env), 64);
    e->attn_ws.min_split_rows = msr;
    const char *dsr = getenv("SFI_GPU_DENSE_SPLIT_ROWS");
    if (dsr && atoi(dsr) >= 64)
        e->attn_ws.dense_min_rows = round_up(atoi(dsr), 64);
}

/* The environment's experiment switches (SFI_GPU_SKIP, _FUSE_NORM, _GEMM,
 * _SLAB_MAX_MB, _STAGES). */
static void read_experiments(sfi_gpu_engine *e)
{
    const char *skp = getenv("SFI_GPU_SKIP");
    if (skp) {
        e->skip_norm = strstr(skp, "norm") != NULL;
        e->skip_qkv = strstr(skp, "qkv") != NULL;
        e->skip_attn = strstr(skp, "attn") != NULL;
        e->skip_gemm = strstr(skp, "gemm") != NULL;
        e->skip_reorg = strstr(skp, "reorg") != NULL;
        e->skip_sel = strstr(skp, "selchain") != NULL;
        e->skip_tail = strstr(skp, "tail") ? atoi(strstr(skp, "tail") + 4) : 0;
        e->skip_ar = strstr(skp, "allreduce") != NULL;
        e->skip_lm = strstr(skp, "lmhead") != NULL;
    }
    e->fuse_norm = !(getenv("SFI_GPU_FUSE_NORM") && !strcmp(getenv("SFI_GPU_FUSE_NORM"), "0"));
    /* SFI_GPU_MOE_GROUPED=0: prefill's experts one product per pair, as
     * decode steps run them (to time the two forms against each other) */
    e->moe_grouped = !e->exact && !(getenv("SFI_GPU_MOE_GROUPED") &&
                                    !strcmp(getenv("SFI_GPU_MOE_GROUPED"), "0"));
    const char *gk = getenv("SFI_GPU_GEMM");
    if (gk)
        sfi_gpu_gemm_select(!strcmp(gk, "skinny") ? SFI_GPU_GEMM_REGS : SFI_GPU_GEMM_SLAB,
                            getenv("SFI_GPU_SLAB_MAX_MB") ? atoi(getenv("SFI_GPU_SLAB_MAX_MB"))
                                                          : -1);
    /* experiments: SFI_GPU_STAGES=2|3|4|6|7 sets the attention pipeline
     * depth, SFI_GPU_FAST_STAGES that of the steps without a slow request
     * (cond_graphs) */
    const char *stg = getenv("SFI_GPU_STAGES");
    e->stages = stg ? atoi(stg) : 3;
    const char *fst = getenv("SFI_GPU_FAST_STAGES");
    e->fast_stages = fst ? atoi(fst) : 7;
    const char *qf = getenv("SFI_GPU_QKV_FUSE");
    e->qkv_fuse = e->o.qkv_fuse >= 0 ? e->o.qkv_fuse : qf ? atoi(qf) : 1;
    const char *trg = getenv("SFI_GPU_SLAB_TRIGGER");
    e->slab_trigger = !(trg && !strcmp(trg, "late"));
    sfi_gpu_attn_set_stages(e->stages);
}

/* The attention workspace (decode batch or prefill pseudo-batch, the
 * larger), its split plan and the switches it is initialised under. */
static sfi_status setup_attention(sfi_gpu_engine *e, sfi_error *err)
{
    const int B = e->o.max_batch;
    int wsb = B > PF_PSEUDO ? B : PF_PSEUDO;
    TRY(dalloc(&e->attn_ws_mem, sfi_gpu_attn_ws_bytes(wsb, e->nh, e->D), err));
    sfi_gpu_attn_ws_carve(&e->attn_ws, e->attn_ws_mem, wsb, e->nh, e->D);
    if (e->o.sfi)
        plan_splits(e);
    read_experiments(e);
    CK(sfi_gpu_attn_ws_init(&e->attn_ws, e->main_st));
    return SFI_OK;
}

/* The activations of rows_act rows, the logits and, tp > 1, the
 * collectives' buffers. */
static sfi_status alloc_activations(sfi_gpu_engine *e, sfi_error *err)
{
    const sfi_gpu_engine_opts *o = &e->o;
    const int B = o->max_batch;
    size_t R = (size_t)e->rows_act;
    int Iw = e->I > e->Im ? e->I : e->Im;
    TRY(dalloc((void **)&e->x, R * e->H * 4, err));
    TRY(dalloc((void **)&e->xn, R * e->H * 4, err));
    TRY(dalloc((void **)&e->qkv, R * (e->nq + 2 * e->nkvd) * 4, err));
    TRY(dalloc((void **)&e->q, R * e->nq * 4, err));
    TRY(dalloc((void **)&e->att, R * e->nq * 4, err));
    TRY(dalloc((void **)&e->gu, R * 2 * Iw * 4, err));
    TRY(dalloc((void **)&e->act_f, R * Iw * 4, err));
    TRY(dalloc(&e->xn_b, R * e->H * 2, err));
    TRY(dalloc(&e->att_b, R * e->nq * 2, err));
    TRY(dalloc(&e->act_b, R * Iw * 2, err));
    TRY(dalloc((void **)&e->ss, (size_t)(e->H / 8 + 1) * 64 * 4, err));
    /* tp > 1: a row's Vc floats are gathered from row b * Vl, so the
     * last rank (Vl <= Vc) reads up to Vc - Vl floats past its last row */
    TRY(dalloc((void **)&e->logits, ((size_t)B * e->Vc + (e->tp > 1 ? e->Vc : 0)) * 4, err));
    if (e->tp > 1) {
        CK(cudaMemset(e->logits, 0, ((size_t)B * e->Vc + e->Vc) * 4));
        TRY(dalloc((void **)&e->amax_keys, 64 * 8, err));
        TRY(dalloc((void **)&e->amax_all, (size_t)64 * 8 * e->tp, err));
        CK(cudaMemset(e->amax_keys, 0, 64 * 8));
        TRY(dalloc((void **)&e->lg_all, (size_t)B * e->tp * e->Vc * 4, err));
        TRY(dalloc((void **)&e->sel_all, (size_t)e->nkv_g * o->params.K * 4, err));
        e->z_all_floats = (size_t)B * e->nkv_g * e->capJ;
        if (o->sfi)
            TRY(dalloc((void **)&e->z_all, R_SLOTS * e->z_all_floats * 4, err));
    }
    return SFI_OK;
}

/* The decode loop's device state: next tokens, slots, split-K partials,
 * the prompt, MoE routing, step descriptors, histories, trigger set. */
static sfi_status alloc_run_state(sfi_gpu_engine *e, sfi_error *err)
{
    const sfi_gpu_engine_opts *o = &e->o;
    const int B = o->max_batch;
    size_t R = (size_t)e->rows_act;
    TRY(dalloc((void **)&e->next, 64 * 4, err));
    TRY(dalloc((void **)&e->slots, 64 * 8, err));
    if (o->dtype == SFI_GPU_BF16 && !o->exact) {
        /* split-K applies to products with fewer than 264 row tiles */
        e->gemm_part_floats = (size_t)8 * 64 * 4224 + 64;
        e->gemm_tiles = 4224 / 16;
        TRY(dalloc((void **)&e->gemm_part, e->gemm_part_floats * 4, err));
        TRY(dalloc((void **)&e->gemm_cnt, (size_t)e->gemm_tiles * 4, err));
        CK(cudaMemset(e->gemm_cnt, 0, (size_t)e->gemm_tiles * 4));
    }
    CK(cudaMemset(e->slots, 0, 64 * 8));
    TRY(dalloc((void **)&e->d_prompt, (size_t)e->cap * 4, err));
    if (e->E) {
        size_t pairs = R * e->top;
        TRY(dalloc((void **)&e->rl, R * e->E * 4, err));
        TRY(dalloc((void **)&e->sel_e, pairs * 4, err));
        TRY(dalloc((void **)&e->sel_w, pairs * 4, err));
        TRY(dalloc((void **)&e->y1, pairs * 2 * e->Im * 4, err));
        TRY(dalloc((void **)&e->act2, pairs * e->Im * 4, err));
        TRY(dalloc((void **)&e->y2, pairs * e->H * 4, err));
        if (!o->exact) {
            TRY(dalloc((void **)&e->moe_cnt, (size_t)e->E * 4, err));
            TRY(dalloc((void **)&e->moe_pos, pairs * 4, err));
            CK(cudaMallocHost((void **)&e->h_moe_cnt, (size_t)e->E * 4));
        }
    }
    TRY(dalloc((void **)&e->d_desc, sizeof(sfi_gpu_step_desc), err));
    TRY(dalloc((void **)&e->d_desc1, sizeof(sfi_gpu_step_desc), err));
    CK(cudaMallocHost((void **)&e->h_pin, 2 * sizeof(sfi_gpu_step_desc)));
    CK(cudaMallocHost((void **)&e->h_flag, sizeof(int32_t)));
    TRY(dalloc((void **)&e->d_state, sizeof(sfi_gpu_run_state), err));
    TRY(dalloc((void **)&e->hist_kind, (size_t)o->max_new * B * 4, err));
    TRY(dalloc((void **)&e->hist_tok, (size_t)o->max_new * B * 4, err));
    TRY(dalloc((void **)&e->d_force, (size_t)o->max_new * B * 4, err));
    if (o->is_trigger && o->n_trigger_vocab > 0) {
        TRY(dalloc((void **)&e->d_trig, (size_t)o->n_trigger_vocab, err));
        CK(cudaMemcpy(e->d_trig, o->is_trigger, (size_t)o->n_trigger_vocab,
                      cudaMemcpyHostToDevice));
    }
    return SFI_OK;
}

#undef TRY

static int decode_gemm_ours(const sfi_gpu_engine *e, int T, int N);

/* Whether decode steps run the deferred RMSNorm (sfi_gpu_rownorm), and
 * if so the QKV and gate/up weights' columns scaled by the norms' weights
 * (prefill then normalises without them). The norm between a layer's
 * products was a launch of its own, 56 a step for Qwen3-0.6B: without
 * them its fast steps took 2.582 against 2.713 ms (H100, batch 16, 32K,
 * SFI_GPU_SKIP=norm). Only where all four products run on the slab
 * kernel; not under tensor parallelism (the partial residual's squares
 * are not the sum's), nor with MoE layers or biases; SFI_GPU_DNORM=0
 * turns it off (experiments). */
static sfi_status setup_deferred_norm(sfi_gpu_engine *e, sfi_error *err)
{
    const int B = e->o.max_batch, H = e->H;
    const char *env = getenv("SFI_GPU_DNORM");
    int on = !(env && !strcmp(env, "0")) && e->gu_tiled && e->tp == 1 && H % 8 == 0 &&
             decode_gemm_ours(e, B, H) && decode_gemm_ours(e, B, e->nq) &&
             decode_gemm_ours(e, B, e->I) &&
             sfi_gpu_gemm_rownorm_applies(B, e->nq + 2 * e->nkvd, H, SFI_GPU_EPI_STORE, 1) &&
             sfi_gpu_gemm_rownorm_applies(B, H, e->nq, SFI_GPU_EPI_ACCUMULATE, 0) &&
             sfi_gpu_gemm_rownorm_applies(B, 2 * e->I, H, SFI_GPU_EPI_SWIGLU, 1) &&
             sfi_gpu_gemm_rownorm_applies(B, H, e->I, SFI_GPU_EPI_ACCUMULATE, 0);
    for (int l = 0; l < e->L && on; l++)
        on = !e->lay[l].moe && !e->lay[l].bqkv && !e->lay[l].bo;
    e->dnorm = on;
    for (int l = 0; l < e->L && on; l++) {
        const dlayer *Ly = &e->lay[l];
        CK(sfi_gpu_scale_cols(Ly->wqkv, e->nq + 2 * e->nkvd, H, Ly->in_norm, e->main_st));
        CK(sfi_gpu_scale_cols(Ly->wgu, 2 * e->I, H, Ly->post_norm, e->main_st));
    }
    return SFI_OK;
}

sfi_status sfi_gpu_engine_create(const sfi_model_config *cfg, const sfi_qwen3 *m, uint64_t seed,
                                 const sfi_gpu_engine_opts *o, sfi_gpu_engine **out, sfi_error *err)
{
    *out = NULL;
    shape s;
    sfi_gpu_engine_mem mp;
    sfi_status rc = create_plan(cfg, o, &s, &mp, err);
    if (rc)
        return rc;
    sfi_gpu_engine *e = calloc(1, sizeof *e);
    if (!e)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    init_fields(e, cfg, o, &s, &mp);
    *out = e;
    if ((rc = create_streams(e, err)) || (rc = alloc_layer_arrays(e, err)) ||
        (rc = load_weights(e, m, seed, err)) || (rc = alloc_caches(e, err)) ||
        (rc = upload_tables(e, err)) || (rc = alloc_selector(e, err)) ||
        (rc = setup_attention(e, err)) || (rc = alloc_activations(e, err)) ||
        (rc = alloc_run_state(e, err)) || (rc = setup_deferred_norm(e, err)) ||
        (rc = SFI_GPU_STATUS(err, cudaStreamSynchronize(e->main_st),
                             "cudaStreamSynchronize(e->main_st)"))) {
        sfi_gpu_engine_free(e);
        *out = NULL;
        return rc;
    }
    sfi_gpu_gemm_set_ws(e->gemm_part, e->gemm_part_floats, e->gemm_cnt, e->gemm_tiles);
    return SFI_OK;
}

void sfi_gpu_engine_free(sfi_gpu_engine *e)
{
    if (!e)
        return;
    if (e->main_st)
        cudaStreamSynchronize(e->main_st);
    if (e->side_st)
        cudaStreamSynchronize(e->side_st);
    sfi_gpu_gemm_set_ws(NULL, 0, NULL, 0); /* the kernels' split-K scratch was ours */
    if (e->graph_exec)
        cudaGraphExecDestroy(e->graph_exec);
    if (e->graph_nosel)
        cudaGraphExecDestroy(e->graph_nosel);
    for (int i = 0; i < SEL_CLASSES; i++)
        if (e->graph_slots[i])
            cudaGraphExecDestroy(e->graph_slots[i]);
    if (e->lay) {
        for (int l = 0; l < e->L; l++) {
            dlayer *Ly = &e->lay[l];
            cudaFree(Ly->in_norm);
            cudaFree(Ly->post_norm);
            cudaFree(Ly->q_norm);
            cudaFree(Ly->k_norm);
            cudaFree(Ly->wqkv);
            cudaFree(Ly->bqkv);
            cudaFree(Ly->wo);
            cudaFree(Ly->bo);
            cudaFree(Ly->wgu);
            cudaFree(Ly->wd);
            cudaFree(Ly->router);
            cudaFree(Ly->e_gu);
            cudaFree(Ly->e_d);
            for (int x = 0; x < e->E; x++) {
                if (Ly->h_e_gu)
                    cudaFree(Ly->h_e_gu[x]);
                if (Ly->h_e_d)
                    cudaFree(Ly->h_e_d[x]);
            }
            free(Ly->h_e_gu);
            free(Ly->h_e_d);
        }
    }
    free(e->lay);
    for (int l = 0; l < e->L; l++) {
        if (e->kp)
            cudaFree(e->kp[l]);
        if (e->vp)
            cudaFree(e->vp[l]);
        if (e->ck)
            cudaFree(e->ck[l]);
        if (e->cv)
            cudaFree(e->cv[l]);
        if (e->knorm)
            cudaFree(e->knorm[l]);
        if (e->sel)
            cudaFree(e->sel[l]);
    }
    free(e->kp);
    free(e->vp);
    free(e->ck);
    free(e->cv);
    free(e->knorm);
    free(e->sel);
    cudaFree(e->embed);
    if (!e->c.tie_word_embeddings) /* else a view of the embedding */
        cudaFree(e->lm_head);
    cudaFree(e->final_norm);
    cudaFree(e->bt);
    cudaFree(e->bt_pf);
    cudaFree(e->cs);
    cudaFree(e->sn);
    for (int i = 0; i < R_SLOTS; i++) {
        cudaFree(e->logits_ring[i]);
        cudaFree(e->sel_ws_mem[i]);
    }
    cudaFree(e->lg_keep);
    cudaFree(e->d_dsel);
    cudaFree(e->attn_ws_mem);
    cudaFree(e->win);
    cudaFree(e->qwin);
    cudaFree(e->x);
    cudaFree(e->xn);
    cudaFree(e->qkv);
    cudaFree(e->q);
    cudaFree(e->att);
    cudaFree(e->gu);
    cudaFree(e->act_f);
    cudaFree(e->xn_b);
    cudaFree(e->att_b);
    cudaFree(e->act_b);
    cudaFree(e->ss);
    cudaFree(e->logits);
    cudaFree(e->amax_keys);
    cudaFree(e->amax_all);
    cudaFree(e->lg_all);
    cudaFree(e->sel_all);
    cudaFree(e->z_all);
    cudaFree(e->next);
    cudaFree(e->d_prompt);
    cudaFree(e->slots);
    cudaFree(e->gemm_part);
    cudaFree(e->gemm_cnt);
    cudaFree(e->rl);
    cudaFree(e->sel_e);
    cudaFree(e->sel_w);
    cudaFree(e->y1);
    cudaFree(e->act2);
    cudaFree(e->y2);
    cudaFree(e->moe_cnt);
    cudaFree(e->moe_pos);
    if (e->h_moe_cnt)
        cudaFreeHost(e->h_moe_cnt);
    cudaFree(e->d_desc);
    cudaFree(e->d_desc1);
    cudaFree(e->d_state);
    cudaFree(e->hist_kind);
    cudaFree(e->hist_tok);
    cudaFree(e->d_force);
    cudaFree(e->d_trig);
    if (e->h_pin)
        cudaFreeHost(e->h_pin);
    if (e->h_flag)
        cudaFreeHost(e->h_flag);
    if (e->blas)
        cublasDestroy(e->blas);
    cudaFree(e->blas_ws);
    for (int i = 0; i < R_SLOTS; i++) {
        if (e->ev_attn[i])
            cudaEventDestroy(e->ev_attn[i]);
        if (e->ev_free[i])
            cudaEventDestroy(e->ev_free[i]);
        if (e->ev_gath[i])
            cudaEventDestroy(e->ev_gath[i]);
    }
    if (e->ev_done)
        cudaEventDestroy(e->ev_done);
    if (e->ev_plan)
        cudaEventDestroy(e->ev_plan);
    if (e->ev_step)
        cudaEventDestroy(e->ev_step);
    if (e->main_st)
        cudaStreamDestroy(e->main_st);
    if (e->side_st)
        cudaStreamDestroy(e->side_st);
    free(e);
}

const sfi_gpu_engine_mem *sfi_gpu_engine_memory(const sfi_gpu_engine *e)
{
    return &e->mem;
}
uint64_t sfi_gpu_engine_weight_bytes(const sfi_gpu_engine *e)
{
    return e->weight_bytes;
}
double sfi_gpu_engine_step_weight_bytes(const sfi_gpu_engine *e, int batch)
{
    uint64_t experts = 0;
    for (int l = 0; l < e->L; l++)
        if (e->lay[l].moe)
            experts += (uint64_t)e->E * 3 * e->Im * e->H * e->esz;
    /* a tied LM head split over the ranks reads this rank's rows of the
     * embedding only */
    const double unread =
        e->tp > 1 && e->c.tie_word_embeddings ? (double)(e->V - e->Vl) * e->H * e->esz : 0.0;
    if (!experts || batch < 1)
        return (double)e->weight_bytes - unread;
    /* batch * top picks among E experts, independent and uniform: the
     * expected share of experts touched at least once */
    double miss = pow(1.0 - (double)e->top / e->E, batch);
    return (double)(e->weight_bytes - experts) + (double)experts * (1.0 - miss) - unread;
}
void sfi_gpu_engine_comm_bytes(const sfi_gpu_engine *e, int batch, uint64_t *allreduce,
                               uint64_t *gather)
{
    *allreduce = *gather = 0;
    if (e->tp == 1)
        return;
    *allreduce = (uint64_t)e->L * 2 * batch * e->H * 4;
    *gather = (uint64_t)batch * 8; /* the argmax's keys */
    /* the Selector's scores in a step where one request is slow (the
     * all-gather carries the next power of two of the step's slow
     * requests; every request's with deferred refresh or without
     * sel_graphs) */
    if (e->o.sfi && !e->o.skip_select)
        *gather += (uint64_t)e->L * (e->sel_graphs ? 1 : batch) * e->nkv * e->capJ * 4;
}
void sfi_gpu_engine_tp(const sfi_gpu_engine *e, int *rank, int *size, int *n_kv_local)
{
    *rank = e->rank;
    *size = e->tp;
    *n_kv_local = e->nkv;
}
void sfi_gpu_engine_attn_split_rows(const sfi_gpu_engine *e, int *fast, int *slow)
{
    const int on = e->o.sfi && e->attn_ws.min_split_rows > 0;
    *fast = on ? e->attn_ws.min_split_rows : 0;
    *slow = !on ? 0 : e->attn_ws.dense_min_rows > 0 ? e->attn_ws.dense_min_rows : *fast;
}
uint64_t sfi_gpu_engine_kv_row_bytes(const sfi_gpu_engine *e)
{
    return (uint64_t)e->L * e->nkvd * e->esz * 2;
}

void sfi_gpu_run_result_free(sfi_gpu_run_result *r)
{
    if (!r)
        return;
    free(r->ids);
    free(r->kinds);
    free(r->reasons);
    free(r->n_generated);
    free(r->n_slow);
    free(r->step_ms);
    memset(r, 0, sizeof *r);
}

/* ---- the forward pass pieces ---- */

/* Whether a product of T rows over N inputs runs on our decode kernels
 * (bf16, not exact, at most 64 rows, N a multiple of 32) rather than on
 * cuBLAS: the one rule for the plain, SwiGLU and fused-norm forms. */
static int decode_gemm_ours(const sfi_gpu_engine *e, int T, int N)
{
    return e->o.dtype == SFI_GPU_BF16 && !e->exact && T <= 64 && N % 32 == 0 && !e->o.gemm_cublas;
}

/* Y[T][M] (beta 0: =, 1: +=) X[T][N] W[M][N]^T; X of the weights' dtype
 * (f32 in f32 runs, bf16 in bf16 runs), Y f32. */
static sfi_status gemm(sfi_gpu_engine *e, const void *W, const void *X, const float *bias, float *Y,
                       int T, int M, int N, int accumulate, cudaStream_t st, sfi_error *err)
{
    if (T <= 0 || (e->decoding && e->skip_gemm))
        return SFI_OK;
    if (e->exact) {
        CK(sfi_gpu_gemv_exact((const float *)W, (const float *)X, bias, Y, T, M, N, accumulate,
                              st));
        return SFI_OK;
    }
    if (decode_gemm_ours(e, T, N)) {
        /* decode-sized products: our tensor-core kernel (one pass over the
         * weights, no split-K reduction launch; measured faster than
         * cuBLAS's choices at 16 rows, see sfi-gpu(1)) */
        CK(sfi_gpu_gemm_skinny(W, X, Y, T, M, N,
                               accumulate ? SFI_GPU_EPI_ACCUMULATE : SFI_GPU_EPI_STORE, st));
        if (bias)
            CK(sfi_gpu_add_bias(Y, bias, T, M, st));
        return SFI_OK;
    }
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cudaDataType_t dt = e->o.dtype == SFI_GPU_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t ct =
        e->o.dtype == SFI_GPU_BF16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
    CKB(cublasSetStream(e->blas, st));
    CKB(cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, M, T, N, &one, W, dt, N, X, dt, N, &beta, Y,
                     CUDA_R_32F, M, ct, CUBLAS_GEMM_DEFAULT));
    if (bias)
        CK(sfi_gpu_add_bias(Y, bias, T, M, st));
    return SFI_OK;
}

/* The input of a GEMM after an RMSNorm: f32 rows in f32 runs, bf16 rows in
 * bf16 runs (both when the layer's MoE router needs f32). */
static sfi_status norm_rows(sfi_gpu_engine *e, const float *x, const float *w, int T, int want_f32,
                            cudaStream_t st, sfi_error *err)
{
    int bf = e->o.dtype == SFI_GPU_BF16;
    if (e->decoding && e->skip_norm)
        return SFI_OK;
    CK(sfi_gpu_rmsnorm(x, w, T, e->H, e->eps, (!bf || want_f32) ? e->xn : NULL, bf ? e->xn_b : NULL,
                       e->exact, st));
    return SFI_OK;
}

static const void *gemm_in(const sfi_gpu_engine *e, const float *f, const void *b)
{
    return e->o.dtype == SFI_GPU_BF16 ? b : (const void *)f;
}

/* The arguments of layer l's QKV post-processing (QK norms, RoPE, KV
 * append) over T rows of e->qkv, for prefill and decode alike; positions
 * and rows (pos0/row0 or pos_arr) are left to the caller. key_norms: the
 * layer's, or NULL when nothing reads them. */
static sfi_gpu_qkv_args qkv_args(const sfi_gpu_engine *e, int l, int T, float *key_norms)
{
    const dlayer *Ly = &e->lay[l];
    /* exact: the biases went into the GEMM already */
    const float *bias = !e->exact ? Ly->bqkv : NULL;
    sfi_gpu_qkv_args a = {.qkv = e->qkv,
                          .bq = bias,
                          .bk = bias ? bias + e->nq : NULL,
                          .bv = bias ? bias + e->nq + e->nkvd : NULL,
                          .q_norm = Ly->q_norm,
                          .k_norm = Ly->k_norm,
                          .cs = e->cs,
                          .sn = e->sn,
                          .T = T,
                          .n_heads = e->nh,
                          .n_kv = e->nkv,
                          .head_dim = e->D,
                          .eps = e->eps,
                          .block_table = e->bt,
                          .max_blocks = e->max_blocks,
                          .page = e->o.page,
                          .k_pool = e->kp[l],
                          .v_pool = e->vp[l],
                          .dtype = e->o.dtype,
                          .key_norms = key_norms,
                          .ld_norms = e->ld,
                          .q_out = e->q};
    return a;
}

/* A decode GEMM of RMSNorm(e->x) * norm_w with the norm made inside the
 * GEMM (one launch instead of two; bf16 decode steps, where the slab
 * kernel applies). *done = 0: nothing launched, the caller runs the norm
 * and the GEMM itself. */
static sfi_status gemm_normed(sfi_gpu_engine *e, const float *norm_w, const void *W, void *Y, int T,
                              int M, int N, int epi, cudaStream_t st, int *done, sfi_error *err)
{
    *done = 0;
    if (!e->decoding || !e->fuse_norm || !decode_gemm_ours(e, T, N) || e->skip_norm || e->skip_gemm)
        return SFI_OK;
    cudaError_t ce = sfi_gpu_gemm_norm(W, e->x, norm_w, e->eps, Y, T, M, N, epi, st);
    if (ce == cudaErrorNotSupported)
        return SFI_OK;
    CK(ce);
    *done = 1;
    return SFI_OK;
}

/* A decode product under the deferred norm (e->dnorm, sfi_gpu_rownorm):
 * one that adds into the residual (accumulate) leaves its bf16 rows in
 * e->xn_b and their sums in e->ss; the others (QKV, gate/up) take those
 * rows as X and scale by those sums. */
static sfi_status rownorm_gemm(sfi_gpu_engine *e, const void *W, const void *X, void *Y, int T,
                               int M, int N, int epi, cudaStream_t st, sfi_error *err)
{
    if (e->skip_gemm)
        return SFI_OK;
    const int producer = epi == SFI_GPU_EPI_ACCUMULATE;
    sfi_gpu_rownorm rn = {.ss_in = producer ? NULL : e->ss,
                          .ss_out = producer ? e->ss : NULL,
                          .xb_out = producer ? e->xn_b : NULL,
                          .eps = e->eps};
    CK(sfi_gpu_gemm_rownorm(W, X, Y, T, M, N, epi, &rn, st));
    return SFI_OK;
}

/* Tensor parallelism: every rank's e->x holds its partial residual (rank
 * 0's with the residual itself, the others' their share of the product
 * alone); the all-reduce sums them in place, f32, so that every rank goes
 * on with the same e->x. Nothing at tp 1. */
static sfi_status tp_reduce(sfi_gpu_engine *e, int T, cudaStream_t st, sfi_error *err)
{
    if (e->tp == 1 || T <= 0 || (e->decoding && e->skip_ar))
        return SFI_OK;
    return sfi_gpu_nccl_allreduce(e->comm, e->x, e->x, (size_t)T * e->H, SFI_GPU_F32, st, err);
}

/* The MLP half of layer l for T rows of e->x (post-attention). */
static sfi_status mlp(sfi_gpu_engine *e, int l, int T, cudaStream_t st, sfi_error *err)
{
    const dlayer *Ly = &e->lay[l];
    sfi_status rc;
    int bf = e->o.dtype == SFI_GPU_BF16;
    if (e->dnorm && e->decoding) {
        /* the deferred norm: gate/up scale by the O projection's sums,
         * the down projection leaves the next layer's */
        if ((rc = rownorm_gemm(e, Ly->wgu, e->xn_b, e->act_b, T, 2 * e->I, e->H, SFI_GPU_EPI_SWIGLU,
                               st, err)))
            return rc;
        return rownorm_gemm(e, Ly->wd, e->act_b, e->x, T, e->H, e->I, SFI_GPU_EPI_ACCUMULATE, st,
                            err);
    }
    if (!Ly->moe && e->gu_tiled) {
        int done;
        if ((rc = gemm_normed(e, Ly->post_norm, Ly->wgu, e->act_b, T, 2 * e->I, e->H,
                              SFI_GPU_EPI_SWIGLU, st, &done, err)))
            return rc;
        if (done) {
            if ((rc = gemm(e, Ly->wd, e->act_b, NULL, e->x, T, e->H, e->I, e->rank == 0, st, err)))
                return rc;
            return tp_reduce(e, T, st, err);
        }
    }
    if ((rc = norm_rows(e, e->x, e->dnorm ? NULL : Ly->post_norm, T, Ly->moe, st, err)))
        return rc;
    if (!Ly->moe) {
        if (e->decoding && e->skip_gemm)
            return SFI_OK;
        if (e->gu_tiled && decode_gemm_ours(e, T, e->H)) {
            /* the SwiGLU in the GEMM's epilogue: act in bf16 directly */
            CK(sfi_gpu_gemm_skinny(Ly->wgu, e->xn_b, e->act_b, T, 2 * e->I, e->H,
                                   SFI_GPU_EPI_SWIGLU, st));
        } else {
            if ((rc = gemm(e, Ly->wgu, gemm_in(e, e->xn, e->xn_b), NULL, e->gu, T, 2 * e->I, e->H,
                           0, st, err)))
                return rc;
            CK(sfi_gpu_silu_mul(e->gu, T, e->I, e->gu_tiled, bf ? e->act_b : (void *)e->act_f,
                                bf ? SFI_GPU_BF16 : SFI_GPU_F32, e->exact, st));
        }
        /* ranks other than 0 store their partial sum (see tp_reduce) */
        if ((rc = gemm(e, Ly->wd, bf ? e->act_b : (const void *)e->act_f, NULL, e->x, T, e->H, e->I,
                       e->rank == 0, st, err)))
            return rc;
        return tp_reduce(e, T, st, err);
    }
    /* router in f32 (small, and routing is sensitive to rounding) */
    if (e->exact) {
        CK(sfi_gpu_gemv_exact(Ly->router, e->xn, NULL, e->rl, T, e->E, e->H, 0, st));
    } else {
        const float one = 1.0f, zero = 0.0f;
        CKB(cublasSetStream(e->blas, st));
        CKB(cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, e->E, T, e->H, &one, Ly->router,
                         CUDA_R_32F, e->H, e->xn, CUDA_R_32F, e->H, &zero, e->rl, CUDA_R_32F, e->E,
                         CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    }
    CK(sfi_gpu_moe_route(e->rl, T, e->E, e->top, e->c.norm_topk_prob, e->sel_e, e->sel_w, e->exact,
                         st));
    if (!e->decoding && e->moe_grouped) {
        /* prefill (never captured, never exact): one GEMM per expert over
         * its pairs instead of one product per pair; this rank's share of
         * every expert's columns (e->Im) as in decode steps */
        if (e->rank > 0) /* the combine adds: start this rank's partial sum at 0 */
            CK(cudaMemsetAsync(e->x, 0, (size_t)T * e->H * 4, st));
        sfi_gpu_moe_grouped_args ga = {.T = T,
                                       .top = e->top,
                                       .E = e->E,
                                       .H = e->H,
                                       .Im = e->Im,
                                       .dtype = e->o.dtype,
                                       .w_gu = Ly->h_e_gu,
                                       .w_d = Ly->h_e_d,
                                       .x = e->xn,
                                       .sel_e = e->sel_e,
                                       .sel_w = e->sel_w,
                                       .h = e->x,
                                       .cnt = e->moe_cnt,
                                       .h_cnt = e->h_moe_cnt,
                                       .pos = e->moe_pos,
                                       .y1 = e->y1,
                                       .act = e->act2,
                                       .y2 = e->y2};
        if ((rc = sfi_gpu_moe_grouped(&ga, e->blas, st, err)))
            return rc;
        return tp_reduce(e, T, st, err);
    }
    CK(sfi_gpu_moe_gemv(Ly->e_gu, e->o.dtype, e->sel_e, T, e->top, e->xn, 0, 2 * e->Im, e->H, e->y1,
                        e->exact, st));
    CK(sfi_gpu_silu_mul(e->y1, T * e->top, e->Im, 0, e->act2, SFI_GPU_F32, e->exact, st));
    CK(sfi_gpu_moe_gemv(Ly->e_d, e->o.dtype, e->sel_e, T, e->top, e->act2, 1, e->H, e->Im, e->y2,
                        e->exact, st));
    if (e->rank > 0) /* the combine adds: start this rank's partial sum at 0 */
        CK(cudaMemsetAsync(e->x, 0, (size_t)T * e->H * 4, st));
    CK(sfi_gpu_moe_combine(e->x, e->y2, e->sel_w, T, e->top, e->H, e->exact, st));
    return tp_reduce(e, T, st, err);
}

/* Output projection of T rows of e->att into the residual. */
static sfi_status oproj(sfi_gpu_engine *e, int l, int T, cudaStream_t st, sfi_error *err)
{
    const dlayer *Ly = &e->lay[l];
    if (e->o.dtype == SFI_GPU_BF16 && !e->attn_ws.out_bf16) /* else the attention wrote it */
        CK(sfi_gpu_to_bf16(e->att, (size_t)T * e->nq, e->att_b, st));
    if (e->dnorm && e->decoding) /* and leaves the MLP's norm sums */
        return rownorm_gemm(e, Ly->wo, e->att_b, e->x, T, e->H, e->nq, SFI_GPU_EPI_ACCUMULATE, st,
                            err);
    /* tp > 1: rank 0 adds its heads' share and the bias to the residual,
     * the others store their share (see tp_reduce) */
    const int r0 = e->rank == 0;
    sfi_status rc = gemm(e, Ly->wo, gemm_in(e, e->att, e->att_b), r0 ? Ly->bo : NULL, e->x, T, e->H,
                         e->nq, r0, st, err);
    if (rc)
        return rc;
    return tp_reduce(e, T, st, err);
}

static void desc_header(const sfi_gpu_engine *e, sfi_gpu_step_desc *d, int batch, const int32_t *bt)
{
    memset(d, 0, sizeof *d);
    d->batch = batch;
    d->n_heads = e->nh;
    d->n_kv = e->nkv;
    d->head_dim = e->D;
    d->page = e->o.page;
    d->max_blocks = e->max_blocks;
    d->ld_logits = e->ld;
    d->compact_cap = e->ccap;
    d->n_sink = e->o.params.n_sink;
    d->K = e->o.params.K;
    d->max_ctx = e->cap;
    d->max_J = e->capJ;
    d->alt_rows = e->defer ? e->o.max_batch : 0;
    d->block_table = bt;
}

static sfi_gpu_sel_params sel_params(const sfi_params *p)
{
    sfi_gpu_sel_params s = {p->alpha,       p->gamma,       p->beta,       p->p,
                            p->eta,         p->lambda_clip, p->alpha_soft, p->T,
                            p->alpha_cross, p->eps,         p->nms_radius};
    return s;
}

/* Under tensor parallelism: every rank's z2 rows (steps 1-7 of its heads)
 * of the requests of h whose Selector runs, n_slots of them at most
 * (sfi_gpu_selector_pack), into z_all, rank 0's first. The rows go
 * through ws->f, steps 1-7's scratch, dead once they are done. Sized for
 * the step's slow requests rather than the batch: at batch 16 a slow step
 * has one or two, and the capacity's rows (8.4 MB a rank and layer for
 * Qwen3-4B at 32K over 2 GPUs) cost more than the whole Selector. */
static sfi_status gather_scores(sfi_gpu_engine *e, const sfi_gpu_step_desc *h,
                                const sfi_gpu_step_desc *d, const sfi_gpu_sel_ws *ws, int n_slots,
                                float *z_all, cudaStream_t st, sfi_error *err)
{
    CK(sfi_gpu_selector_pack(h, d, ws, n_slots, ws->f, st));
    return sfi_gpu_nccl_allgather(e->comm, ws->f, z_all, (size_t)n_slots * e->nkv * h->max_J * 4,
                                  st, err);
}

/* The Selector of one layer (method.md section 4, steps 1-9) for the
 * requests of h / d: sfi_gpu_selector at tp 1. Under tensor parallelism
 * step 8 (cross-head exclusivity) is a softmax over all the layer's KV
 * heads at each position, so it needs the other ranks' scores: steps 1-7
 * for this rank's heads, an all-gather of every rank's z2 rows, step 8
 * over every head in the global order (the single-GPU kernel's formulas)
 * and the Top-K of this rank's heads. */
static sfi_status selector(sfi_gpu_engine *e, const sfi_gpu_step_desc *h,
                           const sfi_gpu_step_desc *d, int n_slots, const sfi_gpu_sel_params *sp,
                           const float *logits, const float *kn, const sfi_gpu_sel_ws *ws,
                           int32_t *sel, cudaStream_t st, sfi_error *err)
{
    if (e->tp == 1) {
        CK(sfi_gpu_selector(h, d, sp, logits, kn, ws, NULL, sel, e->exact, st));
        return SFI_OK;
    }
    CK(sfi_gpu_selector_local(h, d, sp, logits, kn, ws, NULL, e->exact, st));
    sfi_status rc = gather_scores(e, h, d, ws, n_slots, e->z_all, st, err);
    if (rc)
        return rc;
    CK(sfi_gpu_selector_cross_tp(h, d, sp, e->z_all, n_slots, e->tp, e->rank, ws, sel, e->exact,
                                 st));
    return SFI_OK;
}

/* Greedy argmax (ties to the smaller id) of T rows of this rank's logits
 * into out (device): sfi_gpu_argmax at tp 1; under tensor parallelism
 * (the LM head split over the vocabulary) each rank's best of its rows,
 * all-gathered, and the best of those (sfi_gpu_tp.h). */
static sfi_status argmax(sfi_gpu_engine *e, const float *logits, int T, int32_t *out,
                         cudaStream_t st, sfi_error *err)
{
    if (e->tp == 1) {
        CK(sfi_gpu_argmax(logits, T, e->V, NULL, out, e->slots, st));
        return SFI_OK;
    }
    CK(sfi_gpu_argmax_keys(logits, T, e->Vl, e->v0, e->amax_keys, st));
    sfi_status rc =
        sfi_gpu_nccl_allgather(e->comm, e->amax_keys, e->amax_all, (size_t)T * 8, st, err);
    if (rc)
        return rc;
    CK(sfi_gpu_argmax_merge(e->amax_all, e->tp, T, e->amax_keys, out, st));
    return SFI_OK;
}

/* ---- prefill ---- */

/* Prompt of request b at positions 0..n-1; leaves x_0 in d_state->tok[b]
 * and the step's logits in e->logits row b; in SFI mode the Selector over
 * the last W_prefill queries initialises its sets (and compact rows). */
static sfi_status prefill(sfi_gpu_engine *e, int b, const int32_t *prompt, int n, sfi_error *err)
{
    cudaStream_t st = e->main_st;
    const sfi_params *P = &e->o.params;
    sfi_status rc;
    int chunk = e->exact ? PF_PSEUDO : e->o.prefill_chunk;
    if (chunk > e->rows_act)
        chunk = e->rows_act;
    int use_mma = !e->exact && e->o.dtype == SFI_GPU_BF16 && (e->D == 64 || e->D == 128);
    /* the prefill's pseudo-request table: every row is request b's */
    {
        int32_t *row = malloc((size_t)PF_PSEUDO * e->max_blocks * sizeof(int32_t));
        if (!row)
            return sfi_error_set(err, SFI_ENOMEM, "out of memory");
        for (int r = 0; r < PF_PSEUDO; r++)
            for (int i = 0; i < e->max_blocks; i++)
                row[(size_t)r * e->max_blocks + i] = b * e->max_blocks + i;
        cudaError_t ce = cudaMemcpy(e->bt_pf, row, (size_t)PF_PSEUDO * e->max_blocks * 4,
                                    cudaMemcpyHostToDevice);
        free(row);
        CK(ce);
    }
    /* window of the Selector: queries first..n-1 that see all of J */
    int jb, je, first = n, nw = 0;
    if (e->o.sfi) {
        sfi_state_candidates(P, n, &jb, &je);
        if (je > jb) {
            int W = P->W_prefill < n ? P->W_prefill : n;
            first = n - W;
            if (first < je - 1)
                first = je - 1;
            nw = n - first;
        }
    }
    int32_t *ids_dev = e->d_prompt;
    cudaError_t ce = cudaMemcpy(ids_dev, prompt, (size_t)n * 4, cudaMemcpyHostToDevice);
    CK(ce);
    rc = SFI_OK;
    for (int p0 = 0; p0 < n && !rc; p0 += chunk) {
        int T = n - p0 < chunk ? n - p0 : chunk;
        ce = sfi_gpu_embed(ids_dev + p0, T, e->embed, e->o.dtype, e->H, e->x, st);
        if (ce != cudaSuccess)
            break;
        /* pseudo-batch descriptor for the decode attention kernels */
        sfi_gpu_step_desc *hd = &e->h_pin[0];
        if (!use_mma) {
            CK(cudaStreamSynchronize(st)); /* h_pin is reused */
            desc_header(e, hd, 0, e->bt_pf);
        }
        for (int l = 0; l < e->L && !rc; l++) {
            const dlayer *Ly = &e->lay[l];
            if ((rc = norm_rows(e, e->x, e->dnorm ? NULL : Ly->in_norm, T, 0, st, err)))
                break;
            if ((rc = gemm(e, Ly->wqkv, gemm_in(e, e->xn, e->xn_b), e->exact ? Ly->bqkv : NULL,
                           e->qkv, T, e->nq + 2 * e->nkvd, e->H, 0, st, err)))
                break;
            sfi_gpu_qkv_args qa = qkv_args(e, l, T, e->knorm[l]);
            qa.pos0 = p0;
            qa.row0 = b;
            if ((ce = sfi_gpu_qkv_post(&qa, e->exact, st)) != cudaSuccess)
                break;
            /* keep the window queries */
            if (nw > 0) {
                int lo = first > p0 ? first : p0, hi = p0 + T;
                if (hi > lo && (ce = cudaMemcpyAsync(
                                    e->qwin + ((size_t)l * e->Wmax + (lo - first)) * e->nq,
                                    e->q + (size_t)(lo - p0) * e->nq, (size_t)(hi - lo) * e->nq * 4,
                                    cudaMemcpyDeviceToDevice, st)) != cudaSuccess)
                    break;
            }
            if (use_mma) {
                ce = sfi_gpu_prefill_attn(e->q, T, p0, b, e->nh, e->nkv, e->D, e->bt, e->max_blocks,
                                          e->o.page, e->kp[l], e->vp[l], e->o.dtype, e->att, st);
            } else {
                /* the decode kernels, one pseudo-request per token */
                for (int t0 = 0; t0 < T && ce == cudaSuccess; t0 += PF_PSEUDO) {
                    int tn = T - t0 < PF_PSEUDO ? T - t0 : PF_PSEUDO;
                    sfi_gpu_step_desc *h = &e->h_pin[1];
                    CK(cudaStreamSynchronize(st)); /* the previous upload of h_pin[1] is done */
                    *h = *hd;
                    h->batch = tn;
                    int mx = 0;
                    for (int t = 0; t < tn; t++) {
                        memset(&h->req[t], 0, sizeof h->req[t]);
                        h->req[t].ctx_len = p0 + t0 + t + 1;
                        mx = h->req[t].ctx_len;
                    }
                    h->max_ctx = mx;
                    ce = cudaMemcpyAsync(e->d_desc1, h, sizeof *h, cudaMemcpyHostToDevice, st);
                    if (ce == cudaSuccess)
                        ce = sfi_gpu_attn_dense(
                            h, e->d_desc1, e->o.dtype, e->q + (size_t)t0 * e->nq, e->kp[l],
                            e->vp[l], e->att + (size_t)t0 * e->nq, NULL, &e->attn_ws, e->exact, st);
                }
            }
            if (ce != cudaSuccess)
                break;
            if ((rc = oproj(e, l, T, st, err)) || (rc = mlp(e, l, T, st, err)))
                break;
        }
        if (ce != cudaSuccess)
            break;
        if (!rc && p0 + T == n) {
            /* logits of the last prompt position: x_0 */
            float *xl = e->x + (size_t)(T - 1) * e->H;
            if ((rc = norm_rows(e, xl, e->final_norm, 1, 0, st, err)))
                break;
            if ((rc = gemm(e, e->lm_head, gemm_in(e, e->xn, e->xn_b), NULL,
                           e->logits + (size_t)b * e->Vl, 1, e->Vl, e->H, 0, st, err)))
                break;
            if ((rc = argmax(e, e->logits + (size_t)b * e->Vl, 1, &e->d_state->tok[b], st, err)))
                break;
        }
    }
    cudaError_t ce2 = cudaStreamSynchronize(st);
    if (rc)
        return rc;
    if (ce == cudaSuccess)
        ce = ce2;
    CK(ce);
    if (!e->o.sfi)
        return SFI_OK;
    /* Selector initialisation (method.md section 5), request b alone */
    sfi_gpu_step_desc *h1 = &e->h_pin[0];
    desc_header(e, h1, 1, e->bt + (size_t)b * e->max_blocks);
    h1->req[0].ctx_len = n;
    h1->req[0].j_begin = jb;
    h1->req[0].j_end = je;
    h1->n_win = nw * e->G;
    if (nw == 0) /* J is empty: the reorg writes the sink rows alone */
        h1->req[0].j_begin = h1->req[0].j_end = 0;
    CK(cudaMemcpy(e->d_desc1, h1, sizeof *h1, cudaMemcpyHostToDevice));
    sfi_gpu_sel_params sp = sel_params(P);
    const int K = P->K;
    for (int l = 0; l < e->L; l++) {
        float *kn = e->knorm[l] + (size_t)b * e->nkv * e->ld;
        int32_t *sl = e->sel[l] + (size_t)b * e->nkv * K;
        size_t co = (size_t)b * e->nkv * e->ccap * e->D * e->esz;
        if (nw > 0) {
            CK(sfi_gpu_window_logits(e->qwin + (size_t)l * e->Wmax * e->nq, nw, first, n, b, e->nh,
                                     e->nkv, e->D, e->bt, e->max_blocks, e->o.page, e->kp[l],
                                     e->o.dtype, e->win, e->ld, st));
            if ((rc = selector(e, h1, e->d_desc1, h1->batch, &sp, e->win, kn, &e->sel_ws[0], sl, st,
                               err)))
                return rc;
        }
        CK(sfi_gpu_reorg(h1, e->d_desc1, e->o.dtype, e->kp[l], e->vp[l], sl, (char *)e->ck[l] + co,
                         (char *)e->cv[l] + co, NULL, st));
    }
    CK(cudaStreamSynchronize(st));
    return SFI_OK;
}

/* ---- one decode step (captured) ---- */

static sfi_status enqueue_layers(sfi_gpu_engine *e, int B, int sfi, int overlap,
                                 const sfi_gpu_sel_params *spp, sfi_error *err);

static sfi_status enqueue_step(sfi_gpu_engine *e, sfi_error *err)
{
    const int B = e->plan.batch;
    const int sfi = e->o.sfi, overlap = e->o.overlap && sfi;
    sfi_status rc;
    sfi_gpu_sel_params sp = sel_params(&e->o.params);
    /* the main stream's kernels overlap their launch with the previous
     * one's tail; the attention writes the O projection's bf16 input */
    /* H100, 0.6B shape, batch 16 at 8K: PDL took SFI fast steps from 3.205
     * to 3.007 ms but dense steps from 6.643 to 7.166 ms (the next kernel's
     * early CTAs slow the long dense attention), hence the auto rule */
    sfi_gpu_set_pdl(e->o.pdl < 0 ? e->o.sfi : e->o.pdl);
    if (e->o.dtype == SFI_GPU_BF16 && !e->exact)
        e->attn_ws.out_bf16 = e->att_b;
    sfi_gpu_gemm_set_ws(e->gemm_part, e->gemm_part_floats, e->gemm_cnt, e->gemm_tiles);
    e->decoding = 1;
    /* the fast body's attention: a grid of the fast rows alone (one CTA
     * per (request, KV head) where their rows are not cut finer), and
     * there a deep pipeline, whose shared memory keeps one CTA to an SM:
     * with two (3 stages) the scheduler doubled some up while other SMs
     * idled (H100, 0.6B batch 16: fast steps 3.050 ms with 3 stages, 2.803
     * with 4, 2.691 with 6; with the grid of the context and 3 stages, as
     * in a step with slow requests, 2.879). Groups of 2 take 7, the most
     * that fits (224 KiB; at 32K 2.686 -> 2.647 ms against 6, the
     * attention alone 1.662 -> 1.621 ms a step), groups of 4 take 4. Where
     * fast rows are cut finer (small batches) the pieces outnumber the
     * SMs and 6 stages measured slower (batch 4 at 32K: 1.568 against
     * 1.544 ms). */
    e->attn_ws.fast_rows =
        e->fast_body ? e->o.params.n_sink + e->o.params.K + e->o.params.n_recent : 0;
    sfi_gpu_attn_set_stages(e->fast_body && e->attn_ws.fast_splits == 0 ? e->fast_stages
                                                                        : e->stages);
    /* the step without the Selector chain: nothing on the side stream
     * needs the SMs, so each product lets the next one in as soon as it
     * may start (sfi_gpu_gemm_set_trigger: fast steps 2.578 -> 2.551 ms,
     * Qwen3-0.6B batch 16 32K on an H100) */
    sfi_gpu_gemm_set_trigger(e->fast_body && e->slab_trigger ? 1 : 0);
    rc = enqueue_layers(e, B, sfi, overlap, &sp, err);
    sfi_gpu_gemm_set_trigger(0);
    sfi_gpu_attn_set_stages(e->stages);
    e->attn_ws.fast_rows = 0;
    e->decoding = 0;
    sfi_gpu_set_pdl(0);
    e->attn_ws.out_bf16 = NULL;
    return rc;
}

/* The rest of layer l's Selector chain under tensor parallelism with
 * overlap: every collective stays on the main stream, in one order on all
 * ranks (NCCL collectives of one communicator on two streams can
 * deadlock), so the main stream all-gathers the scores that the side
 * stream's steps 1-7 wrote (enqueued after the layer's MLP, which ran
 * beside them) and the side stream does step 8, the Top-K and the reorg
 * while the main stream goes on with the next layers. Each ring slot has
 * its own gathered scores: layer l + 1's all-gather may run before layer
 * l's step 8 has read them. */
static sfi_status tp_chain_rest(sfi_gpu_engine *e, int l, const sfi_gpu_sel_params *sp,
                                sfi_error *err)
{
    const int slot = l % R_SLOTS;
    const sfi_gpu_sel_ws *ws = &e->sel_ws[slot];
    float *z_all = e->z_all + (size_t)slot * e->z_all_floats;
    CK(cudaStreamWaitEvent(e->main_st, e->ev_free[slot], 0));
    sfi_status rc =
        gather_scores(e, &e->h_cap, e->d_desc, ws, e->sel_slots, z_all, e->main_st, err);
    if (rc)
        return rc;
    CK(cudaEventRecord(e->ev_gath[slot], e->main_st));
    CK(cudaStreamWaitEvent(e->side_st, e->ev_gath[slot], 0));
    int pdl = sfi_gpu_pdl();
    sfi_gpu_set_pdl(0);
    CK(sfi_gpu_selector_cross_tp(&e->h_cap, e->d_desc, sp, z_all, e->sel_slots, e->tp, e->rank, ws,
                                 e->sel[l], e->exact, e->side_st));
    CK(sfi_gpu_reorg(&e->h_cap, e->d_desc, e->o.dtype, e->kp[l], e->vp[l], e->sel[l], e->ck[l],
                     e->cv[l], NULL, e->side_st));
    sfi_gpu_set_pdl(pdl);
    return SFI_OK;
}

static sfi_status enqueue_layers(sfi_gpu_engine *e, int B, int sfi, int overlap,
                                 const sfi_gpu_sel_params *spp, sfi_error *err)
{
    cudaStream_t st = e->main_st, side = e->side_st;
    sfi_gpu_sel_params sp = *spp;
    sfi_status rc;
    CK(sfi_gpu_plan_step(&e->plan, e->d_state, e->d_desc, e->d_dsel, e->hist_kind, st));
    const size_t lg_layer = (size_t)e->o.max_batch * e->nh * e->ld;
    /* tp > 1 with overlap: each layer's all-gather, step 8, Top-K and
     * reorg come after an MLP (tp_chain_rest) */
    const int tp_rest =
        sfi && !e->defer && !e->fast_body && overlap && e->tp > 1 && !e->o.skip_select;
    if (e->defer) {
        /* the previous step's slow requests: every layer's Selector, Top-K
         * and reorg from its kept logits into their inactive buffers,
         * behind this whole step (joined after the argmax) */
        cudaStream_t ss = overlap ? side : st;
        if (overlap) {
            CK(cudaEventRecord(e->ev_plan, st));
            CK(cudaStreamWaitEvent(side, e->ev_plan, 0));
        }
        int pdl = sfi_gpu_pdl();
        sfi_gpu_set_pdl(0);
        for (int l = 0; l < e->L && !e->o.skip_select; l++) {
            if ((rc = selector(e, &e->h_cap, e->d_dsel, e->h_cap.batch, &sp,
                               e->lg_keep + l * lg_layer, e->knorm[l], &e->sel_ws[0], e->sel[l], ss,
                               err)))
                return rc;
            CK(sfi_gpu_reorg(&e->h_cap, e->d_dsel, e->o.dtype, e->kp[l], e->vp[l], e->sel[l],
                             e->ck[l], e->cv[l], NULL, ss));
        }
        if (overlap)
            CK(cudaEventRecord(e->ev_done, side));
        sfi_gpu_set_pdl(pdl);
    }
    if (e->dnorm)
        CK(sfi_gpu_embed_rownorm(e->d_state->in_tok, B, e->embed, e->o.dtype, e->H, e->x, e->ss,
                                 e->xn_b, st));
    else
        CK(sfi_gpu_embed(e->d_state->in_tok, B, e->embed, e->o.dtype, e->H, e->x, st));
    for (int l = 0; l < e->L; l++) {
        const dlayer *Ly = &e->lay[l];
        const int slot = l % R_SLOTS;
        int fused = 0;
        if (e->dnorm) {
            if ((rc = rownorm_gemm(e, Ly->wqkv, e->xn_b, e->qkv, B, e->nq + 2 * e->nkvd, e->H,
                                   SFI_GPU_EPI_STORE, st, err)))
                return rc;
            fused = 1;
        } else if (!(e->exact && Ly->bqkv) &&
                   (rc = gemm_normed(e, Ly->in_norm, Ly->wqkv, e->qkv, B, e->nq + 2 * e->nkvd, e->H,
                                     SFI_GPU_EPI_STORE, st, &fused, err)))
            return rc;
        if (!fused && (rc = norm_rows(e, e->x, Ly->in_norm, B, 0, st, err)))
            return rc;
        if (!fused &&
            (rc = gemm(e, Ly->wqkv, gemm_in(e, e->xn, e->xn_b), e->exact ? Ly->bqkv : NULL, e->qkv,
                       B, e->nq + 2 * e->nkvd, e->H, 0, st, err)))
            return rc;
        sfi_gpu_qkv_args qa = qkv_args(e, l, B, sfi ? e->knorm[l] : NULL);
        qa.pos_arr = e->d_state->pos;
        qa.row0 = -1;
        /* one GPU and groups of 2 or 4 (Qwen3-0.6B to 8B; check's d128
         * cases): the kernel takes up to 6 without head slices, but the
         * other groups have not been run */
        const int fuse = e->qkv_fuse && (e->qkv_fuse > 1 || e->fast_body) && !e->skip_qkv &&
                         !e->exact && e->o.dtype == SFI_GPU_BF16 && e->D == 128 &&
                         (e->G == 2 || e->G == 4) && !Ly->bqkv && e->tp == 1;
        if (fuse)
            e->attn_ws.fuse = (sfi_gpu_attn_fuse){.qkv = e->qkv,
                                                  .q_norm = Ly->q_norm,
                                                  .k_norm = Ly->k_norm,
                                                  .cs = e->cs,
                                                  .sn = e->sn,
                                                  .eps = e->eps,
                                                  .key_norms = qa.key_norms,
                                                  .ld_norms = e->ld};
        else if (!e->skip_qkv)
            CK(sfi_gpu_qkv_post(&qa, e->exact, st));
        if (overlap && !e->defer && !e->fast_body && l >= R_SLOTS)
            CK(cudaStreamWaitEvent(st, e->ev_free[slot], 0));
        float *lg = !sfi ? NULL : e->defer ? e->lg_keep + l * lg_layer : e->logits_ring[slot];
        if (!e->skip_attn)
            CK(sfi_gpu_attn_mixed(&e->h_cap, e->d_desc, e->o.dtype, e->q, e->kp[l], e->vp[l],
                                  sfi ? e->ck[l] : NULL, sfi ? e->cv[l] : NULL, e->att, lg,
                                  &e->attn_ws, e->exact, st));
        e->attn_ws.fuse = (sfi_gpu_attn_fuse){0};
        if (sfi && !e->defer && !e->fast_body && l < e->L - e->skip_tail) {
            cudaStream_t ss = overlap ? side : st;
            if (overlap) {
                CK(cudaEventRecord(e->ev_attn[slot], st));
                CK(cudaStreamWaitEvent(side, e->ev_attn[slot], 0));
            }
            int pdl = sfi_gpu_pdl();
            sfi_gpu_set_pdl(0); /* the side stream's kernels wait on events */
            if (overlap && e->tp > 1) {
                /* steps 1-7 here; the scores' all-gather, step 8, Top-K
                 * and reorg after this layer's MLP (tp_chain_rest) */
                if (!e->o.skip_select)
                    CK(sfi_gpu_selector_local(&e->h_cap, e->d_desc, &sp, e->logits_ring[slot],
                                              e->knorm[l], &e->sel_ws[slot], NULL, e->exact, side));
                CK(cudaEventRecord(e->ev_free[slot], side));
            } else {
                if (!e->o.skip_select && !e->skip_sel &&
                    (rc = selector(e, &e->h_cap, e->d_desc, e->sel_slots, &sp, e->logits_ring[slot],
                                   e->knorm[l], &e->sel_ws[slot], e->sel[l], ss, err)))
                    return rc;
                if (overlap)
                    CK(cudaEventRecord(e->ev_free[slot], side));
                if (!e->o.skip_select && !e->skip_reorg)
                    CK(sfi_gpu_reorg(&e->h_cap, e->d_desc, e->o.dtype, e->kp[l], e->vp[l],
                                     e->sel[l], e->ck[l], e->cv[l], NULL, ss));
            }
            sfi_gpu_set_pdl(pdl);
        }
        if ((rc = oproj(e, l, B, st, err)) || (rc = mlp(e, l, B, st, err)))
            return rc;
        if (tp_rest && (rc = tp_chain_rest(e, l, &sp, err)))
            return rc;
    }
    if ((rc = norm_rows(e, e->x, e->final_norm, B, 0, st, err)))
        return rc;
    if (!e->skip_lm && (rc = gemm(e, e->lm_head, gemm_in(e, e->xn, e->xn_b), NULL, e->logits, B,
                                  e->Vl, e->H, 0, st, err)))
        return rc;
    if ((rc = argmax(e, e->logits, B, e->next, st, err)))
        return rc;
    CK(sfi_gpu_end_step(&e->plan, e->d_state, e->next, e->hist_tok, st));
    if (e->sel_graphs)
        CK(cudaMemcpyAsync(e->h_flag, &e->d_state->next_slow, 4, cudaMemcpyDeviceToHost, st));
    if (overlap && e->defer) /* the deferred Selector's join (graph capture needs it) */
        CK(cudaStreamWaitEvent(st, e->ev_done, 0));
    if (overlap && !e->defer && !e->fast_body) {
        /* the side stream joins here, at the end, so the last layers'
         * chains run beside the final norm, LM head and argmax, which
         * touch no selected set or compact row (H100, Qwen3-0.6B batch 16
         * 32K: 4320.8 / 4319.5 tok/s with the join before the final norm,
         * 4325.7 / 4325.1 here: about the same; their tail is short) */
        CK(cudaEventRecord(e->ev_done, side));
        CK(cudaStreamWaitEvent(st, e->ev_done, 0));
    }
    return SFI_OK;
}

/* ---- run ---- */

/* Request b's active sets (as they are after the last step), reported
 * as those of `step`. */
static sfi_status observe_selected(sfi_gpu_engine *e, const sfi_gpu_observer *obs, int b, int step,
                                   int32_t *buf, sfi_error *err)
{
    const int K = e->o.params.K;
    int kout = 0, which = 0;
    CK(cudaMemcpy(&kout, &e->d_state->kout[b], 4, cudaMemcpyDeviceToHost));
    if (e->defer)
        CK(cudaMemcpy(&which, &e->d_state->buf[b], 4, cudaMemcpyDeviceToHost));
    const size_t row = (size_t)b + (which ? (size_t)e->o.max_batch : 0);
    for (int l = 0; l < e->L; l++) {
        if (e->tp > 1) { /* every rank's heads, rank 0's first: the layer's order */
            sfi_status rc =
                sfi_gpu_nccl_allgather(e->comm, e->sel[l] + row * e->nkv * K, e->sel_all,
                                       (size_t)e->nkv * K * 4, e->main_st, err);
            if (rc)
                return rc;
            CK(cudaStreamSynchronize(e->main_st));
            CK(cudaMemcpy(buf, e->sel_all, (size_t)e->nkv_g * K * 4, cudaMemcpyDeviceToHost));
        } else {
            CK(cudaMemcpy(buf, e->sel[l] + row * e->nkv * K, (size_t)e->nkv * K * 4,
                          cudaMemcpyDeviceToHost));
        }
        sfi_status rc = obs->on_selected(obs->user, b, step, l, buf, e->nkv_g, K, kout, err);
        if (rc)
            return rc;
    }
    return SFI_OK;
}

/* The B rows of the last step's logits, the whole vocabulary, into lg
 * [B][V] (host); under tensor parallelism gathered from every rank's rows
 * (a collective: every rank calls it). */
static sfi_status read_logits(sfi_gpu_engine *e, int B, float *lg, sfi_error *err)
{
    if (e->tp == 1) {
        CK(cudaMemcpy(lg, e->logits, (size_t)B * e->V * 4, cudaMemcpyDeviceToHost));
        return SFI_OK;
    }
    const size_t Vc = (size_t)e->Vc;
    sfi_status rc = sfi_gpu_nccl_group(1, err);
    for (int b = 0; b < B && !rc; b++)
        rc = sfi_gpu_nccl_allgather(e->comm, e->logits + (size_t)b * e->Vl,
                                    e->lg_all + (size_t)b * e->tp * Vc, Vc * 4, e->main_st, err);
    sfi_status rc2 = sfi_gpu_nccl_group(0, err);
    if (rc || rc2)
        return rc ? rc : rc2;
    CK(cudaStreamSynchronize(e->main_st));
    float *tmp = malloc((size_t)B * e->tp * Vc * 4);
    if (!tmp)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    cudaError_t ce = cudaMemcpy(tmp, e->lg_all, (size_t)B * e->tp * Vc * 4, cudaMemcpyDeviceToHost);
    if (ce == cudaSuccess)
        for (int b = 0; b < B; b++)
            for (int r = 0; r < e->tp; r++) {
                size_t v0 = (size_t)r * Vc, n = v0 + Vc <= (size_t)e->V ? Vc : (size_t)e->V - v0;
                memcpy(lg + (size_t)b * e->V + v0, tmp + ((size_t)b * e->tp + r) * Vc, n * 4);
            }
    free(tmp);
    CK(ce);
    return SFI_OK;
}

/* sfi_gpu_engine_run's phases: RUN_TRY passes a failed call's status on. */
#define RUN_TRY(x)                                                                                 \
    do {                                                                                           \
        sfi_status rc_ = (x);                                                                      \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

/* Checks the batch against the engine; *forced: whether the requests are
 * replayed (all or none may be). */
static sfi_status check_requests(const sfi_gpu_engine *e, const sfi_gpu_request *rq, int B,
                                 int *forced_out, sfi_error *err)
{
    const int max_new = e->o.max_new;
    if (B < 1 || B > e->o.max_batch)
        return sfi_error_set(err, SFI_ERANGE, "batch %d: the engine was made for 1..%d", B,
                             e->o.max_batch);
    for (int b = 0; b < B; b++) {
        if (rq[b].n_prompt < 1)
            return sfi_error_set(err, SFI_EINVAL, "request %d: empty prompt", b);
        if ((long)rq[b].n_prompt + max_new - 1 > e->cap)
            return sfi_error_set(err, SFI_ERANGE,
                                 "request %d: %d prompt tokens + %d new exceed the engine's %d "
                                 "positions",
                                 b, rq[b].n_prompt, max_new, e->cap);
        for (int i = 0; i < rq[b].n_prompt; i++)
            if (rq[b].prompt[i] < 0 || rq[b].prompt[i] >= e->V)
                return sfi_error_set(err, SFI_ERANGE,
                                     "request %d: prompt token %d (id %d) outside the vocabulary "
                                     "[0, %d)",
                                     b, i, (int)rq[b].prompt[i], e->V);
        if (rq[b].force) {
            if (rq[b].n_force < max_new - 1)
                return sfi_error_set(err, SFI_EINVAL,
                                     "request %d: %d forced tokens, %d steps need %d", b,
                                     rq[b].n_force, max_new, max_new - 1);
            for (int i = 0; i < max_new - 1; i++)
                if (rq[b].force[i] < 0 || rq[b].force[i] >= e->V)
                    return sfi_error_set(err, SFI_ERANGE,
                                         "request %d: forced token %d (id %d) outside the "
                                         "vocabulary",
                                         b, i, (int)rq[b].force[i]);
        }
    }
    int forced = rq[0].force != NULL;
    for (int b = 1; b < B; b++)
        if ((rq[b].force != NULL) != forced)
            return sfi_error_set(err, SFI_EINVAL, "either every request is replayed or none");
    *forced_out = forced;
    return SFI_OK;
}

/* The run state on the device, the forced tokens, the plan and the
 * grid-sizing descriptor. nn = B * max_new. */
static sfi_status setup_run(sfi_gpu_engine *e, const sfi_gpu_request *rq, int B, int forced,
                            size_t nn, sfi_error *err)
{
    const int max_new = e->o.max_new;
    sfi_gpu_run_state s0;
    memset(&s0, 0, sizeof s0);
    for (int b = 0; b < B; b++) {
        s0.ctx[b] = rq[b].n_prompt;
        s0.active[b] = max_new > 1;
        s0.installed[b] = -1;
        if (e->o.sfi) { /* the prefill's selection: |selected| = min(K, |J|) */
            int jb, je;
            sfi_state_candidates(&e->o.params, rq[b].n_prompt, &jb, &je);
            s0.kout[b] = je > jb ? (e->o.params.K < je - jb ? e->o.params.K : je - jb) : 0;
        }
    }
    CK(cudaMemcpy(e->d_state, &s0, sizeof s0, cudaMemcpyHostToDevice));
    if (forced) {
        int32_t *f = calloc(nn, sizeof(int32_t));
        if (!f)
            return sfi_error_set(err, SFI_ENOMEM, "out of memory");
        for (int b = 0; b < B; b++)
            memcpy(f + (size_t)b * max_new, rq[b].force, (size_t)(max_new - 1) * 4);
        cudaError_t ce = cudaMemcpy(e->d_force, f, nn * 4, cudaMemcpyHostToDevice);
        free(f);
        CK(ce);
    }
    sfi_gpu_plan_cfg *pc = &e->plan;
    memset(pc, 0, sizeof *pc);
    pc->batch = B;
    pc->sfi = e->o.sfi;
    pc->policy = e->o.trigger;
    pc->T_max = e->o.params.T_max;
    pc->interval = e->o.interval;
    pc->n_sink = e->o.params.n_sink;
    pc->n_recent = e->o.params.n_recent;
    pc->K = e->o.params.K;
    pc->max_new = max_new;
    pc->stop_token = e->o.stop_token;
    pc->n_stop_more = e->o.n_stop_more < 16 ? e->o.n_stop_more : 16;
    memcpy(pc->stop_more, e->o.stop_more, sizeof pc->stop_more);
    pc->is_trigger = e->d_trig;
    pc->n_vocab = e->d_trig ? e->o.n_trigger_vocab : 0;
    pc->force = forced ? e->d_force : NULL;
    pc->refresh_delay = e->defer ? e->o.params.refresh_delay : 0;
    /* the grid-sizing descriptor: every request at the capacity */
    desc_header(e, &e->h_cap, B, e->bt);
    e->sel_slots = B;
    for (int b = 0; b < B; b++) {
        e->h_cap.req[b].ctx_len = e->cap;
        e->h_cap.req[b].recent_begin = e->cap;
        e->h_cap.req[b].n_compact = e->ccap;
        e->h_cap.req[b].j_begin = e->o.params.n_sink;
        e->h_cap.req[b].j_end = e->o.params.n_sink + e->capJ;
    }
    CK(cudaMemcpy(e->d_desc, &e->h_cap, sizeof e->h_cap, cudaMemcpyHostToDevice));
    if (e->defer) /* the header; the plan kernel writes req[] */
        CK(cudaMemcpy(e->d_dsel, &e->h_cap, sizeof e->h_cap, cudaMemcpyHostToDevice));
    return SFI_OK;
}

/* Step 0 (the prefill's): its histories, and what the observer sees. hk, ht:
 * B entries; lg: B rows of logits; selbuf: one request's sets. */
static sfi_status first_step(sfi_gpu_engine *e, const sfi_gpu_observer *obs, int B, int32_t *hk,
                             int32_t *ht, float *lg, int32_t *selbuf, sfi_error *err)
{
    {
        /* step 0's histories */
        for (int b = 0; b < B; b++)
            hk[b] = SFI_STEP_SLOW | (SFI_REASON_FIRST << 4);
        CK(cudaMemcpy(e->hist_kind, hk, (size_t)B * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(e->hist_tok, e->d_state->tok, (size_t)B * 4, cudaMemcpyDeviceToDevice));
    }
    if (obs) {
        CK(cudaMemcpy(ht, e->d_state->tok, (size_t)B * 4, cudaMemcpyDeviceToHost));
        RUN_TRY(read_logits(e, B, lg, err));
        for (int b = 0; b < B; b++) {
            if (e->o.sfi && obs->on_selected)
                RUN_TRY(observe_selected(e, obs, b, -1, selbuf, err));
            if (obs->on_step)
                RUN_TRY(obs->on_step(obs->user, b, 0, SFI_STEP_SLOW, SFI_REASON_FIRST, ht[b],
                                     lg + (size_t)b * e->V, e->V, err));
        }
    }
    return SFI_OK;
}

/* The captured graph g made executable in *gx (with its nodes'
 * priorities: the side stream's are lower) and destroyed; the time since
 * tg counted as graph building. */
static sfi_status instantiate_graph(cudaGraph_t g, cudaGraphExec_t *gx, double tg,
                                    sfi_gpu_run_result *res, sfi_error *err)
{
    cudaError_t ce = cudaGraphInstantiateWithFlags(gx, g, cudaGraphInstantiateFlagUseNodePriority);
    cudaGraphDestroy(g);
    CK(ce);
    res->graph_build_s += sfi_clock_wall() - tg;
    return SFI_OK;
}

/* Captures one decode step into *gx (the step itself is not run); with
 * no_chain, the step without the Selector chain (see sel_graphs), whose
 * attention is the fast body's (no request is slow in it): on 2 x H200,
 * Qwen3-4B batch 16 tp 2, fast steps 4.474 -> 4.418 ms at 32K, 4.427 ->
 * 4.385 at 8K. */
static sfi_status capture_step(sfi_gpu_engine *e, cudaGraphExec_t *gx, int no_chain,
                               sfi_gpu_run_result *res, sfi_error *err)
{
    double tg = sfi_clock_wall();
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(e->main_st, cudaStreamCaptureModeThreadLocal));
    e->fast_body = no_chain;
    sfi_status rc = enqueue_step(e, err);
    e->fast_body = 0;
    cudaError_t ce = cudaStreamEndCapture(e->main_st, &g);
    if (rc)
        return rc;
    CK(ce);
    return instantiate_graph(g, gx, tg, res, err);
}

/* Captures one decode step into *gx as a graph that chooses its body on
 * the device: a kernel sets the condition from d_state->next_slow (the
 * last step's end), then a conditional IF node runs body 0, the step
 * without the Selector chain and with the attention grid of fast rows
 * (fast_body), when no request needs the chain, else body 1, the step as
 * capture_step makes it. Both bodies compute the same outputs when no
 * request is slow: the chain would find no request with a non-empty J
 * (and no sink to refresh), and a fast request's pieces do not depend on
 * the grid (each is at least min_split_rows). */
static sfi_status capture_cond_step(sfi_gpu_engine *e, cudaGraphExec_t *gx, sfi_gpu_run_result *res,
                                    sfi_error *err)
{
    double tg = sfi_clock_wall();
    cudaGraph_t g = NULL, gout = NULL;
    cudaGraphConditionalHandle h = 0;
    enum cudaStreamCaptureStatus cs;
    const cudaGraphNode_t *deps = NULL;
    size_t nd = 0;
    cudaGraphNode_t cn;
    CK(cudaStreamBeginCapture(e->main_st, cudaStreamCaptureModeThreadLocal));
    cudaError_t ce = cudaStreamGetCaptureInfo(e->main_st, &cs, NULL, &g, NULL, NULL, NULL);
    if (ce == cudaSuccess)
        ce = cudaGraphConditionalHandleCreate(&h, g, 0, 0);
    if (ce == cudaSuccess)
        ce = sfi_gpu_set_step_cond(h, e->d_state, e->main_st);
    if (ce == cudaSuccess)
        ce = cudaStreamGetCaptureInfo(e->main_st, &cs, NULL, NULL, &deps, NULL, &nd);
    struct cudaGraphNodeParams cp;
    memset(&cp, 0, sizeof cp);
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = h;
    cp.conditional.type = cudaGraphCondTypeIf;
    cp.conditional.size = 2;
    if (ce == cudaSuccess)
        ce = cudaGraphAddNode(&cn, g, deps, NULL, nd, &cp);
    if (ce == cudaSuccess)
        ce = cudaStreamUpdateCaptureDependencies(e->main_st, &cn, NULL, 1,
                                                 cudaStreamSetCaptureDependencies);
    cudaError_t ce2 = cudaStreamEndCapture(e->main_st, &gout);
    if (ce != cudaSuccess || ce2 != cudaSuccess) {
        if (gout)
            cudaGraphDestroy(gout);
        CK(ce != cudaSuccess ? ce : ce2);
    }
    for (int body = 0; body < 2; body++) {
        cudaGraph_t bg = cp.conditional.phGraph_out[body], bout = NULL;
        ce = cudaStreamBeginCaptureToGraph(e->main_st, bg, NULL, NULL, 0,
                                           cudaStreamCaptureModeThreadLocal);
        if (ce != cudaSuccess) {
            cudaGraphDestroy(gout);
            CK(ce);
        }
        e->fast_body = body == 0;
        sfi_status rc = enqueue_step(e, err);
        e->fast_body = 0;
        ce = cudaStreamEndCapture(e->main_st, &bout);
        if (rc || ce != cudaSuccess) {
            cudaGraphDestroy(gout);
            if (rc)
                return rc;
            CK(ce);
        }
    }
    return instantiate_graph(gout, gx, tg, res, err);
}

/* Under sel_graphs: waits for the last step (whose end copied next_slow
 * to h_flag) and says whether this step can leave the Selector chain out
 * and, if not, for how many requests its scores' all-gather must carry
 * rows: the next power of two (a graph each), the batch at most. The
 * same answers on every rank: they depend on tokens only. */
static sfi_status chain_unneeded(sfi_gpu_engine *e, int B, int *skip, int *slots, sfi_error *err)
{
    CK(cudaEventSynchronize(e->ev_step));
    const int n = *(volatile int32_t *)e->h_flag;
    *skip = n == 0;
    int c = 1;
    while (c < n && c < B)
        c *= 2;
    *slots = c < B ? c : B;
    return SFI_OK;
}

/* Index of the graph for a slot count (a power of two below the batch). */
static int slot_class(int slots)
{
    int i = 0;
    while ((1 << i) < slots && i < SEL_CLASSES - 1)
        i++;
    return i;
}

/* What the observer sees of decode step t, once it has run. */
static sfi_status observe_step(sfi_gpu_engine *e, const sfi_gpu_observer *obs, int B, int t,
                               int32_t *hk, int32_t *ht, float *lg, int32_t *selbuf, sfi_error *err)
{
    CK(cudaStreamSynchronize(e->main_st));
    CK(cudaMemcpy(hk, e->hist_kind + (size_t)t * B, (size_t)B * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ht, e->hist_tok + (size_t)t * B, (size_t)B * 4, cudaMemcpyDeviceToHost));
    RUN_TRY(read_logits(e, B, lg, err));
    sfi_gpu_run_state s;
    CK(cudaMemcpy(&s, e->d_state, sizeof s, cudaMemcpyDeviceToHost));
    for (int b = 0; b < B; b++) {
        if (s.pos[b] < 0)
            continue; /* finished */
        int kind = hk[b] & 15, why = hk[b] >> 4;
        /* sets as they take effect (sfi-ref's digest order):
         * a slow step's at once; deferred ones at step t + d,
         * reported as those of the step that chose them */
        if (e->defer && s.installed[b] >= 0 && obs->on_selected)
            RUN_TRY(observe_selected(e, obs, b, s.installed[b], selbuf, err));
        if (e->o.sfi && !e->defer && kind == SFI_STEP_SLOW && obs->on_selected)
            RUN_TRY(observe_selected(e, obs, b, t, selbuf, err));
        if (obs->on_step)
            RUN_TRY(
                obs->on_step(obs->user, b, t, kind, why, ht[b], lg + (size_t)b * e->V, e->V, err));
    }
    return SFI_OK;
}

/* Decode steps 1..max_new-1, enqueued on e->main_st (and, with timing,
 * bracketed by the events ev[0..max_new-1]); with an observer, each is
 * waited for and observed. */
static sfi_status decode_steps(sfi_gpu_engine *e, const sfi_gpu_observer *obs, int B,
                               int time_steps, cudaEvent_t *ev, int32_t *hk, int32_t *ht, float *lg,
                               int32_t *selbuf, sfi_gpu_run_result *res, sfi_error *err)
{
    const int max_new = e->o.max_new;
    int use_graph = e->o.graphs;
    if (e->graph_exec) { /* a previous run's: its batch and plan are baked in */
        cudaGraphExecDestroy(e->graph_exec);
        e->graph_exec = NULL;
    }
    if (e->graph_nosel) {
        cudaGraphExecDestroy(e->graph_nosel);
        e->graph_nosel = NULL;
    }
    for (int i = 0; i < SEL_CLASSES; i++)
        if (e->graph_slots[i]) {
            cudaGraphExecDestroy(e->graph_slots[i]);
            e->graph_slots[i] = NULL;
        }
    e->sel_slots = B;
    /* step 1 runs eagerly (one-time setup such as kernel attributes
     * happens outside any capture); it is then captured once and
     * replayed for every later step */
    if (time_steps) {
        for (int t = 0; t < max_new; t++)
            CK(cudaEventCreate(&ev[t]));
        CK(cudaEventRecord(ev[0], e->main_st));
    }
    /* SFI_GPU_PROFILE_STEP=t brackets step t with cudaProfilerStart/Stop
     * (ncu --profile-from-start off); use with --no-graph */
    const char *pe = getenv("SFI_GPU_PROFILE_STEP");
    int prof_step = pe ? atoi(pe) : -1;
    for (int t = 1; t < max_new; t++) {
        if (t == prof_step)
            CK(cudaProfilerStart());
        int skip = 0, slots = B;
        if (e->sel_graphs && t > 1) {
            RUN_TRY(chain_unneeded(e, B, &skip, &slots, err));
            res->n_no_chain += skip;
        }
        if (use_graph && t > 1 && !skip && slots < B) {
            CK(cudaGraphLaunch(e->graph_slots[slot_class(slots)], e->main_st));
        } else if (use_graph && t > 1) {
            CK(cudaGraphLaunch(skip ? e->graph_nosel : e->graph_exec, e->main_st));
        } else {
            e->sel_slots = slots;
            e->fast_body = skip;
            sfi_status rs = enqueue_step(e, err);
            e->fast_body = 0;
            e->sel_slots = B;
            RUN_TRY(rs);
            int plain = use_graph && !e->cond_graphs;
            if (use_graph && e->cond_graphs) {
                /* a conditional body takes kernels, memsets and copies
                 * only; MoE models' steps (their router's product is the
                 * step's one cuBLAS call) failed to instantiate on the
                 * H100: then the plain graph, and the bench says so */
                sfi_error ce;
                sfi_error_clear(&ce);
                if (capture_cond_step(e, &e->graph_exec, res, &ce) == SFI_OK) {
                    res->cond_graph = 1;
                } else {
                    cudaGetLastError(); /* not a sticky error: clear it */
                    e->graph_exec = NULL;
                    e->cond_graphs = 0;
                    res->cond_graph = -1;
                    snprintf(res->cond_why, sizeof res->cond_why, "%.95s", ce.msg);
                    plain = 1;
                }
            }
            if (plain)
                RUN_TRY(capture_step(e, &e->graph_exec, 0, res, err));
            if (use_graph && e->sel_graphs)
                RUN_TRY(capture_step(e, &e->graph_nosel, 1, res, err));
            /* every slot count's graph now, with the others (made when
             * first needed, one cost 12 ms inside a timed step) */
            for (int c = 1; use_graph && e->sel_graphs && c < B; c *= 2) {
                e->sel_slots = c;
                rs = capture_step(e, &e->graph_slots[slot_class(c)], 0, res, err);
                e->sel_slots = B;
                RUN_TRY(rs);
            }
        }
        if (e->sel_graphs)
            CK(cudaEventRecord(e->ev_step, e->main_st));
        if (time_steps)
            CK(cudaEventRecord(ev[t], e->main_st));
        if (t == prof_step) {
            CK(cudaStreamSynchronize(e->main_st));
            CK(cudaProfilerStop());
        }
        if (obs)
            RUN_TRY(observe_step(e, obs, B, t, hk, ht, lg, selbuf, err));
    }
    return SFI_OK;
}

/* The histories into res: ids, kinds, reasons, slow steps and tokens
 * generated (up to a stop token unless replayed). hk, ht: nn entries. */
static sfi_status read_histories(sfi_gpu_engine *e, int B, int forced, size_t nn, int32_t *hk,
                                 int32_t *ht, sfi_gpu_run_result *res, sfi_error *err)
{
    const int max_new = e->o.max_new;
    CK(cudaMemcpy(hk, e->hist_kind, nn * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ht, e->hist_tok, nn * 4, cudaMemcpyDeviceToHost));
    for (int b = 0; b < B; b++) {
        int n = 0;
        for (int t = 0; t < max_new; t++) {
            int32_t tok = ht[(size_t)t * B + b];
            int kind = hk[(size_t)t * B + b] & 15, why = hk[(size_t)t * B + b] >> 4;
            res->ids[(size_t)b * max_new + t] = tok;
            res->kinds[(size_t)b * max_new + t] = (uint8_t)kind;
            res->reasons[(size_t)b * max_new + t] = (uint8_t)why;
            n = t + 1;
            if (kind == SFI_STEP_SLOW)
                res->n_slow[b]++;
            int stop = e->o.stop_token >= 0 && tok == e->o.stop_token;
            for (int i = 0; i < e->o.n_stop_more && i < 16; i++)
                stop = stop || tok == e->o.stop_more[i];
            if (!forced && stop)
                break;
        }
        res->n_generated[b] = n;
    }
    return SFI_OK;
}
#undef RUN_TRY

sfi_status sfi_gpu_engine_run(sfi_gpu_engine *e, const sfi_gpu_request *rq, int B,
                              const sfi_gpu_observer *obs, int time_steps, sfi_gpu_run_result *res,
                              sfi_error *err)
{
    memset(res, 0, sizeof *res);
    const int max_new = e->o.max_new;
    int forced = 0;
    sfi_status rc = check_requests(e, rq, B, &forced, err);
    if (rc)
        return rc;
    res->batch = B;
    res->max_new = max_new;
    size_t nn = (size_t)B * max_new;
    res->ids = calloc(nn, sizeof(int32_t));
    res->kinds = calloc(nn, 1);
    res->reasons = calloc(nn, 1);
    res->n_generated = calloc((size_t)B, sizeof(int));
    res->n_slow = calloc((size_t)B, sizeof(int));
    res->step_ms = calloc((size_t)max_new, sizeof(float));
    int32_t *hk = malloc(nn * 4), *ht = malloc(nn * 4);
    float *lg = obs ? malloc((size_t)B * e->V * 4) : NULL;
    int32_t *selbuf = obs ? malloc((size_t)e->nkv_g * e->o.params.K * 4) : NULL;
    cudaEvent_t *ev = time_steps ? calloc((size_t)max_new, sizeof(cudaEvent_t)) : NULL;
    if (!res->ids || !res->kinds || !res->reasons || !res->n_generated || !res->n_slow ||
        !res->step_ms || !hk || !ht || (obs && (!lg || !selbuf)) || (time_steps && !ev)) {
        rc = sfi_error_set(err, SFI_ENOMEM, "out of memory");
        goto out;
    }
#define RTRY(x)                                                                                    \
    do {                                                                                           \
        if ((rc = (x)))                                                                            \
            goto out;                                                                              \
    } while (0)
#define RCK(x) RTRY(SFI_GPU_STATUS(err, x, #x))
    RTRY(setup_run(e, rq, B, forced, nn, err));
    RCK(cudaMemset(e->hist_kind, 0, nn * 4));
    RCK(cudaMemset(e->hist_tok, 0, nn * 4));
    /* prefill, request by request (step 0) */
    double t0 = sfi_clock_wall();
    for (int b = 0; b < B; b++)
        RTRY(prefill(e, b, rq[b].prompt, rq[b].n_prompt, err));
    res->prefill_s = sfi_clock_wall() - t0;
    RTRY(first_step(e, obs, B, hk, ht, lg, selbuf, err));
    /* decode steps 1.. */
    double tb = sfi_clock_wall();
    if (max_new > 1)
        RTRY(decode_steps(e, obs, B, time_steps, ev, hk, ht, lg, selbuf, res, err));
    RCK(cudaStreamSynchronize(e->main_st));
    res->decode_s = sfi_clock_wall() - tb;
    if (time_steps && max_new > 1) {
        for (int t = 1; t < max_new; t++)
            RCK(cudaEventElapsedTime(&res->step_ms[t], ev[t - 1], ev[t]));
        res->n_timed = max_new - 1;
    }
    RTRY(read_histories(e, B, forced, nn, hk, ht, res, err));
out:
    if (ev) {
        for (int t = 0; t < max_new; t++)
            if (ev[t])
                cudaEventDestroy(ev[t]);
        free(ev);
    }
    free(hk);
    free(ht);
    free(lg);
    free(selbuf);
    if (rc)
        sfi_gpu_run_result_free(res);
    return rc;
#undef RTRY
#undef RCK
}
