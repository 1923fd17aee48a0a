/* The analyzer's engine (see sfi_analyze.h). Per layer and step it asks
 * each policy for its sets and measures them against the step's recorded
 * attention; work per (step, head, policy) is O(M log M + B), so a 32K
 * context costs no more than a short one except in the policies that say
 * otherwise. */
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
    o->policies = (1u << SFI_PEER_N_KINDS) - 1;
    sfi_peer_config_default(&o->cfg);
    o->budget_ratio = 0.06;
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

static int budget_of(const sfi_analyze_opts *o, int n_ctx)
{
    long b = o->budget_ratio > 0.0 ? lround(o->budget_ratio * n_ctx) : o->budget_abs;
    if (b < 1)
        b = 1;
    return (int)b;
}

/* Everything one worker needs; per layer results go to shared slots that
 * only the layer's worker writes. */
typedef struct {
    const sfi_analyze_source *src;
    const sfi_analyze_opts *opt;
    sfi_analyze_result *res;
    sfi_analyze_policy *lpol;     /* [n_layers][N_KINDS] per layer partials */
    double *lstat;                /* [n_layers][3] budget, ctx, steps */
    const sfi_peer_kascade_plan *plan;
    pthread_mutex_t mu;
    int next_layer;
    int failed;
    sfi_error err;
} shared;

/* Other layers' obs of the current step, generated on demand (Kascade). */
typedef struct {
    const sfi_analyze_source *src;
    int step;
    int *stamp;                   /* [L*H] step the slot holds, -1 */
    sfi_peer_obs *obs;            /* [L*H] */
    int32_t *pos;                 /* [L*H][max_top] */
    float *prob;
    int failed;
    sfi_error err;
} lo_cache;

static const sfi_peer_obs *lo_get(void *ctx, int layer, int kvh)
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

static int check_obs(const sfi_analyze_source *s, const sfi_peer_obs *o, int step, int layer,
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

/* Relative output error of sets vs dense attention for one layer-step. */
/* Per KV head, positions by the step's dense attention (mean over the
 * group's query heads of the softmax of logits[n_heads][n_ctx]),
 * descending; rank[h][0..n_ctx). */
static int cmp_rank(const void *a, const void *b)
{
    const double *x = a, *y = b;  /* (score, position) pairs */
    if (x[0] > y[0]) return -1;
    if (x[0] < y[0]) return 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

static int dense_ranking(const sfi_analyze_source *s, const float *logits, int n_ctx,
                         int32_t **rank, sfi_error *err)
{
    int H = s->n_kv_heads, G = s->n_heads / s->n_kv_heads;
    double *pr = malloc(sizeof(double) * 2 * (size_t)n_ctx);
    if (!pr)
        return sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory"), -1;
    for (int h = 0; h < H; h++) {
        for (int j = 0; j < n_ctx; j++)
            pr[2 * j] = 0.0, pr[2 * j + 1] = j;
        for (int g = 0; g < G; g++) {
            const float *l = logits + (size_t)(h * G + g) * n_ctx;
            double mx = l[0], z = 0.0;
            for (int j = 1; j < n_ctx; j++)
                if (l[j] > mx)
                    mx = l[j];
            for (int j = 0; j < n_ctx; j++)
                z += exp(l[j] - mx);
            for (int j = 0; j < n_ctx; j++)
                pr[2 * j] += exp(l[j] - mx) / z / G;
        }
        qsort(pr, (size_t)n_ctx, 2 * sizeof(double), cmp_rank);
        for (int j = 0; j < n_ctx; j++)
            rank[h][j] = (int32_t)pr[2 * j + 1];
    }
    free(pr);
    return 0;
}

/* Relative output error of one policy's sets against dense attention for
 * one layer-step. A set's n_virtual unnamed members (positions past the
 * trace's top-M) become, for the oracle, the next positions of the exact
 * dense ranking (what its definition picks); for other policies
 * pseudo-random positions outside the set (the even spread the recall
 * estimate assumes). */
static int output_error(const sfi_analyze_source *s, const float *q, const float *k,
                        const float *v, int n_ctx, const sfi_peer_set *sets, int is_oracle,
                        int32_t *const *rank, uint8_t *mark, int32_t **idx, int *n_idx,
                        float *o_dense, float *o_set, double *out, sfi_error *err)
{
    sfi_attn_shape sh = {s->n_heads, s->n_kv_heads, s->head_dim};
    int H = s->n_kv_heads, G = s->n_heads / s->n_kv_heads, d = s->head_dim;
    for (int h = 0; h < H; h++) {
        int n = 0;
        for (int32_t j = 0; j < n_ctx; j++) {
            mark[j] = (uint8_t)sfi_peer_set_contains(&sets[h], j);
            if (mark[j])
                idx[h][n++] = j;
        }
        int want = sets[h].n_virtual;
        if (want > n_ctx - n)
            want = n_ctx - n;
        if (is_oracle) {
            for (int r = 0; r < n_ctx && want > 0; r++)
                if (!mark[rank[h][r]])
                    mark[rank[h][r]] = 1, idx[h][n++] = rank[h][r], want--;
        } else {
            uint32_t x = 2463534242u ^ (uint32_t)(h * 7919 + n_ctx);
            for (int tries = 0; want > 0 && tries < 8 * n_ctx; tries++) {
                x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                int32_t j = (int32_t)(x % (uint32_t)n_ctx);
                if (!mark[j])
                    mark[j] = 1, idx[h][n++] = j, want--;
            }
            for (int32_t j = 0; j < n_ctx && want > 0; j++)
                if (!mark[j])
                    mark[j] = 1, idx[h][n++] = j, want--;
        }
        if (n == 0)
            idx[h][n++] = n_ctx - 1;  /* an empty set attends to itself */
        n_idx[h] = n;
    }
    if (sfi_attn_sparse_decode(&sh, q, k, v, n_ctx, (const int32_t *const *)idx, n_idx, o_set,
                               err))
        return -1;
    for (int h = 0; h < H; h++) {
        if (!sets[h].mean_v)
            continue;
        for (int x = 0; x < d; x++) {
            double m = 0.0;
            for (int j = 0; j < n_ctx; j++)
                m += v[((size_t)j * H + h) * d + x];
            for (int g = 0; g < G; g++)
                o_set[(size_t)(h * G + g) * d + x] = (float)(m / n_ctx);
        }
    }
    double num = 0.0, den = 0.0;
    for (int i = 0; i < s->n_heads * d; i++) {
        double e = (double)o_set[i] - o_dense[i];
        num += e * e;
        den += (double)o_dense[i] * o_dense[i];
    }
    *out = den > 0.0 ? sqrt(num / den) : sqrt(num);
    return 0;
}

static int run_layer(shared *sh, int layer, sfi_error *err)
{
    const sfi_analyze_source *src = sh->src;
    const sfi_analyze_opts *opt = sh->opt;
    int H = src->n_kv_heads, M = src->max_top;
    sfi_analyze_policy *lp = &sh->lpol[(size_t)layer * SFI_PEER_N_KINDS];
    double *lstat = &sh->lstat[(size_t)layer * 3];
    sfi_peer *peers[SFI_PEER_N_KINDS] = {0};
    sfi_peer_set *sets = malloc(sizeof(sfi_peer_set) * (size_t)H * SFI_PEER_N_KINDS);
    sfi_peer_obs *obs = malloc(sizeof(sfi_peer_obs) * (size_t)H);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)H * M);
    float *prob = malloc(sizeof(float) * (size_t)H * M);
    int32_t *prev = malloc(sizeof(int32_t) * (size_t)H * M);
    int *n_prev = calloc((size_t)H, sizeof(int));
    int *stampv = malloc(sizeof(int) * ((size_t)src->max_ctx + 1));
    double *step_rec = calloc(SFI_PEER_N_KINDS, sizeof(double));
    lo_cache lc = {0};
    int32_t **idx = NULL;
    int *n_idx = NULL;
    float *o_dense = NULL, *o_set = NULL, *dlog = NULL;
    int32_t **rank = NULL;
    uint8_t *mark = NULL;
    int rc = -1;
    int stamp_id = 0;
    int want_lo = (opt->policies >> SFI_PEER_KASCADE) & 1;
    int want_q = ((opt->policies >> SFI_PEER_SFI) & 1) && src->get_q && src->q_per_kv > 0 &&
                 src->max_top_q > 0;
    int GQ = want_q ? src->q_per_kv : 0;
    sfi_peer_obs *qobs = NULL;
    int32_t *qpos = NULL;
    float *qprob = NULL;
    if (!sets || !obs || !pos || !prob || !prev || !n_prev || !stampv || !step_rec) {
        sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory");
        goto out;
    }
    for (int i = 0; i <= src->max_ctx; i++)
        stampv[i] = -1;
    if (want_q) {
        size_t nq = (size_t)H * GQ;
        qobs = malloc(sizeof(sfi_peer_obs) * nq);
        qpos = malloc(sizeof(int32_t) * nq * src->max_top_q);
        qprob = malloc(sizeof(float) * nq * src->max_top_q);
        if (!qobs || !qpos || !qprob) {
            sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory");
            goto out;
        }
    }
    if (want_lo) {
        size_t LH = (size_t)src->n_layers * H;
        lc.src = src;
        lc.stamp = malloc(sizeof(int) * LH);
        lc.obs = malloc(sizeof(sfi_peer_obs) * LH);
        lc.pos = malloc(sizeof(int32_t) * LH * M);
        lc.prob = malloc(sizeof(float) * LH * M);
        if (!lc.stamp || !lc.obs || !lc.pos || !lc.prob) {
            sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory");
            goto out;
        }
        for (size_t i = 0; i < LH; i++)
            lc.stamp[i] = -1;
    }
    if (src->snapshot && src->head_dim > 0) {
        idx = calloc((size_t)H, sizeof *idx);
        n_idx = calloc((size_t)H, sizeof *n_idx);
        o_dense = malloc(sizeof(float) * (size_t)src->n_heads * src->head_dim);
        o_set = malloc(sizeof(float) * (size_t)src->n_heads * src->head_dim);
        dlog = malloc(sizeof(float) * (size_t)src->n_heads * ((size_t)src->max_ctx + 1));
        rank = calloc((size_t)H, sizeof *rank);
        mark = malloc((size_t)src->max_ctx + 1);
        if (!idx || !n_idx || !o_dense || !o_set || !dlog || !rank || !mark) {
            sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory");
            goto out;
        }
        for (int h = 0; h < H; h++)
            if (!(idx[h] = malloc(sizeof(int32_t) * ((size_t)src->max_ctx + 1))) ||
                !(rank[h] = malloc(sizeof(int32_t) * ((size_t)src->max_ctx + 1)))) {
                sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory");
                goto out;
            }
    }
    for (int k = 0; k < SFI_PEER_N_KINDS; k++) {
        if (!((opt->policies >> k) & 1))
            continue;
        if (sfi_peer_create((sfi_peer_kind)k, &opt->cfg, layer, src->n_layers, H, src->n_heads,
                            src->head_dim, src->max_ctx, sh->plan, &peers[k], err))
            goto out;
    }
    for (int r = 0; r < src->n_seq; r++) {
        for (int k = 0; k < SFI_PEER_N_KINDS; k++)
            if (peers[k])
                sfi_peer_reset(peers[k]);
        int prev_slow = 0, since = 0, prev_fast_pending = 0;
        double prev_sfi_recall = 0.0;
        for (int h = 0; h < H; h++)
            n_prev[h] = 0;
        for (int t = src->seq_begin[r]; t < src->seq_begin[r + 1]; t++) {
            int n_ctx = src->n_ctx[t];
            int B = budget_of(opt, n_ctx);
            int first = t == src->seq_begin[r];
            int prev_trig = !first && src->trigger[t - 1];
            for (int h = 0; h < H; h++) {
                if (src->get(src->ctx, t, layer, h, &obs[h], pos + (size_t)h * M,
                             prob + (size_t)h * M, err))
                    goto out;
                if (check_obs(src, &obs[h], t, layer, h, n_ctx, err))
                    goto out;
            }
            for (int i = 0; i < H * GQ; i++) {
                if (src->get_q(src->ctx, t, layer, i, &qobs[i], qpos + (size_t)i * src->max_top_q,
                               qprob + (size_t)i * src->max_top_q, err))
                    goto out;
                if (check_obs(src, &qobs[i], t, layer, i, n_ctx, err))
                    goto out;
            }
            lstat[0] += B < n_ctx ? B : n_ctx;
            lstat[1] += n_ctx;
            lstat[2] += 1;
            /* Support stability: top sets of consecutive steps. */
            for (int h = 0; h < H; h++) {
                const sfi_peer_obs *o = &obs[h];
                int K = opt->stab_k > 0 ? opt->stab_k : B;
                if (K > o->n_top)
                    K = o->n_top;
                if (!first && n_prev[h] > 0 && K > 0) {
                    stamp_id++;
                    for (int i = 0; i < n_prev[h]; i++)
                        stampv[prev[(size_t)h * M + i]] = stamp_id;
                    int inter = 0;
                    for (int i = 0; i < K; i++)
                        inter += stampv[o->pos[i]] == stamp_id;
                    float jac = (float)inter / (float)(K + n_prev[h] - inter);
                    if (prev_trig) {
                        sh->res->ja_sum[layer] += jac;
                        if (sh->res->ja)
                            sh->res->ja[layer][sh->res->ja_n[layer]] = jac;
                        sh->res->ja_n[layer]++;
                    } else {
                        sh->res->jw_sum[layer] += jac;
                        if (sh->res->jw)
                            sh->res->jw[layer][sh->res->jw_n[layer]] = jac;
                        sh->res->jw_n[layer]++;
                    }
                }
                memcpy(prev + (size_t)h * M, o->pos, sizeof(int32_t) * (size_t)K);
                n_prev[h] = K;
            }
            const float *q = NULL, *kk = NULL, *vv = NULL;
            if (src->snapshot && src->head_dim > 0 &&
                !src->snapshot(src->ctx, t, layer, &q, &kk, &vv))
                q = kk = vv = NULL;
            int have_err = q && kk && vv;
            if (have_err) {
                sfi_attn_shape shp = {src->n_heads, src->n_kv_heads, src->head_dim};
                if (sfi_attn_dense_decode(&shp, q, kk, vv, n_ctx, o_dense, dlog, err))
                    goto out;
                if (dense_ranking(src, dlog, n_ctx, rank, err))
                    goto out;
            }
            lc.step = t;
            sfi_peer_step st = {
                .step = t - src->seq_begin[r], .n_ctx = n_ctx, .prev_trigger = prev_trig,
                .budget = B, .next_unused = src->trigger[t] || t + 1 == src->seq_begin[r + 1],
                .obs = obs, .qobs = qobs, .q_per_kv = GQ, .layer_obs = want_lo ? lo_get : NULL,
                .layer_obs_ctx = &lc, .q = q, .k = kk,
            };
            for (int k = 0; k < SFI_PEER_N_KINDS; k++) {
                if (!peers[k])
                    continue;
                sfi_peer_set *ks = &sets[(size_t)k * H];
                int avail = 0, slow = 0;
                if (sfi_peer_step_run(peers[k], &st, ks, &avail, &slow, err)) {
                    if (lc.failed)
                        *err = lc.err;
                    sfi_error_prefix(err, "step %d layer %d", t, layer);
                    goto out;
                }
                sfi_analyze_policy *P = &lp[k];
                P->used = 1;
                if (!avail)
                    continue;
                P->available = 1;
                double rsum = 0.0;
                for (int h = 0; h < H; h++) {
                    double lo;
                    int n_in, n_in_top;
                    int Kt = B < obs[h].n_top ? B : obs[h].n_top;
                    double rc_ = sfi_peer_set_recall(&ks[h], &obs[h], Kt, &lo, &n_in, &n_in_top);
                    if (rc_ > 1.0)
                        rc_ = 1.0;
                    P->n += 1;
                    P->recall += rc_;
                    P->recall_lo += lo;
                    P->overlap += Kt > 0 ? (double)n_in_top / Kt : 1.0;
                    P->ratio += (double)ks[h].size / n_ctx;
                    P->mean_v += ks[h].mean_v;
                    rsum += rc_;
                }
                double rmean = rsum / H;
                if (have_err) {
                    double e;
                    if (output_error(src, q, kk, vv, n_ctx, ks, k == SFI_PEER_ORACLE, rank,
                                     mark, idx, n_idx, o_dense, o_set, &e, err))
                        goto out;
                    P->n_err += 1;
                    P->out_err += e;
                }
                if (k == SFI_PEER_SFI) {
                    P->n_steps += 1;
                    P->n_slow += slow;
                    if (slow) {
                        since = 0;
                        if (prev_trig && !first && !prev_slow) {
                            P->before_n += 1;
                            P->before_recall += prev_sfi_recall;
                            prev_fast_pending = 1;
                        } else {
                            prev_fast_pending = 0;
                        }
                    } else {
                        since++;
                        P->fast_n += 1;
                        P->fast_recall += rmean;
                        if (prev_fast_pending) {
                            P->after_n += 1;
                            P->after_recall += rmean;
                        }
                        prev_fast_pending = 0;
                    }
                    int si = since < SFI_ANALYZE_SINCE_MAX ? since : SFI_ANALYZE_SINCE_MAX;
                    if (!slow) {
                        P->since_n[si] += 1;
                        P->since_recall[si] += rmean;
                    }
                    prev_slow = slow;
                    prev_sfi_recall = rmean;
                }
                step_rec[k] = rmean;
            }
        }
    }
    rc = 0;
out:
    for (int k = 0; k < SFI_PEER_N_KINDS; k++)
        sfi_peer_free(peers[k]);
    free(sets);
    free(obs);
    free(pos);
    free(prob);
    free(prev);
    free(n_prev);
    free(stampv);
    free(step_rec);
    free(qobs);
    free(qpos);
    free(qprob);
    free(lc.stamp);
    free(lc.obs);
    free(lc.pos);
    free(lc.prob);
    if (idx)
        for (int h = 0; h < H; h++)
            free(idx[h]);
    if (rank)
        for (int h = 0; h < H; h++)
            free(rank[h]);
    free(rank);
    free(mark);
    free(dlog);
    free(idx);
    free(n_idx);
    free(o_dense);
    free(o_set);
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

/* Kascade's plan from the first calibration steps of request 0. */
static sfi_status plan_kascade(const sfi_analyze_source *src, const sfi_analyze_opts *opt,
                               sfi_peer_kascade_plan *plan, sfi_error *err)
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
    sfi_peer_obs *cal = malloc(sizeof *cal * n);
    int32_t *pos = malloc(sizeof(int32_t) * n * M);
    float *prob = malloc(sizeof(float) * n * M);
    sfi_status st = SFI_OK;
    if (!cal || !pos || !prob) {
        st = sfi_error_set(err, SFI_ENOMEM, "kascade: out of memory for calibration");
        goto out;
    }
    for (int s = 0; s < S; s++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                size_t i = ((size_t)s * L + l) * H + h;
                int t = src->seq_begin[0] + s;
                if (src->get(src->ctx, t, l, h, &cal[i], pos + i * M, prob + i * M, err)) {
                    st = err ? err->code : SFI_EFORMAT;
                    goto out;
                }
                if (check_obs(src, &cal[i], t, l, h, src->n_ctx[t], err)) {
                    st = SFI_EFORMAT;
                    goto out;
                }
                /* Copy entries a source may own (they must outlive the call). */
                if (cal[i].pos != pos + i * M) {
                    memcpy(pos + i * M, cal[i].pos, sizeof(int32_t) * (size_t)cal[i].n_top);
                    memcpy(prob + i * M, cal[i].prob, sizeof(float) * (size_t)cal[i].n_top);
                    cal[i].pos = pos + i * M;
                    cal[i].prob = prob + i * M;
                }
            }
    int k = budget_of(opt, src->n_ctx[src->seq_begin[0]]);
    st = sfi_peer_kascade_plan_build(cal, S, L, H, k, opt->cfg.kascade_anchors, plan, err);
out:
    free(cal);
    free(pos);
    free(prob);
    return st;
}

sfi_status sfi_analyze_run(const sfi_analyze_source *src, const sfi_analyze_opts *opt,
                           sfi_analyze_result *res, sfi_error *err)
{
    memset(res, 0, sizeof *res);
    if (src->n_layers < 1 || src->n_kv_heads < 1 || src->n_seq < 1 || src->n_steps < 1 ||
        src->max_top < 1 || src->max_ctx < 1)
        return sfi_error_set(err, SFI_EINVAL, "analyze: the trace has no attention records to "
                             "analyze (%d layers, %d KV heads, %d steps, %d entries per record)",
                             src->n_layers, src->n_kv_heads, src->n_steps, src->max_top);
    if (!opt->policies)
        return sfi_error_set(err, SFI_EINVAL, "analyze: no policies");
    int L = src->n_layers;
    res->n_layers = L;
    res->layer_recall = calloc((size_t)L * SFI_PEER_N_KINDS, sizeof(double));
    res->layer_n = calloc((size_t)L * SFI_PEER_N_KINDS, sizeof(double));
    res->jw_sum = calloc((size_t)L, sizeof(double));
    res->ja_sum = calloc((size_t)L, sizeof(double));
    res->jw_n = calloc((size_t)L, sizeof(long));
    res->ja_n = calloc((size_t)L, sizeof(long));
    shared sh = {.src = src, .opt = opt, .res = res};
    sh.lpol = calloc((size_t)L * SFI_PEER_N_KINDS, sizeof(sfi_analyze_policy));
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
    sfi_peer_kascade_plan plan = {0};
    sfi_status st = SFI_OK;
    if (!ok) {
        st = sfi_error_set(err, SFI_ENOMEM, "analyze: out of memory");
        goto out;
    }
    if ((opt->policies >> SFI_PEER_KASCADE) & 1) {
        if ((st = plan_kascade(src, opt, &plan, err)))
            goto out;
        for (int l = 0; l < L && res->n_kascade_anchors < 64; l++)
            if (plan.is_anchor[l])
                res->kascade_anchors[res->n_kascade_anchors++] = l;
        sh.plan = &plan;
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
        for (int k = 0; k < SFI_PEER_N_KINDS; k++) {
            const sfi_analyze_policy *a = &sh.lpol[(size_t)l * SFI_PEER_N_KINDS + k];
            sfi_analyze_policy *b = &res->pol[k];
            b->used |= a->used;
            b->available |= a->available;
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
    sfi_peer_kascade_plan_free(&plan);
    free(sh.lpol);
    free(sh.lstat);
    if (st)
        sfi_analyze_result_free(res);
    return st;
}
