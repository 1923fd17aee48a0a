/* The analyzer's engine (see sfi_analyze.h). Per layer and step it asks
 * each policy for its sets and measures them against the step's attention:
 * exact where the step has q/K snapshots, else the recorded top-M (work per
 * (step, head, policy) O(M log M + B) then, so a 32K context costs no more
 * than a short one except in the policies that say otherwise). */
#include <config.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_analyze.h"
#include "sfi_attention.h"

void sfi_analyze_opts_default(sfi_analyze_opts *o)
{
    memset(o, 0, sizeof *o);
    o->policies = SFI_POLICY_ALL;
    sfi_policy_config_default(&o->cfg);
    o->budget.ratio = 0.06;
    o->n_threads = 2;
    o->kascade_calib_steps = 16;
    o->keep_jaccard = 1;
}

void sfi_analyze_result_free(sfi_analyze_result *r)
{
    if (!r)
        return;
    free(r->layer_recall);
    free(r->layer_n);
    free(r->jw_sum);
    free(r->ja_sum);
    free(r->jw_n);
    free(r->ja_n);
    if (r->jw)
        for (int l = 0; l < r->n_layers; l++)
            free(r->jw[l]);
    if (r->ja)
        for (int l = 0; l < r->n_layers; l++)
            free(r->ja[l]);
    free(r->jw);
    free(r->ja);
    memset(r, 0, sizeof *r);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

double sfi_analyze_quantile(float *v, long n, double q)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    double x = q * (double)(n - 1);
    long i = (long)x;
    if (i >= n - 1)
        return v[n - 1];
    double f = x - (double)i;
    return v[i] * (1.0 - f) + v[i + 1] * f;
}

/* Everything one worker needs; per layer results go to shared slots that
 * only the layer's worker writes. */
typedef struct {
    const sfi_analyze_source *src;
    const sfi_analyze_opts *opt;
    sfi_analyze_result *res;
    sfi_analyze_policy *lpol;     /* [n_layers][N_KINDS] per layer partials */
    double *lstat;                /* [n_layers][3] budget, ctx, steps */
    const sfi_policy_calib *calib;
    pthread_mutex_t mu;
    int next_layer;
    int failed;
    sfi_error err;
} shared;

/* Other layers' records and snapshots of the current step, on demand
 * (Kascade's reuse layers). */
typedef struct {
    const sfi_analyze_source *src;
    int step;
    int *stamp;                   /* [L*H] step the slot holds, -1 */
    sfi_policy_obs *obs;          /* [L*H] */
    int32_t *pos;                 /* [L*H][max_top] */
    float *prob;
    int failed;
    sfi_error err;
} lo_cache;

static const sfi_policy_obs *lo_get(void *ctx, int layer, int kvh)
{
    lo_cache *c = ctx;
    const sfi_analyze_source *s = c->src;
    if (layer < 0 || layer >= s->n_layers || kvh < 0 || kvh >= s->n_kv_heads)
        return NULL;
    size_t i = (size_t)layer * s->n_kv_heads + kvh;
    if (c->stamp[i] != c->step) {
        if (s->get(s->ctx, c->step, layer, kvh, &c->obs[i], c->pos + i * s->max_top,
                   c->prob + i * s->max_top, &c->err)) {
            c->failed = 1;
            return NULL;
        }
        c->stamp[i] = c->step;
    }
    return &c->obs[i];
}

static int lo_qk(void *ctx, int layer, const float **q, const float **k)
{
    lo_cache *c = ctx;
    const sfi_analyze_source *s = c->src;
    const float *v;
    if (!s->snapshot || layer < 0 || layer >= s->n_layers)
        return 0;
    return s->snapshot(s->ctx, c->step, layer, q, k, &v);
}

static int check_obs(const sfi_analyze_source *s, const sfi_policy_obs *o, int step, int layer,
                     int kvh, int n_ctx, sfi_error *err)
{
    if (o->n_ctx != n_ctx || o->n_top < 0 || o->n_top > s->max_top || !(o->tail >= 0.0f)) {
        sfi_error_set(err, SFI_EFORMAT, "step %d layer %d head %d: inconsistent attention "
                      "record (context %d vs %d, %d entries, tail %g)", step, layer, kvh,
                      o->n_ctx, n_ctx, o->n_top, (double)o->tail);
        return -1;
    }
    for (int i = 0; i < o->n_top; i++)
        if (o->pos[i] < 0 || o->pos[i] >= n_ctx || !(o->prob[i] >= 0.0f)) {
            sfi_error_set(err, SFI_EFORMAT, "step %d layer %d head %d: entry %d (position %d, "
                          "probability %g) outside the context of %d", step, layer, kvh, i,
                          (int)o->pos[i], (double)o->prob[i], n_ctx);
            return -1;
        }
    return 0;
}

/* The step's exact dense attention per KV head from q and K: per query
 * head the softmax over all positions, the mean over the group
 * (dense[h][n_ctx]); and each head's positions by that attention,
 * descending, ties to the smaller position (rank[h][n_ctx]). */
static int cmp_rank(const void *a, const void *b)
{
    const double *x = a, *y = b;  /* (score, position) pairs */
    if (x[0] > y[0]) return -1;
    if (x[0] < y[0]) return 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

static int exact_attention(const sfi_analyze_source *s, const float *q, const float *k,
                           int n_ctx, double *dense, int32_t *rank, double *pr, sfi_error *err)
{
    int H = s->n_kv_heads, G = s->n_heads / s->n_kv_heads, d = s->head_dim;
    double scale = 1.0 / sqrt((double)d);
    (void)err;
    for (int h = 0; h < H; h++) {
        double *p = dense + (size_t)h * n_ctx;
        for (int j = 0; j < n_ctx; j++)
            p[j] = 0.0;
        for (int g = 0; g < G; g++) {
            const float *qh = q + (size_t)(h * G + g) * d;
            double mx = -INFINITY, z = 0.0;
            for (int j = 0; j < n_ctx; j++) {
                const float *kj = k + ((size_t)j * H + h) * d;
                double l = 0.0;
                for (int x = 0; x < d; x++)
                    l += (double)qh[x] * kj[x];
                pr[2 * j] = l * scale;
                if (pr[2 * j] > mx)
                    mx = pr[2 * j];
            }
            for (int j = 0; j < n_ctx; j++)
                z += (pr[2 * j] = exp(pr[2 * j] - mx));
            for (int j = 0; j < n_ctx; j++)
                p[j] += pr[2 * j] / z / G;
        }
        for (int j = 0; j < n_ctx; j++)
            pr[2 * j] = p[j], pr[2 * j + 1] = j;
        qsort(pr, (size_t)n_ctx, 2 * sizeof(double), cmp_rank);
        for (int j = 0; j < n_ctx; j++)
            rank[(size_t)h * n_ctx + j] = (int32_t)pr[2 * j + 1];
    }
    return 0;
}

/* Relative output error of one policy's sets against dense attention for
 * one layer-step (sets from q/K name all their members). */
static int output_error(const sfi_analyze_source *s, const float *q, const float *k,
                        const float *v, int n_ctx, const sfi_policy_set *sets, int32_t **idx,
                        int *n_idx, float *o_dense, float *o_set, double *out, sfi_error *err)
{
    sfi_attn_shape sh = {s->n_heads, s->n_kv_heads, s->head_dim};
    int H = s->n_kv_heads, d = s->head_dim;
    for (int h = 0; h < H; h++) {
        sfi_policy_set_indices(&sets[h], idx[h], &n_idx[h]);
        if (n_idx[h] == 0)
            idx[h][n_idx[h]++] = n_ctx - 1;  /* an empty set attends to itself */
    }
    if (sfi_attn_sparse_decode(&sh, q, k, v, n_ctx, (const int32_t *const *)idx, n_idx, o_set,
                               err))
        return -1;
    double num = 0.0, den = 0.0;
    for (int i = 0; i < s->n_heads * d; i++) {
        double e = (double)o_set[i] - o_dense[i];
        num += e * e;
        den += (double)o_dense[i] * o_dense[i];
    }
    *out = den > 0.0 ? sqrt(num / den) : sqrt(num);
    return 0;
}

/* A layer's per-run buffers. */
typedef struct {
    int H, M, GQ;
    sfi_policy *pol[SFI_POLICY_N_KINDS];
    sfi_policy_set *sets;         /* [N_KINDS][H] */
    sfi_policy_obs *obs, *qobs;
    int32_t *pos, *qpos, *prev;
    float *prob, *qprob;
    int *n_prev, *stampv, stamp_id;
    lo_cache lc;
    /* exact measurement and output error */
    double *dense, *pr;
    int32_t *rank;
    int32_t **idx;
    int *n_idx;
    float *o_dense, *o_set, *dlog;
    uint8_t *mark;
} layer_bufs;

static void bufs_free(layer_bufs *b)
{
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++)
        sfi_policy_free(b->pol[k]);
    free(b->sets);
    free(b->obs);
    free(b->qobs);
    free(b->pos);
    free(b->qpos);
    free(b->prev);
    free(b->prob);
    free(b->qprob);
    free(b->n_prev);
    free(b->stampv);
    free(b->lc.stamp);
    free(b->lc.obs);
    free(b->lc.pos);
    free(b->lc.prob);
    free(b->dense);
    free(b->pr);
    free(b->rank);
    if (b->idx)
        for (int h = 0; h < b->H; h++)
            free(b->idx[h]);
    free(b->idx);
    free(b->n_idx);
    free(b->o_dense);
    free(b->o_set);
    free(b->dlog);
    free(b->mark);
}

static int bufs_init(shared *sh, layer_bufs *b, sfi_error *err)
{
    const sfi_analyze_source *src = sh->src;
    const sfi_analyze_opts *opt = sh->opt;
    int H = src->n_kv_heads, M = src->max_top, L = src->n_layers;
    size_t N = (size_t)src->max_ctx + 1;
    memset(b, 0, sizeof *b);
    b->H = H;
    b->M = M;
    b->GQ = (opt->policies & ((1u << SFI_POLICY_SFI) | (1u << SFI_POLICY_TMAX) |
                              (1u << SFI_POLICY_INTERVAL) | (1u << SFI_POLICY_BOUNDARY))) &&
                    src->get_q && src->q_per_kv > 0 && src->max_top_q > 0
                ? src->q_per_kv : 0;
    b->sets = malloc(sizeof(sfi_policy_set) * (size_t)H * SFI_POLICY_N_KINDS);
    b->obs = malloc(sizeof(sfi_policy_obs) * (size_t)H);
    b->pos = malloc(sizeof(int32_t) * (size_t)H * M);
    b->prob = malloc(sizeof(float) * (size_t)H * M);
    b->prev = malloc(sizeof(int32_t) * (size_t)H * M);
    b->n_prev = calloc((size_t)H, sizeof(int));
    b->stampv = malloc(sizeof(int) * N);
    int ok = b->sets && b->obs && b->pos && b->prob && b->prev && b->n_prev && b->stampv;
    if (ok)
        for (size_t i = 0; i < N; i++)
            b->stampv[i] = -1;
    if (ok && b->GQ) {
        size_t nq = (size_t)H * b->GQ;
        b->qobs = malloc(sizeof(sfi_policy_obs) * nq);
        b->qpos = malloc(sizeof(int32_t) * nq * src->max_top_q);
        b->qprob = malloc(sizeof(float) * nq * src->max_top_q);
        ok = b->qobs && b->qpos && b->qprob;
    }
    if (ok && ((opt->policies >> SFI_POLICY_KASCADE) & 1)) {
        size_t LH = (size_t)L * H;
        b->lc.src = src;
        b->lc.stamp = malloc(sizeof(int) * LH);
        b->lc.obs = malloc(sizeof(sfi_policy_obs) * LH);
        b->lc.pos = malloc(sizeof(int32_t) * LH * M);
        b->lc.prob = malloc(sizeof(float) * LH * M);
        ok = b->lc.stamp && b->lc.obs && b->lc.pos && b->lc.prob;
        for (size_t i = 0; ok && i < LH; i++)
            b->lc.stamp[i] = -1;
    }
    if (ok && src->snapshot && src->head_dim > 0) {
        b->dense = malloc(sizeof(double) * (size_t)H * N);
        b->pr = malloc(sizeof(double) * 2 * N);
        b->rank = malloc(sizeof(int32_t) * (size_t)H * N);
        b->idx = calloc((size_t)H, sizeof *b->idx);
        b->n_idx = calloc((size_t)H, sizeof *b->n_idx);
        b->o_dense = malloc(sizeof(float) * (size_t)src->n_heads * src->head_dim);
        b->o_set = malloc(sizeof(float) * (size_t)src->n_heads * src->head_dim);
        b->dlog = malloc(sizeof(float) * (size_t)src->n_heads * N);
        b->mark = malloc(N);
        ok = b->dense && b->pr && b->rank && b->idx && b->n_idx && b->o_dense && b->o_set &&
             b->dlog && b->mark;
        for (int h = 0; ok && h < H; h++)
            ok = (b->idx[h] = malloc(sizeof(int32_t) * N)) != NULL;
    }
    if (!ok)
        return sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory"), -1;
    sfi_policy_shape shape = {src->n_layers, src->n_heads > 0 ? src->n_heads : H, H,
                              src->head_dim};
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++)
        if (((opt->policies >> k) & 1) &&
            sfi_policy_create((sfi_policy_kind)k, &opt->cfg, &shape, src->max_ctx, sh->calib,
                              &b->pol[k], err))
            return -1;
    return 0;
}

/* Support stability: Jaccard of the top sets of consecutive steps. */
static void stability(shared *sh, layer_bufs *b, int layer, int first, int prev_trig, int B)
{
    const sfi_analyze_opts *opt = sh->opt;
    sfi_analyze_result *res = sh->res;
    for (int h = 0; h < b->H; h++) {
        const sfi_policy_obs *o = &b->obs[h];
        int K = opt->stab_k > 0 ? opt->stab_k : B;
        if (K > o->n_top)
            K = o->n_top;
        if (!first && b->n_prev[h] > 0 && K > 0) {
            b->stamp_id++;
            for (int i = 0; i < b->n_prev[h]; i++)
                b->stampv[b->prev[(size_t)h * b->M + i]] = b->stamp_id;
            int inter = 0;
            for (int i = 0; i < K; i++)
                inter += b->stampv[o->pos[i]] == b->stamp_id;
            float jac = (float)inter / (float)(K + b->n_prev[h] - inter);
            if (prev_trig) {
                res->ja_sum[layer] += jac;
                if (res->ja)
                    res->ja[layer][res->ja_n[layer]] = jac;
                res->ja_n[layer]++;
            } else {
                res->jw_sum[layer] += jac;
                if (res->jw)
                    res->jw[layer][res->jw_n[layer]] = jac;
                res->jw_n[layer]++;
            }
        }
        memcpy(b->prev + (size_t)h * b->M, o->pos, sizeof(int32_t) * (size_t)K);
        b->n_prev[h] = K;
    }
}

/* SFI's slow-step bookkeeping of one step. */
typedef struct {
    int prev_slow, since, prev_fast_pending;
    double prev_recall;
} sfi_track;

static void track_sfi(sfi_analyze_policy *P, sfi_track *tr, int slow, int first, int prev_trig,
                      double rmean)
{
    P->n_steps += 1;
    P->n_slow += slow;
    if (slow) {
        tr->since = 0;
        if (prev_trig && !first && !tr->prev_slow) {
            P->before_n += 1;
            P->before_recall += tr->prev_recall;
            tr->prev_fast_pending = 1;
        } else {
            tr->prev_fast_pending = 0;
        }
    } else {
        tr->since++;
        P->fast_n += 1;
        P->fast_recall += rmean;
        if (tr->prev_fast_pending) {
            P->after_n += 1;
            P->after_recall += rmean;
        }
        tr->prev_fast_pending = 0;
        int si = tr->since < SFI_ANALYZE_SINCE_MAX ? tr->since : SFI_ANALYZE_SINCE_MAX;
        P->since_n[si] += 1;
        P->since_recall[si] += rmean;
    }
    tr->prev_slow = slow;
    tr->prev_recall = rmean;
}

/* Measures one policy's sets at one layer-step. */
static int measure(shared *sh, layer_bufs *b, int k, int layer, int t, int B, int n_ctx,
                   const float *q, const float *kk, const float *vv, int exact, double *rmean,
                   sfi_error *err)
{
    const sfi_analyze_source *src = sh->src;
    sfi_analyze_policy *P = &sh->lpol[(size_t)layer * SFI_POLICY_N_KINDS + k];
    const sfi_policy_set *ks = &b->sets[(size_t)k * b->H];
    double rsum = 0.0;
    int Kt = B < n_ctx ? B : n_ctx;
    for (int h = 0; h < b->H; h++) {
        double rc, lo, ov;
        if (exact) {
            const double *p = b->dense + (size_t)h * n_ctx;
            const int32_t *rk = b->rank + (size_t)h * n_ctx;
            rc = 0.0;
            int in_top = 0;
            for (int32_t j = 0; j < n_ctx; j++)
                if (sfi_policy_set_contains(&ks[h], j))
                    rc += p[j];
            for (int i = 0; i < Kt; i++)
                in_top += sfi_policy_set_contains(&ks[h], rk[i]);
            lo = rc;
            ov = Kt > 0 ? (double)in_top / Kt : 1.0;
            P->exact += 1;
        } else {
            int n_in, n_in_top, Ko = B < b->obs[h].n_top ? B : b->obs[h].n_top;
            rc = sfi_policy_set_recall(&ks[h], &b->obs[h], Ko, &lo, &n_in, &n_in_top);
            ov = Ko > 0 ? (double)n_in_top / Ko : 1.0;
        }
        if (rc > 1.0)
            rc = 1.0;
        P->n += 1;
        P->recall += rc;
        P->recall_lo += lo;
        P->overlap += ov;
        P->ratio += (double)ks[h].size / n_ctx;
        if (k == SFI_POLICY_LFPS)
            P->cand += (double)sfi_policy_lfps_candidates(b->pol[k], layer, h) / n_ctx;
        rsum += rc;
    }
    *rmean = rsum / b->H;
    if (exact && vv) {
        double e;
        if (output_error(src, q, kk, vv, n_ctx, ks, b->idx, b->n_idx, b->o_dense, b->o_set, &e,
                         err))
            return -1;
        P->n_err += 1;
        P->out_err += e;
    }
    (void)t;
    return 0;
}

static int run_layer(shared *sh, int layer, sfi_error *err)
{
    const sfi_analyze_source *src = sh->src;
    const sfi_analyze_opts *opt = sh->opt;
    double *lstat = &sh->lstat[(size_t)layer * 3];
    layer_bufs b;
    int rc = -1;
    if (bufs_init(sh, &b, err))
        goto out;
    int H = b.H, M = b.M, GQ = b.GQ;
    for (int r = 0; r < src->n_seq; r++) {
        for (int k = 0; k < SFI_POLICY_N_KINDS; k++)
            if (b.pol[k])
                sfi_policy_reset(b.pol[k]);
        sfi_track trk[SFI_POLICY_N_KINDS];
        memset(trk, 0, sizeof trk);
        for (int h = 0; h < H; h++)
            b.n_prev[h] = 0;
        /* The prompt observation, when the trace has one: the request's
         * first step is the prompt's last position and is not measured. */
        int t0 = src->seq_begin[r];
        sfi_policy_prompt pr;
        if (src->prompt && src->prompt(src->ctx, r, layer, &pr)) {
            pr.budget = sfi_budget_positions(&opt->budget, &opt->cfg.prm, pr.n_prompt);
            for (int k = 0; k < SFI_POLICY_N_KINDS; k++)
                if (b.pol[k] && sfi_policy_prompt_run(b.pol[k], layer, &pr, err)) {
                    sfi_error_prefix(err, "request %d layer %d: prompt", r, layer);
                    goto out;
                }
            t0++;
        }
        for (int t = t0; t < src->seq_begin[r + 1]; t++) {
            int n_ctx = src->n_ctx[t];
            int B = sfi_budget_positions(&opt->budget, &opt->cfg.prm, n_ctx);
            int first = t == t0;
            int prev_trig = t > src->seq_begin[r] && src->trigger[t - 1];
            for (int h = 0; h < H; h++)
                if (src->get(src->ctx, t, layer, h, &b.obs[h], b.pos + (size_t)h * M,
                             b.prob + (size_t)h * M, err) ||
                    check_obs(src, &b.obs[h], t, layer, h, n_ctx, err))
                    goto out;
            for (int i = 0; i < H * GQ; i++)
                if (src->get_q(src->ctx, t, layer, i, &b.qobs[i],
                               b.qpos + (size_t)i * src->max_top_q,
                               b.qprob + (size_t)i * src->max_top_q, err) ||
                    check_obs(src, &b.qobs[i], t, layer, i, n_ctx, err))
                    goto out;
            lstat[0] += B;
            lstat[1] += n_ctx;
            lstat[2] += 1;
            stability(sh, &b, layer, first, prev_trig, B);
            const float *q = NULL, *kk = NULL, *vv = NULL;
            if (src->snapshot && src->head_dim > 0 &&
                !src->snapshot(src->ctx, t, layer, &q, &kk, &vv))
                q = kk = vv = NULL;
            int exact = q && kk;
            if (exact) {
                exact_attention(src, q, kk, n_ctx, b.dense, b.rank, b.pr, err);
                if (vv) {
                    sfi_attn_shape shp = {src->n_heads, src->n_kv_heads, src->head_dim};
                    if (sfi_attn_dense_decode(&shp, q, kk, vv, n_ctx, b.o_dense, b.dlog, err))
                        goto out;
                }
            }
            b.lc.step = t;
            sfi_policy_step st = {
                .step = t - src->seq_begin[r], .n_ctx = n_ctx, .budget = B,
                .prev_trigger = prev_trig,
                .next_unused = src->trigger[t] || t + 1 == src->seq_begin[r + 1],
                .q = exact ? q : NULL, .k = exact ? kk : NULL,
                .obs = b.obs, .qobs = b.qobs, .q_per_kv = GQ,
                .layer_qk = exact ? lo_qk : NULL, .layer_obs = b.lc.stamp ? lo_get : NULL,
                .layer_ctx = &b.lc,
            };
            for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
                if (!b.pol[k])
                    continue;
                sfi_analyze_policy *P = &sh->lpol[(size_t)layer * SFI_POLICY_N_KINDS + k];
                int avail = 0, slow = 0;
                if (sfi_policy_run(b.pol[k], layer, &st, &b.sets[(size_t)k * H], &avail, &slow,
                                   err)) {
                    if (b.lc.failed)
                        *err = b.lc.err;
                    sfi_error_prefix(err, "step %d layer %d", t, layer);
                    goto out;
                }
                P->used = 1;
                if (!P->proxy)
                    P->proxy = sfi_policy_proxy_note(b.pol[k]);
                if (!avail)
                    continue;
                P->available = 1;
                double rmean;
                if (measure(sh, &b, k, layer, t, B, n_ctx, q, kk, vv, exact, &rmean, err))
                    goto out;
                if (sfi_policy_has_slow_steps((sfi_policy_kind)k))
                    track_sfi(P, &trk[k], slow, first, prev_trig, rmean);
            }
        }
    }
    rc = 0;
out:
    bufs_free(&b);
    return rc;
}

static void *worker(void *arg)
{
    shared *sh = arg;
    sfi_error err;
    sfi_error_clear(&err);
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        int l = sh->failed ? sh->src->n_layers : sh->next_layer++;
        pthread_mutex_unlock(&sh->mu);
        if (l >= sh->src->n_layers)
            break;
        if (run_layer(sh, l, &err)) {
            pthread_mutex_lock(&sh->mu);
            if (!sh->failed) {
                sh->failed = 1;
                sh->err = err;
            }
            pthread_mutex_unlock(&sh->mu);
            break;
        }
    }
    return NULL;
}

/* A stand-in Kascade calibration from the first steps of request 0 (when
 * no calibration is given; reported as a proxy). */
static sfi_status plan_kascade(const sfi_analyze_source *src, const sfi_analyze_opts *opt,
                               sfi_policy_calib *cal, sfi_error *err)
{
    int S = opt->kascade_calib_steps;
    int avail = src->seq_begin[1] - src->seq_begin[0];
    if (S > avail)
        S = avail;
    if (S < 1)
        return sfi_error_set(err, SFI_EINVAL, "kascade: the first request has no steps to "
                             "calibrate on");
    int L = src->n_layers, H = src->n_kv_heads, M = src->max_top;
    size_t n = (size_t)S * L * H;
    const int32_t **pp = malloc(sizeof *pp * n);
    const float **qq = malloc(sizeof *qq * n);
    int *cnt = malloc(sizeof(int) * n);
    int32_t *pos = malloc(sizeof(int32_t) * n * M);
    float *prob = malloc(sizeof(float) * n * M);
    sfi_status st = SFI_OK;
    if (!pp || !qq || !cnt || !pos || !prob) {
        st = sfi_error_set(err, SFI_ENOMEM, "kascade: out of memory for calibration");
        goto out;
    }
    for (int s = 0; s < S; s++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                size_t i = ((size_t)s * L + l) * H + h;
                int t = src->seq_begin[0] + s;
                sfi_policy_obs o;
                if (src->get(src->ctx, t, l, h, &o, pos + i * M, prob + i * M, err)) {
                    st = err ? err->code : SFI_EFORMAT;
                    goto out;
                }
                if (check_obs(src, &o, t, l, h, src->n_ctx[t], err)) {
                    st = SFI_EFORMAT;
                    goto out;
                }
                /* Copy entries a source may own (they must outlive the call). */
                memmove(pos + i * M, o.pos, sizeof(int32_t) * (size_t)o.n_top);
                memmove(prob + i * M, o.prob, sizeof(float) * (size_t)o.n_top);
                pp[i] = pos + i * M;
                qq[i] = prob + i * M;
                cnt[i] = o.n_top;
            }
    st = sfi_policy_calib_kascade_from_records(pp, qq, cnt, S, L, H, opt->cfg.kascade_calib_k,
                                               cal, err);
out:
    free(pp);
    free(qq);
    free(cnt);
    free(pos);
    free(prob);
    return st;
}

sfi_status sfi_analyze_run(const sfi_analyze_source *src_in, const sfi_analyze_opts *opt,
                           sfi_analyze_result *res, sfi_error *err)
{
    memset(res, 0, sizeof *res);
    sfi_analyze_source src_copy = *src_in;
    if (opt->records_only) {
        src_copy.snapshot = NULL;
        src_copy.prompt = NULL;
        src_copy.head_dim = 0;
    }
    const sfi_analyze_source *src = &src_copy;
    if (src->n_layers < 1 || src->n_kv_heads < 1 || src->n_seq < 1 || src->n_steps < 1 ||
        src->max_top < 1 || src->max_ctx < 1)
        return sfi_error_set(err, SFI_EINVAL, "analyze: the trace has no attention records to "
                             "analyze (%d layers, %d KV heads, %d steps, %d entries per record)",
                             src->n_layers, src->n_kv_heads, src->n_steps, src->max_top);
    if (!opt->policies)
        return sfi_error_set(err, SFI_EINVAL, "analyze: no policies");
    int L = src->n_layers;
    res->n_layers = L;
    res->layer_recall = calloc((size_t)L * SFI_POLICY_N_KINDS, sizeof(double));
    res->layer_n = calloc((size_t)L * SFI_POLICY_N_KINDS, sizeof(double));
    res->jw_sum = calloc((size_t)L, sizeof(double));
    res->ja_sum = calloc((size_t)L, sizeof(double));
    res->jw_n = calloc((size_t)L, sizeof(long));
    res->ja_n = calloc((size_t)L, sizeof(long));
    shared sh = {.src = src, .opt = opt, .res = res, .calib = opt->calib};
    sh.lpol = calloc((size_t)L * SFI_POLICY_N_KINDS, sizeof(sfi_analyze_policy));
    sh.lstat = calloc((size_t)L * 3, sizeof(double));
    int ok = res->layer_recall && res->layer_n && res->jw_sum && res->ja_sum && res->jw_n &&
             res->ja_n && sh.lpol && sh.lstat;
    if (ok && opt->keep_jaccard) {
        res->jw = calloc((size_t)L, sizeof(float *));
        res->ja = calloc((size_t)L, sizeof(float *));
        ok = res->jw && res->ja;
        size_t per = (size_t)src->n_steps * src->n_kv_heads;
        for (int l = 0; ok && l < L; l++) {
            res->jw[l] = malloc(sizeof(float) * per);
            res->ja[l] = malloc(sizeof(float) * per);
            ok = res->jw[l] && res->ja[l];
        }
    }
    sfi_policy_calib proxy = {0};
    sfi_status st = SFI_OK;
    if (!ok) {
        st = sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory");
        goto out;
    }
    if (((opt->policies >> SFI_POLICY_KASCADE) & 1) && !(opt->calib && opt->calib->has_kascade)) {
        if ((st = plan_kascade(src, opt, &proxy, err)))
            goto out;
        if (opt->calib && opt->calib->has_fasa) {
            /* keep the given FASA calibration next to the stand-in */
            proxy.has_fasa = 1;
            proxy.fasa_k = opt->calib->fasa_k;
            proxy.n_tip = opt->calib->n_tip;
            proxy.head_dim = opt->calib->head_dim;
            size_t n = (size_t)L * src->n_kv_heads * proxy.n_tip;
            if (!(proxy.tip = malloc(sizeof(int) * n))) {
                st = sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory");
                goto out;
            }
            memcpy(proxy.tip, opt->calib->tip, sizeof(int) * n);
        }
        sh.calib = &proxy;
        res->kascade_proxy = 1;
    }
    if ((opt->policies >> SFI_POLICY_KASCADE) & 1) {
        sfi_policy_shape shape = {L, src->n_heads > 0 ? src->n_heads : src->n_kv_heads,
                                  src->n_kv_heads, src->head_dim};
        sfi_policy *kp = NULL;
        if ((st = sfi_policy_create(SFI_POLICY_KASCADE, &opt->cfg, &shape, src->max_ctx, sh.calib,
                                    &kp, err)))
            goto out;
        res->n_kascade_anchors = sfi_policy_kascade_anchor_list(kp, res->kascade_anchors, 64);
        sfi_policy_free(kp);
    }
    pthread_mutex_init(&sh.mu, NULL);
    int nt = opt->n_threads < 1 ? 1 : opt->n_threads > 64 ? 64 : opt->n_threads;
    if (nt > L)
        nt = L;
    pthread_t th[64];
    int started = 0;
    for (int i = 1; i < nt; i++)
        if (!pthread_create(&th[started], NULL, worker, &sh))
            started++;
    worker(&sh);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&sh.mu);
    if (sh.failed) {
        if (err)
            *err = sh.err;
        st = sh.err.code ? sh.err.code : SFI_EINVAL;
        goto out;
    }
    /* Merge layer partials (fixed layer order: results do not depend on
     * the thread count). */
    for (int l = 0; l < L; l++) {
        res->budget_sum += sh.lstat[l * 3];
        res->ctx_sum += sh.lstat[l * 3 + 1];
        res->n_steps += sh.lstat[l * 3 + 2];
        for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
            const sfi_analyze_policy *a = &sh.lpol[(size_t)l * SFI_POLICY_N_KINDS + k];
            sfi_analyze_policy *b = &res->pol[k];
            b->used |= a->used;
            b->available |= a->available;
            if (!b->proxy)
                b->proxy = a->proxy;
            const double *x = &a->n;
            double *y = &b->n;
            /* every double field from n to the end, in declaration order */
            size_t nd = (sizeof *a - offsetof(sfi_analyze_policy, n)) / sizeof(double);
            for (size_t i = 0; i < nd; i++)
                y[i] += x[i];
            res->layer_recall[(size_t)k * L + l] = a->recall;
            res->layer_n[(size_t)k * L + l] = a->n;
        }
    }
out:
    sfi_policy_calib_free(&proxy);
    free(sh.lpol);
    free(sh.lstat);
    if (st)
        sfi_analyze_result_free(res);
    return st;
}
