/* The decode loop of sfi(7) DECODE LOOP; see sfi_decode.h.
 *
 * Steps: the prefill runs the whole prompt densely (one token at a time;
 * each token's attention is sfi_qwen3_attn_dense) and its last position's
 * logits give x_0: that is decode step 0, slow (reason "first"), and in SFI
 * mode the Selector over the last W_prefill prompt queries initializes the
 * selected sets. Step t >= 1 feeds x_{t-1} at position n_prompt + t - 1;
 * its kind comes from the trigger policy (SFI mode) or is always slow
 * (dense mode). A slow step in SFI mode is dense in every layer and each
 * layer then refreshes its sets with the Selector over its last W_decode
 * queries (the current one included).
 *
 * Window logits: the Selector needs, per layer, the scaled logits of the
 * window queries over the cache. We keep the roped queries of the last
 * max(W_prefill, W_decode) positions per layer and recompute their logits
 * with the same dense-attention function and the same keys, so they are
 * the very bits attention used; positions past a query's own are -inf
 * (outside J, except when n_recent < W - 1: then (our choice) the window
 * keeps only the queries that see all of J).
 *
 * Deferred refresh (refresh_delay = d >= 2): a decode slow step's Selector
 * writes a pending copy of the sets instead of the state's; they are
 * installed at the start of step t + d (before its forward pass), and a
 * slow step before then overwrites (drops) them. The prefill's sets are
 * never deferred. The digest hashes sets when they are installed, so that
 * it matches a GPU engine which never computes dropped sets. */
#include <config.h>

#include "sfi_decode.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_attention.h"
#include "sfi_clock.h"
#include "sfi_digest.h"
#include "sfi_math.h"
#include "sfi_selector.h"

#define SFI_DECODE_MAX_KV_HEADS 1024

const char *sfi_decode_mode_name(sfi_decode_mode m)
{
    return m == SFI_DECODE_DENSE ? "dense" : "sfi";
}

sfi_status sfi_decode_mode_parse(const char *s, sfi_decode_mode *m, sfi_error *err)
{
    if (!strcmp(s, "sfi"))
        *m = SFI_DECODE_SFI;
    else if (!strcmp(s, "dense"))
        *m = SFI_DECODE_DENSE;
    else
        return sfi_error_set(err, SFI_EINVAL, "mode '%s': expected sfi or dense", s);
    return SFI_OK;
}

void sfi_decode_opts_default(sfi_decode_opts *o)
{
    memset(o, 0, sizeof *o);
    o->mode = SFI_DECODE_SFI;
    sfi_params_default(&o->params);
    o->trigger = SFI_TRIG_SFI;
    o->interval = 16;
    o->max_new = 16;
    o->stop_token = -1;
    o->backend = SFI_BACKEND_SCALAR;
}

void sfi_decode_result_free(sfi_decode_result *res)
{
    if (!res)
        return;
    free(res->ids);
    free(res->kinds);
    free(res->reasons);
    memset(res, 0, sizeof *res);
}

typedef struct {
    const sfi_qwen3 *m;
    const sfi_model_config *c;
    const sfi_decode_opts *o;
    const sfi_params *prm;
    const sfi_decode_observer *obs;
    sfi_kv_cache kv;
    sfi_state st;
    sfi_state pend; /* refresh_delay >= 2: pending sets (a view of scratch) */
    int pend_step;  /* the slow step whose sets are pending; -1: none */
    int sfi;        /* SFI mode */
    int Wq;         /* queries kept per layer */
    float *qhist;   /* [layer][Wq][nh*hd], ring by position % Wq */
    int step;       /* current decode step (-1: prefill) */
    int n_prompt;
    sfi_step_kind kind; /* of the current step */
    /* scratch */
    float *logits_l;   /* [nh][cap] dense logits of one query */
    float *att_tmp;    /* [nh*hd] */
    float *win;        /* [n_kv][Wmax*G][cap] selector input */
    float *knorm;      /* [n_kv][cap] */
    int32_t *sel;      /* [n_kv][K] */
    int32_t *fast_idx; /* [n_kv][n_sink + K + n_recent] */
    int *fast_n;       /* [n_kv] */
    float *lambda;     /* [n_kv] */
    float *mass;       /* [nh] */
    int64_t attended;  /* positions read by the current step's attention */
    sfi_hasher hs;
    sfi_error *err;
    void *scratch; /* one block: qhist and the scratch arrays above */
} dctx;

static size_t qdim(const dctx *d)
{
    return (size_t)d->c->num_attention_heads * d->c->head_dim;
}

static float *qslot(dctx *d, int layer, int pos)
{
    assert(layer >= 0 && layer < d->c->num_hidden_layers && pos >= 0);
    return d->qhist + ((size_t)layer * d->Wq + (size_t)(pos % d->Wq)) * qdim(d);
}

static int fast_cap(const dctx *d)
{
    return d->prm->n_sink + d->prm->K + d->prm->n_recent;
}

/* The fast set of every KV head of `layer` for a cache of n_ctx, over the
 * sets of st (the state's, or the pending ones). */
static void fast_sets(dctx *d, const sfi_state *st, int layer, int n_ctx)
{
    for (int h = 0; h < d->c->num_key_value_heads; h++) {
        sfi_state_fast_set(st, d->prm, layer, h, n_ctx, d->fast_idx + (size_t)h * fast_cap(d),
                           &d->fast_n[h]);
        assert(d->fast_n[h] >= 1 && d->fast_n[h] <= fast_cap(d));
    }
}

/* Dense probabilities of the query whose logits are in d->logits_l
 * (rows of n_ctx), in place. */
static void probs_in_place(dctx *d, int n_ctx)
{
    for (int h = 0; h < d->c->num_attention_heads; h++)
        sfi_softmax(d->logits_l + (size_t)h * n_ctx, (size_t)n_ctx);
}

/* The digest's record of layer's sets (in effect from now on). */
static void hash_sets(dctx *d, const sfi_state *st, int layer)
{
    const int nkv = d->c->num_key_value_heads, K = d->prm->K;
    const int32_t *base = st->selected + (size_t)layer * nkv * K;
    const int *n = st->n_selected + (size_t)layer * nkv;
    int32_t l32 = layer;
    sfi_hasher_update_str(&d->hs, "selected");
    sfi_hasher_update_i32(&d->hs, &l32, 1);
    for (int h = 0; h < nkv; h++) {
        sfi_hasher_update_i32(&d->hs, &n[h], 1);
        sfi_hasher_update_i32(&d->hs, base + (size_t)h * K, (size_t)n[h]);
    }
}

/* Runs the Selector of `layer` for a cache of n_ctx with the window of
 * queries at positions n_ctx-W .. n_ctx-1, stores the new sets in the
 * state (deferred: in the pending sets, hashed when installed), hashes
 * them and tells the observer. */
static sfi_status select_layer(dctx *d, int layer, int n_ctx, int W, int deferred)
{
    const sfi_model_config *c = d->c;
    int nh = c->num_attention_heads, nkv = c->num_key_value_heads, G = nh / nkv;
    int jb, je;
    sfi_state_candidates(d->prm, n_ctx, &jb, &je);
    int K = d->prm->K;
    const sfi_state *dst = deferred ? &d->pend : &d->st;
    int32_t *dst_base = dst->selected + (size_t)layer * nkv * K;
    int *dst_n = dst->n_selected + (size_t)layer * nkv;
    sfi_status rc = SFI_OK;
    if (je <= jb) {
        for (int h = 0; h < nkv; h++)
            dst_n[h] = 0;
        for (int h = 0; h < nkv; h++)
            d->lambda[h] = 0.0f;
    } else {
        /* the window: queries that see all of J */
        int first = n_ctx - W;
        if (first < je - 1)
            first = je - 1;
        int nw = n_ctx - first;
        assert(nw >= 1 && nw <= d->Wq); /* d->win holds Wq * G rows per KV head */
        for (int w = 0; w < nw; w++) {
            int pos = first + w;
            rc = sfi_qwen3_attn_dense(d->m, d->o->backend, layer, qslot(d, layer, pos), &d->kv,
                                      pos + 1, d->att_tmp, d->logits_l, d->err);
            if (rc)
                return rc;
            for (int h = 0; h < nh; h++) {
                int g = h / G, gi = h % G;
                float *row = d->win + ((size_t)g * nw * G + (size_t)w * G + gi) * n_ctx;
                memcpy(row, d->logits_l + (size_t)h * (pos + 1), (size_t)(pos + 1) * sizeof(float));
                for (int j = pos + 1; j < n_ctx; j++)
                    row[j] = -INFINITY;
            }
        }
        for (int h = 0; h < nkv; h++)
            memcpy(d->knorm + (size_t)h * n_ctx,
                   d->kv.key_norms + ((size_t)layer * nkv + h) * d->kv.capacity,
                   (size_t)n_ctx * sizeof(float));
        sfi_selector_input in = {.n_kv_heads = nkv,
                                 .n_win = nw * G,
                                 .n_pos = n_ctx,
                                 .j_begin = jb,
                                 .j_end = je,
                                 .logits = d->win,
                                 .key_norms = d->knorm};
        sfi_selector_detail det;
        memset(&det, 0, sizeof det);
        det.lambda = d->lambda;
        int n_sel = 0;
        rc = sfi_selector_run(d->prm, &in, d->sel, &n_sel, &det, d->err);
        if (rc)
            return sfi_error_prefix(d->err, "layer %d", layer);
        assert(n_sel >= 1 && n_sel <= K); /* the state's slots hold K */
        for (int h = 0; h < nkv; h++) {
            memcpy(dst_base + (size_t)h * K, d->sel + (size_t)h * n_sel,
                   (size_t)n_sel * sizeof(int32_t));
            dst_n[h] = n_sel;
        }
    }
    if (!deferred)
        hash_sets(d, &d->st, layer);
    if (d->obs && d->obs->on_slow_layer) {
        /* captured mass of the newest query over the new fast sets */
        int pos = n_ctx - 1;
        rc = sfi_qwen3_attn_dense(d->m, d->o->backend, layer, qslot(d, layer, pos), &d->kv, n_ctx,
                                  d->att_tmp, d->logits_l, d->err);
        if (rc)
            return rc;
        probs_in_place(d, n_ctx);
        fast_sets(d, dst, layer, n_ctx);
        for (int h = 0; h < nh; h++) {
            int g = h / G;
            const float *p = d->logits_l + (size_t)h * n_ctx;
            const int32_t *ix = d->fast_idx + (size_t)g * fast_cap(d);
            float s = 0.0f;
            for (int i = 0; i < d->fast_n[g]; i++)
                s += p[ix[i]];
            d->mass[h] = s;
        }
        sfi_decode_slow_layer_info info = {.step = d->step,
                                           .layer = layer,
                                           .n_ctx = n_ctx,
                                           .n_kv_heads = nkv,
                                           .K = K,
                                           .selected = dst_base,
                                           .n_selected = dst_n,
                                           .j_begin = jb,
                                           .j_end = je,
                                           .lambda = d->lambda,
                                           .captured_mass = d->mass,
                                           .n_heads = nh,
                                           .deferred = deferred};
        rc = d->obs->on_slow_layer(d->obs->user, &info, d->err);
    }
    return rc;
}

static sfi_status observe_attention(dctx *d, int layer, const float *q, int n_ctx)
{
    sfi_status rc = sfi_qwen3_attn_dense(d->m, d->o->backend, layer, q, &d->kv, n_ctx, d->att_tmp,
                                         d->logits_l, d->err);
    if (rc)
        return rc;
    probs_in_place(d, n_ctx);
    sfi_decode_attention_info info = {.step = d->step,
                                      .layer = layer,
                                      .kind = d->kind,
                                      .n_heads = d->c->num_attention_heads,
                                      .n_ctx = n_ctx,
                                      .probs = d->logits_l};
    return d->obs->on_attention(d->obs->user, &info, d->err);
}

/* The attend callback of sfi_qwen3_step: keeps the query, then dense or
 * sparse attention by the kind of the current step. */
static sfi_status attend(void *user, int layer, const float *q, const sfi_kv_cache *kv, int n_ctx,
                         float *out, sfi_error *err)
{
    dctx *d = user;
    memcpy(qslot(d, layer, n_ctx - 1), q, qdim(d) * sizeof(float));
    sfi_status rc;
    if (d->obs && d->obs->want_qk && d->obs->on_qk) {
        int step = d->step >= 0 ? d->step : n_ctx == d->n_prompt ? 0 : -1;
        sfi_decode_qk_info qi = {.step = step,
                                 .position = n_ctx - 1,
                                 .layer = layer,
                                 .n_ctx = n_ctx,
                                 .q = q,
                                 .k = sfi_kv_k(kv, layer),
                                 .v = sfi_kv_v(kv, layer)};
        if ((rc = d->obs->on_qk(d->obs->user, &qi, err)))
            return rc;
    }
    int nkv = d->c->num_key_value_heads;
    int all = 1; /* every set covers the cache: the dense path, same positions */
    if (d->kind == SFI_STEP_FAST) {
        fast_sets(d, &d->st, layer, n_ctx);
        for (int h = 0; h < nkv; h++) {
            d->attended += d->fast_n[h];
            all = all && d->fast_n[h] == n_ctx;
        }
    } else {
        d->attended += (int64_t)n_ctx * nkv;
    }
    if (!all) {
        const int32_t *ix[SFI_DECODE_MAX_KV_HEADS];
        for (int h = 0; h < nkv; h++)
            ix[h] = d->fast_idx + (size_t)h * fast_cap(d);
        rc = sfi_qwen3_attn_sparse(d->m, d->o->backend, layer, q, kv, n_ctx, ix, d->fast_n, out,
                                   err);
    } else {
        rc = sfi_qwen3_attn_dense(d->m, d->o->backend, layer, q, kv, n_ctx, out, NULL, err);
    }
    if (rc == SFI_OK && d->step >= 0 && d->obs && d->obs->want_attention && d->obs->on_attention)
        rc = observe_attention(d, layer, q, n_ctx);
    return rc;
}

static void dctx_free(dctx *d)
{
    sfi_kv_cache_free(&d->kv);
    if (d->sfi)
        sfi_state_free(&d->st);
    free(d->scratch);
    sfi_hasher_free(&d->hs);
}
static void hash_step(dctx *d, int step, sfi_step_kind kind, sfi_step_reason reason, int32_t tok,
                      const float *logits)
{
    int32_t v[4] = {step, (int32_t)kind, (int32_t)reason, tok};
    sfi_hasher_update_str(&d->hs, "step");
    sfi_hasher_update_i32(&d->hs, v, 4);
    sfi_hasher_update_f32(&d->hs, logits, (size_t)d->c->vocab_size);
}

/* Keeps the roped query of every position in a ring of n_queries slots
 * per layer, then dense attention: the prefix's prefill. */
typedef struct {
    const sfi_qwen3 *m;
    sfi_backend be;
    float *qhist;
    int n_queries;
    size_t qdim;
} prefix_ctx;

static sfi_status prefix_attend(void *user, int layer, const float *q, const sfi_kv_cache *kv,
                                int n_ctx, float *out, sfi_error *err)
{
    prefix_ctx *p = user;
    memcpy(p->qhist +
               ((size_t)layer * p->n_queries + (size_t)((n_ctx - 1) % p->n_queries)) * p->qdim,
           q, p->qdim * sizeof(float));
    return sfi_qwen3_attn_dense(p->m, p->be, layer, q, kv, n_ctx, out, NULL, err);
}

void sfi_decode_prefix_free(sfi_decode_prefix *p)
{
    if (!p)
        return;
    free(p->prompt);
    sfi_kv_cache_free(&p->kv);
    free(p->qhist);
    free(p->logits);
    memset(p, 0, sizeof *p);
}

static sfi_status check_prompt(const sfi_model_config *c, const int32_t *prompt, int n_prompt,
                               sfi_error *err)
{
    if (n_prompt < 1)
        return sfi_error_set(err, SFI_EINVAL, "prompt: empty (at least one token needed)");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab_size)
            return sfi_error_set(err, SFI_ERANGE,
                                 "prompt: token %d (id %d) outside the vocabulary [0, %d)", i,
                                 (int)prompt[i], c->vocab_size);
    return SFI_OK;
}

sfi_status sfi_decode_prefix_build(const sfi_qwen3 *m, sfi_backend be, const int32_t *prompt,
                                   int n_prompt, int capacity, int n_queries,
                                   sfi_decode_prefix *out, sfi_error *err)
{
    memset(out, 0, sizeof *out);
    const sfi_model_config *c = sfi_qwen3_config(m);
    sfi_status rc = check_prompt(c, prompt, n_prompt, err);
    if (rc)
        return rc;
    if (capacity < n_prompt || capacity > c->max_position_embeddings)
        return sfi_error_set(err, SFI_ERANGE,
                             "prefix: capacity %d must lie in [%d (the prompt), %d "
                             "(max_position_embeddings)]",
                             capacity, n_prompt, c->max_position_embeddings);
    if (n_queries < 1)
        return sfi_error_set(err, SFI_EINVAL, "prefix: n_queries %d < 1", n_queries);
    if (!sfi_backend_available(be))
        return sfi_error_set(err, SFI_EUNSUPPORTED, "backend %s is not built in",
                             sfi_backend_name(be));
    if (n_queries > n_prompt)
        n_queries = n_prompt;
    size_t qd = (size_t)c->num_attention_heads * c->head_dim;
    out->n_prompt = n_prompt;
    out->backend = be;
    out->n_queries = n_queries;
    out->prompt = malloc((size_t)n_prompt * sizeof(int32_t));
    out->qhist = malloc((size_t)c->num_hidden_layers * n_queries * qd * sizeof(float));
    out->logits = malloc((size_t)c->vocab_size * sizeof(float));
    if (!out->prompt || !out->qhist || !out->logits) {
        sfi_decode_prefix_free(out);
        return sfi_error_set(err, SFI_ENOMEM, "prefix: out of memory");
    }
    memcpy(out->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    if ((rc = sfi_kv_cache_init(&out->kv, c, capacity, err))) {
        sfi_decode_prefix_free(out);
        return rc;
    }
    prefix_ctx pc = {.m = m, .be = be, .qhist = out->qhist, .n_queries = n_queries, .qdim = qd};
    double t0 = sfi_clock_wall(), c0 = sfi_clock_cpu();
    /* the queries of all but the last n_queries positions are not kept:
     * no attend hook there, so the blas backend attends a block at once */
    int head = n_prompt - n_queries;
    rc =
        head > 0 ? sfi_qwen3_prefill(m, be, &out->kv, prompt, head, NULL, NULL, NULL, err) : SFI_OK;
    if (!rc)
        rc = sfi_qwen3_prefill(m, be, &out->kv, prompt + head, n_queries, prefix_attend, &pc,
                               out->logits, err);
    out->seconds = sfi_clock_wall() - t0;
    out->cpu_seconds = sfi_clock_cpu() - c0;
    if (rc)
        sfi_decode_prefix_free(out);
    return rc;
}

/* The request against the model: prompt, steps within the positions,
 * forced tokens, parameters, backend, KV heads. */
static sfi_status check_request(const sfi_model_config *c, const sfi_decode_opts *o,
                                const int32_t *prompt, int n_prompt, sfi_error *err)
{
    sfi_status rc = check_prompt(c, prompt, n_prompt, err);
    if (rc)
        return rc;
    if (o->max_new < 1)
        return sfi_error_set(err, SFI_EINVAL, "max-new %d: must be >= 1", o->max_new);
    if ((long)n_prompt + o->max_new > c->max_position_embeddings)
        return sfi_error_set(err, SFI_ERANGE,
                             "prompt of %d tokens + %d new tokens exceeds the model's "
                             "max_position_embeddings %d",
                             n_prompt, o->max_new, c->max_position_embeddings);
    if (o->forced) {
        if (o->n_forced < o->max_new - 1)
            return sfi_error_set(err, SFI_EINVAL,
                                 "teacher forcing: %d forced tokens for %d steps (need %d)",
                                 o->n_forced, o->max_new, o->max_new - 1);
        for (int i = 0; i < o->max_new - 1; i++)
            if (o->forced[i] < 0 || o->forced[i] >= c->vocab_size)
                return sfi_error_set(err, SFI_ERANGE,
                                     "teacher forcing: token %d (id %d) outside the "
                                     "vocabulary [0, %d)",
                                     i, (int)o->forced[i], c->vocab_size);
    }
    if ((rc = sfi_params_validate(&o->params, err)))
        return rc;
    if (!sfi_backend_available(o->backend))
        return sfi_error_set(err, SFI_EUNSUPPORTED, "backend %s is not built in",
                             sfi_backend_name(o->backend));
    if (c->num_key_value_heads > SFI_DECODE_MAX_KV_HEADS)
        return sfi_error_set(err, SFI_EUNSUPPORTED, "%d KV heads: sfi-ref handles up to %d",
                             c->num_key_value_heads, SFI_DECODE_MAX_KV_HEADS);
    return SFI_OK;
}

/* The scratch arrays of a run of cap positions in one zeroed block, each
 * part 64-byte aligned: a size table, then one allocation (the Selector's
 * parts only in SFI mode). Returns 0, or -1 out of memory. */
static int scratch_alloc(dctx *d, int cap)
{
    const sfi_model_config *c = d->c;
    const size_t nh = (size_t)c->num_attention_heads, nkv = (size_t)c->num_key_value_heads;
    const size_t G = nh / nkv, W = (size_t)d->Wq, K = (size_t)d->prm->K, n = (size_t)cap;
    const int s = d->sfi, dl = d->sfi && d->prm->refresh_delay > 0;
    struct {
        void **p;
        size_t bytes;
    } part[] = {
        {(void **)&d->qhist, (size_t)c->num_hidden_layers * W * qdim(d) * sizeof(float)},
        {(void **)&d->logits_l, nh * n * sizeof(float)},
        {(void **)&d->att_tmp, qdim(d) * sizeof(float)},
        {(void **)&d->lambda, nkv * sizeof(float)},
        {(void **)&d->mass, nh * sizeof(float)},
        {(void **)&d->fast_n, nkv * sizeof(int)},
        {(void **)&d->win, s ? nkv * W * G * n * sizeof(float) : 0},
        {(void **)&d->knorm, s ? nkv * n * sizeof(float) : 0},
        {(void **)&d->sel, s ? nkv * K * sizeof(int32_t) : 0},
        {(void **)&d->fast_idx, s ? nkv * (size_t)fast_cap(d) * sizeof(int32_t) : 0},
        {(void **)&d->pend.selected,
         dl ? (size_t)c->num_hidden_layers * nkv * K * sizeof(int32_t) : 0},
        {(void **)&d->pend.n_selected, dl ? (size_t)c->num_hidden_layers * nkv * sizeof(int) : 0},
    };
    const size_t n_parts = sizeof part / sizeof part[0];
    size_t total = 0;
    for (size_t i = 0; i < n_parts; i++)
        total += (part[i].bytes + 63) / 64 * 64;
    char *block = d->scratch = calloc(1, total + 64);
    if (!block)
        return -1;
    block += (64 - (uintptr_t)block % 64) % 64;
    for (size_t i = 0; i < n_parts; i++) {
        *part[i].p = part[i].bytes ? block : NULL;
        block += (part[i].bytes + 63) / 64 * 64;
    }
    return 0;
}

/* The run's context: KV cache for cap positions, digest, managed state
 * (SFI mode) and scratch. On failure everything is released. */
static sfi_status dctx_init(dctx *d, const sfi_qwen3 *m, const sfi_decode_opts *o,
                            const sfi_decode_observer *obs, int n_prompt, sfi_error *err)
{
    memset(d, 0, sizeof *d);
    const sfi_model_config *c = sfi_qwen3_config(m);
    d->m = m;
    d->c = c;
    d->o = o;
    d->prm = &o->params;
    d->obs = obs;
    d->err = err;
    d->n_prompt = n_prompt;
    int Wmax = d->prm->W_prefill > d->prm->W_decode ? d->prm->W_prefill : d->prm->W_decode;
    d->Wq = Wmax < 1 ? 1 : Wmax;
    const int cap = n_prompt + o->max_new;
    sfi_status rc = sfi_kv_cache_init(&d->kv, c, cap, err);
    if (rc)
        return rc;
    if ((rc = sfi_hasher_init(&d->hs, err))) {
        sfi_kv_cache_free(&d->kv);
        return rc;
    }
    if (o->mode == SFI_DECODE_SFI &&
        (rc = sfi_state_init(&d->st, c->num_hidden_layers, c->num_key_value_heads, d->prm->K,
                             err))) {
        dctx_free(d);
        return rc;
    }
    d->sfi = o->mode == SFI_DECODE_SFI;
    if (scratch_alloc(d, cap)) {
        dctx_free(d);
        return sfi_error_set(err, SFI_ENOMEM, "decode: out of memory (context %d)", cap);
    }
    d->pend.n_layers = c->num_hidden_layers;
    d->pend.n_kv_heads = c->num_key_value_heads;
    d->pend.K = d->prm->K;
    d->pend_step = -1;
    return SFI_OK;
}

/* The prompt's forward pass (or the shared prefix's copied), the
 * Selector's first sets, the prefill observers; logits: the last
 * position's. Timed into res. */
static sfi_status prefill(dctx *d, const int32_t *prompt, int n_prompt,
                          const sfi_decode_prefix *pre, float *logits, sfi_decode_result *res)
{
    const sfi_model_config *c = d->c;
    const sfi_decode_observer *obs = d->obs;
    sfi_error *err = d->err;
    sfi_status rc;
    const int need_q = d->Wq < n_prompt ? d->Wq : n_prompt;
    double t0 = sfi_clock_wall(), c0 = sfi_clock_cpu();
    d->step = -1;
    d->kind = SFI_STEP_PREFILL;
    if (pre) {
        if ((rc = sfi_kv_cache_copy(&d->kv, &pre->kv, err)))
            return rc;
        for (int l = 0; l < c->num_hidden_layers; l++)
            for (int pos = n_prompt - need_q; pos < n_prompt; pos++)
                memcpy(qslot(d, l, pos),
                       pre->qhist +
                           ((size_t)l * pre->n_queries + (size_t)(pos % pre->n_queries)) * qdim(d),
                       qdim(d) * sizeof(float));
        memcpy(logits, pre->logits, (size_t)c->vocab_size * sizeof(float));
    } else if ((rc = sfi_qwen3_prefill(d->m, d->o->backend, &d->kv, prompt, n_prompt, attend, d,
                                       logits, err))) {
        return rc;
    }
    if (d->sfi) {
        int W = d->prm->W_prefill < n_prompt ? d->prm->W_prefill : n_prompt;
        for (int l = 0; l < c->num_hidden_layers; l++)
            if ((rc = select_layer(d, l, n_prompt, W, 0)))
                return rc;
    }
    if (obs && obs->on_prefill) {
        sfi_decode_prefill_info pi = {.prompt = prompt,
                                      .n_prompt = n_prompt,
                                      .n_layers = c->num_hidden_layers,
                                      .n_heads = c->num_attention_heads,
                                      .n_kv_heads = c->num_key_value_heads,
                                      .head_dim = c->head_dim,
                                      .state = d->sfi ? &d->st : NULL,
                                      .last_logits = logits,
                                      .vocab_size = c->vocab_size};
        if ((rc = obs->on_prefill(obs->user, &pi, err)))
            return rc;
    }
    /* Step 0's forward pass is the prefill's last position: its dense
     * attention goes to observers like every later step's (n_ctx = the
     * prompt), so a full-level trace has every step. */
    if (obs && obs->want_attention && obs->on_attention) {
        d->step = 0;
        d->kind = SFI_STEP_SLOW;
        for (int l = 0; l < c->num_hidden_layers; l++)
            if ((rc = observe_attention(d, l, qslot(d, l, n_prompt - 1), n_prompt)))
                return rc;
    }
    double t1 = sfi_clock_wall(), c1 = sfi_clock_cpu();
    res->prefill_seconds = pre ? pre->seconds + (t1 - t0) : t1 - t0;
    res->prefill_cpu_seconds = pre ? pre->cpu_seconds + (c1 - c0) : c1 - c0;
    return SFI_OK;
}

/* Decode step t on the input token prev: the forward pass (step 0's was
 * the prefill), the Selector on a slow step, the argmax into res, the
 * digest, the step observer. */
static sfi_status decode_step(dctx *d, int t, sfi_step_kind kind, sfi_step_reason reason,
                              int32_t prev, float *logits, sfi_decode_result *res)
{
    const sfi_model_config *c = d->c;
    const int nkv = c->num_key_value_heads;
    sfi_status rc;
    d->step = t;
    d->kind = kind;
    d->attended = (int64_t)d->kv.n * nkv * c->num_hidden_layers;
    const int delay = d->sfi ? d->prm->refresh_delay : 0;
    if (d->pend_step >= 0 && t == d->pend_step + delay) {
        /* the deferred sets of step t - delay take effect */
        const size_t n = (size_t)c->num_hidden_layers * nkv;
        memcpy(d->st.selected, d->pend.selected, n * d->prm->K * sizeof(int32_t));
        memcpy(d->st.n_selected, d->pend.n_selected, n * sizeof(int));
        for (int l = 0; l < c->num_hidden_layers; l++)
            hash_sets(d, &d->st, l);
        d->pend_step = -1;
    }
    if (t > 0) {
        d->attended = 0;
        if ((rc = sfi_qwen3_step(d->m, d->o->backend, &d->kv, prev, attend, d, logits, d->err)))
            return rc;
        if (d->sfi && kind == SFI_STEP_SLOW) {
            /* deferred: a pending set of an earlier slow step is dropped */
            for (int l = 0; l < c->num_hidden_layers; l++)
                if ((rc = select_layer(d, l, d->kv.n, d->prm->W_decode, delay > 0)))
                    return rc;
            d->pend_step = delay > 0 ? t : -1;
        }
    }
    int32_t tok = sfi_argmax(logits, c->vocab_size);
    res->ids[t] = tok;
    res->kinds[t] = kind;
    res->reasons[t] = reason;
    res->n_generated = t + 1;
    if (kind == SFI_STEP_SLOW)
        res->n_slow++;
    hash_step(d, t, kind, reason, tok, logits);
    if (d->obs && d->obs->on_step) {
        sfi_decode_step_info si = {.step = t,
                                   .kind = kind,
                                   .reason = reason,
                                   .input_token = prev,
                                   .position = d->kv.n - 1,
                                   .n_ctx = d->kv.n,
                                   .token = tok,
                                   .logits = logits,
                                   .vocab_size = c->vocab_size,
                                   .attended = d->attended};
        if ((rc = d->obs->on_step(d->obs->user, &si, d->err)))
            return rc;
    }
    return SFI_OK;
}

/* Generated token tok stops the run (one of the stop tokens). */
static int is_stop(const sfi_decode_opts *o, int32_t tok)
{
    int stop = tok == o->stop_token;
    for (int i = 0; !stop && o->stop_tokens && i < o->n_stop_tokens; i++)
        stop = tok == o->stop_tokens[i];
    return stop;
}

/* The decode loop: the trigger policy decides each step's kind; the
 * input of step t + 1 is step t's token (or the forced one). */
static sfi_status decode_steps(dctx *d, const int32_t *prompt, int n_prompt, float *logits,
                               sfi_decode_result *res)
{
    const sfi_decode_opts *o = d->o;
    sfi_trigger_policy tp;
    sfi_trigger_policy_init(&tp, d->sfi ? o->trigger : SFI_TRIG_ALWAYS, d->prm, o->is_trigger,
                            o->n_trigger_vocab, o->interval);
    int32_t prev = prompt[n_prompt - 1];
    for (int t = 0; t < o->max_new; t++) {
        sfi_step_reason reason;
        sfi_step_kind kind = sfi_trigger_next(&tp, prev, &reason);
        sfi_status rc = decode_step(d, t, kind, reason, prev, logits, res);
        if (rc)
            return rc;
        int32_t tok = res->ids[t];
        prev = o->forced && t + 1 < o->max_new ? o->forced[t] : tok;
        if (is_stop(o, tok))
            break;
    }
    return SFI_OK;
}

/* The last keys and values of every layer, to the qk observer. */
static sfi_status observe_final_kv(dctx *d, const sfi_decode_result *res)
{
    const sfi_decode_observer *obs = d->obs;
    if (!obs || !obs->want_qk || !obs->on_qk)
        return SFI_OK;
    for (int l = 0; l < d->c->num_hidden_layers; l++) {
        sfi_decode_qk_info qi = {.step = res->n_generated - 1,
                                 .position = d->kv.n - 1,
                                 .layer = l,
                                 .n_ctx = d->kv.n,
                                 .final = 1,
                                 .k = sfi_kv_k(&d->kv, l),
                                 .v = sfi_kv_v(&d->kv, l)};
        sfi_status rc = obs->on_qk(obs->user, &qi, d->err);
        if (rc)
            return rc;
    }
    return SFI_OK;
}

/* check, set up, prefill, decode, digest. */
static sfi_status run(const sfi_qwen3 *m, const sfi_decode_opts *o, const int32_t *prompt,
                      int n_prompt, const sfi_decode_prefix *pre, const sfi_decode_observer *obs,
                      sfi_decode_result *res, sfi_error *err)
{
    memset(res, 0, sizeof *res);
    const sfi_model_config *c = sfi_qwen3_config(m);
    sfi_status rc = check_request(c, o, prompt, n_prompt, err);
    if (rc)
        return rc;
    const int Wmax =
        o->params.W_prefill > o->params.W_decode ? o->params.W_prefill : o->params.W_decode;
    const int need_q = Wmax < n_prompt ? (Wmax < 1 ? 1 : Wmax) : n_prompt;
    if (pre && pre->n_queries < need_q)
        return sfi_error_set(err, SFI_EINVAL,
                             "prefix keeps %d queries per layer; the Selector's window needs %d",
                             pre->n_queries, need_q);
    dctx d;
    if ((rc = dctx_init(&d, m, o, obs, n_prompt, err)))
        return rc;
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    res->ids = malloc((size_t)o->max_new * sizeof(int32_t));
    res->kinds = malloc((size_t)o->max_new * sizeof(sfi_step_kind));
    res->reasons = malloc((size_t)o->max_new * sizeof(sfi_step_reason));
    if (!logits || !res->ids || !res->kinds || !res->reasons) {
        rc = sfi_error_set(err, SFI_ENOMEM, "decode: out of memory (context %d)",
                           n_prompt + o->max_new);
        goto fail;
    }
    sfi_hasher_update_str(&d.hs, "sfi-decode-v1");
    sfi_hasher_update_str(&d.hs, sfi_decode_mode_name(o->mode));
    sfi_hasher_update_i32(&d.hs, prompt, (size_t)n_prompt);
    if ((rc = prefill(&d, prompt, n_prompt, pre, logits, res)))
        goto fail;
    double t1 = sfi_clock_wall(), c1 = sfi_clock_cpu();
    if ((rc = decode_steps(&d, prompt, n_prompt, logits, res)) || (rc = observe_final_kv(&d, res)))
        goto fail;
    res->decode_seconds = sfi_clock_wall() - t1;
    res->decode_cpu_seconds = sfi_clock_cpu() - c1;
    res->slow_fraction = (double)res->n_slow / res->n_generated;
    if ((rc = sfi_hasher_final_hex(&d.hs, res->digest_hex, res->digest, err)))
        goto fail;
    free(logits);
    dctx_free(&d);
    return SFI_OK;
fail:
    free(logits);
    dctx_free(&d);
    sfi_decode_result_free(res);
    return rc;
}

sfi_status sfi_decode_run(const sfi_qwen3 *m, const sfi_decode_opts *o, const int32_t *prompt,
                          int n_prompt, const sfi_decode_observer *obs, sfi_decode_result *res,
                          sfi_error *err)
{
    return run(m, o, prompt, n_prompt, NULL, obs, res, err);
}

sfi_status sfi_decode_run_prefix(const sfi_qwen3 *m, const sfi_decode_opts *o,
                                 const sfi_decode_prefix *pre, const sfi_decode_observer *obs,
                                 sfi_decode_result *res, sfi_error *err)
{
    memset(res, 0, sizeof *res);
    if (!pre || !pre->prompt || pre->kv.n != pre->n_prompt)
        return sfi_error_set(err, SFI_EINVAL, "decode: no prefilled prefix");
    return run(m, o, pre->prompt, pre->n_prompt, pre, obs, res, err);
}
