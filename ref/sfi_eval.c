/* sfi-ref eval's harness; see sfi_eval.h.
 *
 * Runs: the prefix is prefilled once; full KV, then every (budget, policy)
 * pair, each from a copy of the prefix's cache. SFI runs through the decode
 * loop itself (sfi_decode_run_prefix with teacher forcing: the same
 * slow/fast steps, Selector and fast sets as sfi-ref run); every other
 * policy is an sfi_policy of ref/sfi_policies.h (one object for all
 * layers) asked at each step and layer for its sets, which the attend hook
 * then attends to.
 *
 * What a peer sees: after the prefill, each layer's last prompt queries
 * and keys (its prompt observation: H2O, SnapKV, LFPS are defined on it);
 * at a step, the real query and the layer's cached keys, from which it
 * computes whatever attention its rule observes. Kascade and FASA take the
 * calibration of o->calib; without one, Kascade's is a stand-in measured
 * on the last KASCADE_CALIB prompt queries of the prefix, which the row's
 * proxy note names (it leaks), and FASA calibrates on its first step.
 *
 * Metrics use sfi_math's exp/log (no libm): log-softmax in float with a
 * double sum, KL and means accumulated in double. */
#include <config.h>

#include "sfi_eval.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sfi_attention.h"
#include "sfi_decode.h"
#include "sfi_math.h"
#include "sfi_state.h"

#ifdef SFI_HAVE_OPENBLAS
#include <cblas.h>
#endif

#define KASCADE_CALIB 16
#define EVAL_MAX_KV_HEADS 1024

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of the calling thread: a run's own cost while others run. */
static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void sfi_eval_opts_default(sfi_eval_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_prefix = 8192;
    o->n_tokens = 512;
    static const double def[] = {0.02, 0.04, 0.06, 0.12, 0.27};
    o->n_shares = (int)(sizeof def / sizeof def[0]);
    memcpy(o->shares, def, sizeof def);
    o->policies = SFI_EVAL_DEFAULT_POLICIES;
    sfi_policy_config_default(&o->cfg);
    o->backend = sfi_backend_available(SFI_BACKEND_BLAS) ? SFI_BACKEND_BLAS : SFI_BACKEND_SCALAR;
    o->n_boot = 1000;
    o->conf = 0.95;
    o->seed = 1;
}

sfi_status sfi_eval_parse_shares(const char *list, sfi_eval_opts *o, sfi_error *err)
{
    double v[SFI_EVAL_MAX_BUDGETS];
    int n = 0;
    const char *p = list;
    if (!*p)
        return sfi_error_set(err, SFI_EINVAL, "budgets: empty list");
    while (*p) {
        char *end;
        double x = strtod(p, &end);
        int pct = *end == '%';
        if (pct)
            end++;
        if (end == p || (*end && *end != ',') || !(x > 0.0) || x > (pct ? 100.0 : 1.0))
            return sfi_error_set(err, SFI_EINVAL,
                                 "budgets '%s': expected comma-separated shares in (0, 1] or "
                                 "percentages in (0, 100]%%",
                                 list);
        if (n == SFI_EVAL_MAX_BUDGETS)
            return sfi_error_set(err, SFI_EINVAL, "budgets '%s': more than %d", list,
                                 SFI_EVAL_MAX_BUDGETS);
        v[n++] = pct ? x / 100.0 : x;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p)
            return sfi_error_set(err, SFI_EINVAL, "budgets '%s': trailing comma", list);
    }
    memcpy(o->shares, v, sizeof(double) * (size_t)n);
    o->n_shares = n;
    return SFI_OK;
}

int sfi_eval_budget(double share, int n_prefix, int n_tokens)
{
    /* The one budget definition at the run's largest context. */
    sfi_budget b = {.ratio = share};
    sfi_params prm;
    sfi_params_default(&prm);
    return sfi_budget_positions(&b, &prm, n_prefix + n_tokens);
}

void sfi_eval_sfi_split(const sfi_params *prm, int B, int n_ctx_max, int *n_recent, int *K)
{
    sfi_budget_sfi_split(prm, B, n_ctx_max, n_recent, K);
}

void sfi_eval_result_free(sfi_eval_result *r)
{
    if (!r)
        return;
    free(r->rows);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- */

typedef struct {
    const sfi_qwen3 *m;
    const sfi_model_config *c;
    const sfi_eval_opts *o;
    const int32_t *tok;
    int L, N, V, nl, nh, nkv, hd, cap;
    sfi_decode_prefix pre;
    sfi_kv_cache work;
    /* full KV */
    float *full_lp;        /* [N][V] */
    int32_t *full_arg;     /* [N] */
    double *full_nll;      /* [N] */
    /* one run */
    float *logits, *lp;    /* [V] */
    double *nll, *kl;      /* [N] */
    uint8_t *agree;        /* [N] */
    int64_t attended, attend_den;
    double mass, mass_den;  /* captured attention mass, sum and count */
    float *att_lg;          /* [group][cap]: logits of the mass pass */
    int32_t *sfi_sel;       /* [layers][kv heads][cap]: SFI's latest Selector sets */
    int *sfi_nsel;          /* [layers][kv heads] */
    int sfi_recent;         /* SFI's n_recent at this budget */
    int n_slow;
    sfi_error *err;
} ectx;

static void log_softmax(const float *x, int n, float *lp)
{
    float mx = sfi_max(x, (size_t)n);
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += (double)sfi_expf(x[i] - mx);
    float lse = mx + sfi_logf((float)s);
    for (int i = 0; i < n; i++)
        lp[i] = x[i] - lse;
}

/* Scores step s (1..N) of the current run from its logits. */
static void score(ectx *e, int s, const float *logits)
{
    int t = s - 1;
    log_softmax(logits, e->V, e->lp);
    e->nll[t] = -(double)e->lp[e->tok[e->L + s]];
    const float *lf = e->full_lp + (size_t)t * e->V;
    double kl = 0.0;
    for (int i = 0; i < e->V; i++) {
        double d = (double)lf[i] - (double)e->lp[i];
        if (d != 0.0)
            kl += (double)sfi_expf(lf[i]) * d;
    }
    e->kl[t] = kl > 0.0 ? kl : 0.0;
    e->agree[t] = sfi_argmax(logits, e->V) == e->full_arg[t];
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile bootstrap of the mean of d[0..n): R resamples of n tokens
 * drawn with replacement. */
static sfi_status bootstrap(const double *d, int n, int R, double conf, uint64_t seed,
                            double *lo, double *hi, sfi_error *err)
{
    if (R < 1 || n < 1) {
        *lo = *hi = NAN;
        return SFI_OK;
    }
    double *means = malloc(sizeof(double) * (size_t)R);
    if (!means)
        return sfi_error_set(err, SFI_ENOMEM, "bootstrap: out of memory");
    uint64_t st = seed;
    for (int r = 0; r < R; r++) {
        double s = 0.0;
        for (int i = 0; i < n; i++) {
            double u = (double)(splitmix64(&st) >> 11) * (1.0 / 9007199254740992.0);
            int k = (int)(u * n);
            s += d[k < n ? k : n - 1];
        }
        means[r] = s / n;
    }
    qsort(means, (size_t)R, sizeof(double), cmp_double);
    double a = (1.0 - conf) / 2.0;
    int il = (int)(a * R), ih = (int)((1.0 - a) * R + 0.999999) - 1;
    if (il < 0)
        il = 0;
    if (ih > R - 1)
        ih = R - 1;
    if (ih < il)
        ih = il;
    *lo = means[il];
    *hi = means[ih];
    free(means);
    return SFI_OK;
}

/* ---------------------------------------------------------------- */
/* Full KV                                                            */

static sfi_status run_full(ectx *e)
{
    sfi_status rc = sfi_kv_cache_copy(&e->work, &e->pre.kv, e->err);
    for (int s = 1; s <= e->N && !rc; s++) {
        rc = sfi_qwen3_step(e->m, e->o->backend, &e->work, e->tok[e->L + s - 1], NULL, NULL,
                            e->logits, e->err);
        if (rc)
            break;
        int t = s - 1;
        float *lp = e->full_lp + (size_t)t * e->V;
        log_softmax(e->logits, e->V, lp);
        e->full_nll[t] = -(double)lp[e->tok[e->L + s]];
        e->full_arg[t] = sfi_argmax(e->logits, e->V);
    }
    return rc;
}

/* ---------------------------------------------------------------- */
/* Captured attention mass                                            */

/* Adds, for each query head, the share of its dense attention over the
 * n_ctx positions that falls on its KV head's set ix[kvh][0..nn[kvh])
 * (ascending, distinct); sets NULL: every position (mass 1). */
static void mass_add(ectx *e, int layer, const float *q, const sfi_kv_cache *kv, int n_ctx,
                     const int32_t *const *ix, const int *nn)
{
    if (!ix) {
        e->mass += e->nh;
        e->mass_den += e->nh;
        return;
    }
    int G = e->nh / e->nkv, hd = e->hd, ld = e->nkv * hd;
    const float *K = sfi_kv_k(kv, layer);
    float scale = sfi_attn_scale(hd);
    float *lg = e->att_lg;
    for (int g = 0; g < e->nkv; g++) {
#ifdef SFI_HAVE_OPENBLAS
        if (e->o->backend == SFI_BACKEND_BLAS) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, G, n_ctx, hd, scale,
                        q + (size_t)g * G * hd, hd, K + (size_t)g * hd, ld, 0.0f, lg, n_ctx);
        } else
#endif
        {
            for (int i = 0; i < G; i++)
                for (int j = 0; j < n_ctx; j++)
                    lg[(size_t)i * n_ctx + j] =
                        sfi_dot(q + ((size_t)g * G + i) * hd, K + (size_t)j * ld + (size_t)g * hd,
                                (size_t)hd) *
                        scale;
        }
        for (int i = 0; i < G; i++) {
            const float *l = lg + (size_t)i * n_ctx;
            float mx = sfi_max(l, (size_t)n_ctx);
            double all = 0.0, in = 0.0;
            for (int j = 0; j < n_ctx; j++)
                all += (double)sfi_expf(l[j] - mx);
            for (int t = 0; t < nn[g]; t++)
                in += (double)sfi_expf(l[ix[g][t]] - mx);
            e->mass += in / all;
        }
    }
    e->mass_den += e->nh;
}

/* ---------------------------------------------------------------- */
/* SFI through the decode loop                                        */

static sfi_status sfi_on_step(void *user, const sfi_decode_step_info *si, sfi_error *err)
{
    (void)err;
    ectx *e = user;
    if (si->step < 1)
        return SFI_OK;
    score(e, si->step, si->logits);
    e->attended += si->attended;
    e->attend_den += (int64_t)si->n_ctx * e->nkv * e->nl;
    if (si->kind == SFI_STEP_SLOW)
        e->n_slow++;
    return SFI_OK;
}

/* SFI's sets as the decode loop's fast steps read them
 * (sfi_state_fast_set): sink, the latest Selector set, recent. */
static sfi_status sfi_on_slow_layer(void *user, const sfi_decode_slow_layer_info *si,
                                    sfi_error *err)
{
    (void)err;
    ectx *e = user;
    for (int h = 0; h < e->nkv; h++) {
        size_t at = (size_t)si->layer * e->nkv + (size_t)h;
        memcpy(e->sfi_sel + at * e->cap, si->selected + (size_t)h * si->K,
               sizeof(int32_t) * (size_t)si->n_selected[h]);
        e->sfi_nsel[at] = si->n_selected[h];
    }
    return SFI_OK;
}

static sfi_status sfi_on_attention(void *user, const sfi_decode_attention_info *ai,
                                   sfi_error *err)
{
    (void)err;
    ectx *e = user;
    if (ai->step < 1)
        return SFI_OK;
    int n = ai->n_ctx, G = e->nh / e->nkv;
    if (ai->kind == SFI_STEP_SLOW) {
        e->mass += e->nh;
        e->mass_den += e->nh;
        return SFI_OK;
    }
    int a = e->o->cfg.prm.n_sink < n ? e->o->cfg.prm.n_sink : n;
    int b = n - e->sfi_recent;
    if (b < a)
        b = a;
    for (int h = 0; h < e->nh; h++) {
        const float *p = ai->probs + (size_t)h * n;
        size_t at = (size_t)ai->layer * e->nkv + (size_t)(h / G);
        const int32_t *sel = e->sfi_sel + at * e->cap;
        double s = 0.0;
        for (int j = 0; j < a; j++)
            s += p[j];
        int32_t last = a - 1;
        for (int i = 0; i < e->sfi_nsel[at]; i++)
            if (sel[i] > last && sel[i] < b) {
                s += p[sel[i]];
                last = sel[i];
            }
        for (int j = b; j < n; j++)
            s += p[j];
        e->mass += s;
    }
    e->mass_den += e->nh;
    return SFI_OK;
}

static sfi_status run_sfi(ectx *e, sfi_policy_kind kind, int B)
{
    sfi_decode_opts o;
    sfi_decode_opts_default(&o);
    o.mode = SFI_DECODE_SFI;
    o.params = e->o->cfg.prm;
    sfi_budget_sfi_split(&e->o->cfg.prm, B, e->L + e->N, &o.params.n_recent, &o.params.K);
    o.trigger = sfi_policy_trigger_kind(kind);
    o.interval = e->o->cfg.interval;
    o.is_trigger = e->o->is_trigger;
    o.n_trigger_vocab = e->o->n_trigger_vocab;
    o.max_new = e->N + 1;
    o.stop_token = -1;
    o.backend = e->o->backend;
    o.forced = e->tok + e->L;
    o.n_forced = e->N;
    e->sfi_recent = o.params.n_recent;
    memset(e->sfi_nsel, 0, sizeof(int) * (size_t)e->nl * e->nkv);
    sfi_decode_observer obs = {.user = e,
                               .want_attention = 1,
                               .on_step = sfi_on_step,
                               .on_slow_layer = sfi_on_slow_layer,
                               .on_attention = sfi_on_attention};
    sfi_decode_result res;
    sfi_status rc = sfi_decode_run_prefix(e->m, &o, &e->pre, &obs, &res, e->err);
    if (rc == SFI_OK)
        sfi_decode_result_free(&res);
    return rc;
}

/* ---------------------------------------------------------------- */
/* Peers of ref/sfi_policies.h                                        */

struct sfi_eval_policy {
    sfi_policy_kind kind;
    int nl, nh, nkv, hd, cap;
    sfi_policy *pol;
    int32_t *idx;           /* [nkv][cap] */
    int *n_idx;             /* [nkv] */
    sfi_policy_set *sets;   /* [nkv] */
};

void sfi_eval_policy_free(sfi_eval_policy *p)
{
    if (!p)
        return;
    sfi_policy_free(p->pol);
    free(p->idx);
    free(p->n_idx);
    free(p->sets);
    free(p);
}

sfi_status sfi_eval_policy_create(sfi_policy_kind kind, const sfi_policy_config *cfg,
                                  int n_layers, int n_heads, int n_kv_heads, int head_dim,
                                  int max_ctx, const sfi_policy_calib *calib,
                                  sfi_eval_policy **out, sfi_error *err)
{
    *out = NULL;
    if (kind == SFI_POLICY_FULL || sfi_policy_has_slow_steps(kind) ||
        (unsigned)kind >= SFI_POLICY_N_KINDS)
        return sfi_error_set(err, SFI_EINVAL, "eval policy: %s is not a peer policy",
                             sfi_policy_kind_name(kind));
    if (n_layers < 1 || n_kv_heads < 1 || n_kv_heads > EVAL_MAX_KV_HEADS || n_heads < 1 ||
        n_heads % n_kv_heads || head_dim < 2 || max_ctx < 1)
        return sfi_error_set(err, SFI_EINVAL, "eval policy: bad shape (%d layers, %d/%d heads, "
                             "head_dim %d, context %d)", n_layers, n_heads, n_kv_heads,
                             head_dim, max_ctx);
    sfi_eval_policy *p = calloc(1, sizeof *p);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "eval policy: out of memory");
    p->kind = kind;
    p->nl = n_layers;
    p->nh = n_heads;
    p->nkv = n_kv_heads;
    p->hd = head_dim;
    p->cap = max_ctx;
    p->idx = malloc(sizeof(int32_t) * (size_t)n_kv_heads * max_ctx);
    p->n_idx = calloc((size_t)n_kv_heads, sizeof(int));
    p->sets = calloc((size_t)n_kv_heads, sizeof *p->sets);
    if (!p->idx || !p->n_idx || !p->sets) {
        sfi_eval_policy_free(p);
        return sfi_error_set(err, SFI_ENOMEM, "eval policy %s: out of memory",
                             sfi_policy_kind_name(kind));
    }
    sfi_policy_shape sh = {n_layers, n_heads, n_kv_heads, head_dim};
    sfi_status rc = sfi_policy_create(kind, cfg, &sh, max_ctx, calib, &p->pol, err);
    if (rc) {
        sfi_eval_policy_free(p);
        return rc;
    }
    *out = p;
    return SFI_OK;
}

sfi_status sfi_eval_policy_prompt(sfi_eval_policy *p, int layer, const sfi_policy_prompt *pr,
                                  sfi_error *err)
{
    return sfi_policy_prompt_run(p->pol, layer, pr, err);
}

const char *sfi_eval_policy_proxy(const sfi_eval_policy *p)
{
    return sfi_policy_proxy_note(p->pol);
}

int sfi_eval_policy_anchors(const sfi_eval_policy *p, int *anchors, int max)
{
    return sfi_policy_kascade_anchor_list(p->pol, anchors, max);
}

sfi_status sfi_eval_policy_sets(sfi_eval_policy *p, const sfi_eval_layer_step *ls,
                                const int32_t **idx, const int **n_idx, sfi_error *err)
{
    int layer = ls->layer, n_ctx = ls->n_ctx, nkv = p->nkv;
    if (layer < 0 || layer >= p->nl || n_ctx < 1 || n_ctx > p->cap || ls->budget < 1 ||
        !ls->q || !ls->k)
        return sfi_error_set(err, SFI_EINVAL, "eval policy %s: bad step (layer %d, context %d, "
                             "budget %d)", sfi_policy_kind_name(p->kind), layer, n_ctx,
                             ls->budget);
    sfi_policy_step st = {.step = ls->step, .n_ctx = n_ctx, .budget = ls->budget,
                          .prev_trigger = ls->prev_trigger, .q = ls->q, .k = ls->k};
    int avail = 1;
    sfi_status rc = sfi_policy_run(p->pol, layer, &st, p->sets, &avail, NULL, err);
    if (rc)
        return sfi_error_prefix(err, "policy %s, layer %d, step %d",
                                sfi_policy_kind_name(p->kind), layer, ls->step);
    if (!avail)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: no set at layer %d, step %d",
                             sfi_policy_kind_name(p->kind), layer, ls->step);
    for (int h = 0; h < nkv; h++) {
        int32_t *ix = p->idx + (size_t)h * p->cap;
        if (ls->budget >= n_ctx) {
            /* nothing to choose: every position (the policy's state went on) */
            for (int j = 0; j < n_ctx; j++)
                ix[j] = j;
            p->n_idx[h] = n_ctx;
        } else {
            sfi_policy_set_indices(&p->sets[h], ix, &p->n_idx[h]);
        }
    }
    *idx = p->idx;
    *n_idx = p->n_idx;
    return SFI_OK;
}

/* The harness's side of a peer run. */
typedef struct {
    ectx *e;
    sfi_eval_policy *pol;
    int budget, step, prev_trigger;
} pctx;

static sfi_status peer_attend(void *user, int layer, const float *q, const sfi_kv_cache *kv,
                              int n_ctx, float *out, sfi_error *err)
{
    pctx *p = user;
    ectx *e = p->e;
    int nkv = e->nkv, G = e->nh / nkv, hd = e->hd;
    sfi_status rc;
    sfi_eval_layer_step ls = {.layer = layer, .step = p->step, .n_ctx = n_ctx,
                              .budget = p->budget, .prev_trigger = p->prev_trigger, .q = q,
                              .k = sfi_kv_k(kv, layer)};
    const int32_t *idx;
    const int *n_idx;
    if ((rc = sfi_eval_policy_sets(p->pol, &ls, &idx, &n_idx, err)))
        return rc;
    int all = 1;
    const int32_t *ix[EVAL_MAX_KV_HEADS];
    int nn[EVAL_MAX_KV_HEADS];
    static const int32_t zero = 0;
    for (int h = 0; h < nkv; h++) {
        e->attended += n_idx[h];
        all = all && n_idx[h] == n_ctx;
        /* An empty set attends to nothing: its heads' output is zero (a
         * dummy position keeps the sparse call well formed; its output is
         * dropped below). */
        ix[h] = n_idx[h] ? idx + (size_t)h * e->cap : &zero;
        nn[h] = n_idx[h] ? n_idx[h] : 1;
    }
    e->attend_den += (int64_t)n_ctx * nkv;
    mass_add(e, layer, q, kv, n_ctx, all ? NULL : ix, nn);
    if (all)
        return sfi_qwen3_attn_dense(e->m, e->o->backend, layer, q, kv, n_ctx, out, NULL, err);
    if ((rc = sfi_qwen3_attn_sparse(e->m, e->o->backend, layer, q, kv, n_ctx, ix, nn, out, err)))
        return rc;
    for (int h = 0; h < nkv; h++)
        if (!n_idx[h])
            memset(out + (size_t)h * G * hd, 0, (size_t)G * hd * sizeof(float));
    return SFI_OK;
}

/* The prompt's last n queries of layer l, oldest first, from the prefix's
 * ring (position p in slot p % n_queries). */
static void prompt_tail(const ectx *e, int l, int n, float *out)
{
    size_t qd = (size_t)e->nh * e->hd;
    for (int t = 0; t < n; t++) {
        int pos = e->L - n + t;
        memcpy(out + (size_t)t * qd,
               e->pre.qhist + ((size_t)l * e->pre.n_queries + (size_t)(pos % e->pre.n_queries)) * qd,
               sizeof(float) * qd);
    }
}

/* A stand-in calibration when none is given: the calibrator over the last
 * KASCADE_CALIB prompt queries of the evaluated prefix (it leaks: the
 * rows say so). */
static sfi_status standin_calib(ectx *e, sfi_policy_calib *cal)
{
    const sfi_policy_config *c = &e->o->cfg;
    int S = e->pre.n_queries < KASCADE_CALIB ? e->pre.n_queries : KASCADE_CALIB;
    if (S > e->L)
        S = e->L;
    int kk = c->kascade_calib_k, lo = e->L - S + 1;
    if (kk >= lo)
        kk = lo / 2 > 0 ? lo / 2 : 1;
    sfi_policy_calibrator *cb = NULL;
    sfi_status rc = sfi_policy_calibrator_create(kk, c->fasa_calib_k, sfi_policy_fasa_tip(c, e->hd),
                                                 e->nl, e->nh, e->nkv, e->hd, e->L, &cb, e->err);
    if (rc)
        return rc;
    sfi_policy_calibrator_begin(cb);
    size_t qd = (size_t)e->nh * e->hd;
    for (int s = 0; s < S && !rc; s++) {
        int qp = e->L - S + s;
        for (int l = 0; l < e->nl && !rc; l++)
            rc = sfi_policy_calibrator_add(
                cb, l, e->pre.qhist + ((size_t)l * e->pre.n_queries + (size_t)(qp % e->pre.n_queries)) * qd,
                sfi_kv_k(&e->pre.kv, l), qp + 1, e->err);
    }
    if (!rc)
        rc = sfi_policy_calibrator_finish(cb, "the evaluated prefix's last queries", cal, e->err);
    if (!rc)
        cal->leaks = 1;
    sfi_policy_calibrator_free(cb);
    return rc;
}

static sfi_status run_peer(ectx *e, sfi_policy_kind kind, int B, sfi_eval_row *row)
{
    pctx p;
    memset(&p, 0, sizeof p);
    p.e = e;
    p.budget = B;
    sfi_policy_calib own;
    memset(&own, 0, sizeof own);
    const sfi_policy_calib *cal = e->o->calib;
    sfi_status rc = SFI_OK;
    float *tail = NULL;
    if (kind == SFI_POLICY_KASCADE && !(cal && cal->has_kascade)) {
        if ((rc = standin_calib(e, &own)))
            goto out;
        cal = &own;
    }
    if ((rc = sfi_eval_policy_create(kind, &e->o->cfg, e->nl, e->nh, e->nkv, e->hd, e->cap, cal,
                                     &p.pol, e->err)))
        goto out;
    if (kind == SFI_POLICY_KASCADE)
        row->n_anchors = sfi_eval_policy_anchors(p.pol, row->anchors, 64);
    /* What the prompt showed each layer: its last queries (the prefix
     * keeps pre.n_queries) and its keys. */
    int nt = e->pre.n_queries < e->L ? e->pre.n_queries : e->L;
    tail = malloc(sizeof(float) * (size_t)nt * e->nh * e->hd);
    if (!tail) {
        rc = sfi_error_set(e->err, SFI_ENOMEM, "policy %s: out of memory",
                           sfi_policy_kind_name(kind));
        goto out;
    }
    for (int l = 0; l < e->nl && !rc; l++) {
        prompt_tail(e, l, nt, tail);
        sfi_policy_prompt pr = {.n_prompt = e->L, .n_tail = nt, .q_tail = tail,
                                .k = sfi_kv_k(&e->pre.kv, l), .budget = B};
        rc = sfi_eval_policy_prompt(p.pol, l, &pr, e->err);
    }
    if (!rc)
        rc = sfi_kv_cache_copy(&e->work, &e->pre.kv, e->err);
    for (int s = 1; s <= e->N && !rc; s++) {
        int32_t in = e->tok[e->L + s - 1];
        p.step = s;
        p.prev_trigger = e->o->is_trigger && in >= 0 && in < e->o->n_trigger_vocab &&
                         e->o->is_trigger[in];
        rc = sfi_qwen3_step(e->m, e->o->backend, &e->work, in, peer_attend, &p, e->logits,
                            e->err);
        if (!rc)
            score(e, s, e->logits);
    }
    if (!rc)
        row->proxy = sfi_eval_policy_proxy(p.pol);
out:
    sfi_eval_policy_free(p.pol);
    sfi_policy_calib_free(&own);
    free(tail);
    return rc;
}

/* ---------------------------------------------------------------- */

/* ---------------------------------------------------------------- */

static void ectx_free(ectx *e)
{
    sfi_decode_prefix_free(&e->pre);
    sfi_kv_cache_free(&e->work);
    free(e->full_lp);
    free(e->full_arg);
    free(e->full_nll);
    free(e->logits);
    free(e->lp);
    free(e->nll);
    free(e->kl);
    free(e->agree);
}

/* A worker's own buffers (the shared fields are the parent's, read only). */
static sfi_status worker_init(ectx *w, const ectx *parent, sfi_error *err)
{
    /* the prefix and full KV's reference stay shared: worker_free never
     * frees them */
    *w = *parent;
    memset(&w->work, 0, sizeof w->work);
    size_t N = (size_t)w->N, V = (size_t)w->V;
    w->logits = malloc(sizeof(float) * V);
    w->lp = malloc(sizeof(float) * V);
    w->nll = malloc(sizeof(double) * N);
    w->kl = malloc(sizeof(double) * N);
    w->agree = malloc(N);
    w->att_lg = malloc(sizeof(float) * (size_t)(w->nh / w->nkv) * (size_t)w->cap);
    w->sfi_sel = malloc(sizeof(int32_t) * (size_t)w->nl * w->nkv * (size_t)w->cap);
    w->sfi_nsel = calloc((size_t)w->nl * w->nkv, sizeof(int));
    w->err = err;
    if (!w->logits || !w->lp || !w->nll || !w->kl || !w->agree || !w->att_lg || !w->sfi_sel ||
        !w->sfi_nsel)
        return sfi_error_set(err, SFI_ENOMEM, "eval: out of memory");
    return sfi_kv_cache_init(&w->work, w->c, w->cap, err);
}

static void worker_free(ectx *w)
{
    sfi_kv_cache_free(&w->work);
    free(w->att_lg);
    free(w->sfi_sel);
    free(w->sfi_nsel);
    free(w->logits);
    free(w->lp);
    free(w->nll);
    free(w->kl);
    free(w->agree);
}

/* The jobs (budget, policy) shared by the workers. */
typedef struct {
    const ectx *e;          /* shared state: prefix, full KV's reference */
    const double *full_nll;
    sfi_eval_row *rows;
    int n_jobs, next;
    pthread_mutex_t mu;
    int failed;
    sfi_error err;
} jobs;

/* Runs one job and fills its row. */
static sfi_status run_job(ectx *w, const double *full_nll, double full_mean, sfi_eval_row *r,
                          double *delta)
{
    const sfi_eval_opts *o = w->o;
    w->attended = w->attend_den = 0;
    w->mass = w->mass_den = 0.0;
    w->n_slow = 0;
    double r0 = now_s(), rc0 = thread_cpu_s();
    sfi_status rc = sfi_policy_has_slow_steps(r->kind) ? run_sfi(w, r->kind, r->budget)
                                                       : run_peer(w, r->kind, r->budget, r);
    if (rc)
        return sfi_error_prefix(w->err, "%s at budget %g", sfi_policy_kind_name(r->kind),
                                r->share);
    r->seconds = now_s() - r0;
    r->cpu_seconds = thread_cpu_s() - rc0;
    double sn = 0.0, sk = 0.0, kmax = 0.0;
    int agree = 0;
    for (int t = 0; t < w->N; t++) {
        sn += w->nll[t];
        sk += w->kl[t];
        if (w->kl[t] > kmax)
            kmax = w->kl[t];
        agree += w->agree[t];
        delta[t] = w->nll[t] - full_nll[t];
    }
    r->nll = sn / w->N;
    r->ppl = (double)sfi_expf((float)r->nll);
    r->dnll = r->nll - full_mean;
    r->kl = sk / w->N;
    r->kl_max = kmax;
    r->top1 = (double)agree / w->N;
    r->retained = w->attend_den ? (double)w->attended / (double)w->attend_den : 1.0;
    r->mass = w->mass_den > 0.0 ? w->mass / w->mass_den : 1.0;
    r->slow_fraction = sfi_policy_has_slow_steps(r->kind) ? (double)w->n_slow / w->N : -1.0;
    return bootstrap(delta, w->N, o->n_boot, o->conf, o->seed, &r->dnll_lo, &r->dnll_hi,
                     w->err);
}

typedef struct {
    jobs *J;
    double full_mean;
} worker_arg;

static void *worker(void *arg)
{
    worker_arg *a = arg;
    jobs *J = a->J;
    sfi_error err;
    sfi_error_clear(&err);
    ectx w;
    double *delta = malloc(sizeof(double) * (size_t)J->e->N);
    sfi_status rc = worker_init(&w, J->e, &err);
    if (!rc && !delta)
        rc = sfi_error_set(&err, SFI_ENOMEM, "eval: out of memory");
    for (;;) {
        pthread_mutex_lock(&J->mu);
        if (rc && !J->failed) {
            J->failed = 1;
            J->err = err;
        }
        int i = J->failed || J->next >= J->n_jobs ? -1 : J->next++;
        pthread_mutex_unlock(&J->mu);
        if (i < 0)
            break;
        sfi_eval_row *r = &J->rows[i];
        rc = run_job(&w, J->full_nll, a->full_mean, r, delta);
        if (!rc && w.o->progress) {
            pthread_mutex_lock(&J->mu);
            fprintf(w.o->progress,
                    "eval: %-9s budget %5.1f%% (B %d): retained %.4f, mass %.4f, NLL %.4f "
                    "(%+.4f), KL %.5f, top-1 %.3f (%.1f s)\n",
                    sfi_policy_kind_name(r->kind), 100.0 * r->share, r->budget, r->retained,
                    r->mass, r->nll, r->dnll, r->kl, r->top1, r->seconds);
            fflush(w.o->progress);
            pthread_mutex_unlock(&J->mu);
        }
    }
    free(delta);
    worker_free(&w);
    return NULL;
}

/* The options, the model and the text agree with each other. */
static sfi_status eval_check(const sfi_model_config *c, const sfi_eval_opts *o,
                             const int32_t *tokens, int n_text, sfi_error *err)
{
    if (o->n_prefix < 1 || o->n_tokens < 1)
        return sfi_error_set(err, SFI_EINVAL, "eval: prefix %d and tokens %d must be >= 1",
                             o->n_prefix, o->n_tokens);
    if ((long)o->n_prefix + o->n_tokens + 1 > n_text)
        return sfi_error_set(err, SFI_ERANGE,
                             "eval: the text has %d tokens; a prefix of %d and %d scored "
                             "tokens need %ld",
                             n_text, o->n_prefix, o->n_tokens,
                             (long)o->n_prefix + o->n_tokens + 1);
    if ((long)o->n_prefix + o->n_tokens > c->max_position_embeddings)
        return sfi_error_set(err, SFI_ERANGE,
                             "eval: prefix %d + %d tokens exceeds the model's "
                             "max_position_embeddings %d",
                             o->n_prefix, o->n_tokens, c->max_position_embeddings);
    if (o->n_shares < 1 || o->n_shares > SFI_EVAL_MAX_BUDGETS)
        return sfi_error_set(err, SFI_EINVAL, "eval: %d budgets (1..%d)", o->n_shares,
                             SFI_EVAL_MAX_BUDGETS);
    for (int i = 0; i < o->n_shares; i++)
        if (!(o->shares[i] > 0.0 && o->shares[i] <= 1.0))
            return sfi_error_set(err, SFI_EINVAL, "eval: budget share %g outside (0, 1]",
                                 o->shares[i]);
    if (o->n_boot < 0 || !(o->conf > 0.0 && o->conf < 1.0))
        return sfi_error_set(err, SFI_EINVAL, "eval: bootstrap %d resamples at level %g",
                             o->n_boot, o->conf);
    if (o->n_threads < 0 || o->n_threads > SFI_EVAL_MAX_THREADS)
        return sfi_error_set(err, SFI_EINVAL, "eval: %d threads (0..%d)", o->n_threads,
                             SFI_EVAL_MAX_THREADS);
    if (c->num_key_value_heads > EVAL_MAX_KV_HEADS)
        return sfi_error_set(err, SFI_EUNSUPPORTED, "eval: %d KV heads (up to %d)",
                             c->num_key_value_heads, EVAL_MAX_KV_HEADS);
    sfi_status rc = sfi_params_validate(&o->cfg.prm, err);
    if (rc)
        return rc;
    for (int i = 0; i < o->n_prefix + o->n_tokens + 1; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return sfi_error_set(err, SFI_ERANGE,
                                 "eval: token %d (id %d) outside the vocabulary [0, %d)", i,
                                 (int)tokens[i], c->vocab_size);
    return SFI_OK;
}

/* The run's context and buffers, and res's rows (one per budget and
 * policy of mask). e is zeroed first, so ectx_free may follow a failure. */
static sfi_status eval_setup(ectx *e, const sfi_qwen3 *m, const sfi_eval_opts *o,
                             const int32_t *tokens, unsigned mask, sfi_eval_result *res,
                             sfi_error *err)
{
    const sfi_model_config *c = sfi_qwen3_config(m);
    memset(e, 0, sizeof *e);
    e->m = m;
    e->c = c;
    e->o = o;
    e->tok = tokens;
    e->L = o->n_prefix;
    e->N = o->n_tokens;
    e->V = c->vocab_size;
    e->nl = c->num_hidden_layers;
    e->nh = c->num_attention_heads;
    e->nkv = c->num_key_value_heads;
    e->hd = c->head_dim;
    e->cap = e->L + e->N;
    e->err = err;
    size_t N = (size_t)e->N, V = (size_t)e->V;
    e->full_lp = malloc(sizeof(float) * N * V);
    e->full_arg = malloc(sizeof(int32_t) * N);
    e->full_nll = malloc(sizeof(double) * N);
    e->logits = malloc(sizeof(float) * V);
    e->lp = malloc(sizeof(float) * V);
    e->nll = malloc(sizeof(double) * N);
    e->kl = malloc(sizeof(double) * N);
    e->agree = malloc(N);
    int n_kinds = 0;
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++)
        n_kinds += (mask >> k) & 1u;
    res->rows = calloc((size_t)o->n_shares * (n_kinds ? n_kinds : 1), sizeof *res->rows);
    if (!e->full_lp || !e->full_arg || !e->full_nll || !e->logits || !e->lp || !e->nll ||
        !e->kl || !e->agree || !res->rows)
        return sfi_error_set(err, SFI_ENOMEM, "eval: out of memory (%d tokens x vocabulary %d)",
                             e->N, e->V);
    res->n_prefix = e->L;
    res->n_tokens = e->N;
    return sfi_kv_cache_init(&e->work, c, e->cap, err);
}

/* The prefix, prefilled once, with the prompt's last queries the
 * policies observe: SFI's W_prefill, SnapKV's window, LFPS's s, the
 * Kascade stand-in's. */
static sfi_status eval_prefill(ectx *e, sfi_eval_result *res, sfi_error *err)
{
    const sfi_eval_opts *o = e->o;
    int nq = o->cfg.prm.W_prefill > o->cfg.prm.W_decode ? o->cfg.prm.W_prefill
                                                        : o->cfg.prm.W_decode;
    if (nq < KASCADE_CALIB)
        nq = KASCADE_CALIB;
    if (nq < o->cfg.snapkv_window)
        nq = o->cfg.snapkv_window;
    if (nq < o->cfg.lfps_s)
        nq = o->cfg.lfps_s;
    if (o->progress)
        fprintf(o->progress, "eval: prefilling %d tokens (%s backend)\n", e->L,
                sfi_backend_name(o->backend));
    sfi_status rc = sfi_decode_prefix_build(e->m, o->backend, e->tok, e->L, e->L, nq, &e->pre, err);
    if (rc)
        return rc;
    res->prefill_seconds = e->pre.seconds;
    res->prefill_cpu_seconds = e->pre.cpu_seconds;
    return SFI_OK;
}

/* The reference run (full KV) and its mean NLL and perplexity. */
static sfi_status eval_full(ectx *e, sfi_eval_result *res)
{
    const sfi_eval_opts *o = e->o;
    double ts = now_s();
    sfi_status rc = run_full(e);
    res->full_seconds = now_s() - ts;
    if (rc)
        return rc;
    double fs = 0.0;
    for (int t = 0; t < e->N; t++)
        fs += e->full_nll[t];
    res->full_nll = fs / e->N;
    res->full_ppl = (double)sfi_expf((float)res->full_nll);
    if (o->progress)
        fprintf(o->progress, "eval: prefill %.1f s; full KV: NLL %.4f, perplexity %.3f (%.1f s)\n",
                res->prefill_seconds, res->full_nll, res->full_ppl, res->full_seconds);
    return SFI_OK;
}

/* Every (budget, policy) row of mask, on up to *nt threads (lowered to
 * the rows' count). */
static sfi_status eval_rows(ectx *e, unsigned mask, int *nt, sfi_eval_result *res,
                            sfi_error *err)
{
    const sfi_eval_opts *o = e->o;
    jobs J;
    memset(&J, 0, sizeof J);
    J.e = e;
    J.full_nll = e->full_nll;
    J.rows = res->rows;
    for (int b = 0; b < o->n_shares; b++)
        for (int k = 0; k < SFI_POLICY_N_KINDS; k++)
            if ((mask >> k) & 1u) {
                sfi_eval_row *r = &res->rows[J.n_jobs++];
                r->kind = (sfi_policy_kind)k;
                r->share = o->shares[b];
                r->budget = sfi_eval_budget(o->shares[b], e->L, e->N);
            }
    if (*nt > J.n_jobs)
        *nt = J.n_jobs;
    pthread_mutex_init(&J.mu, NULL);
    worker_arg wa = {.J = &J, .full_mean = res->full_nll};
    pthread_t th[SFI_EVAL_MAX_THREADS];
    int started = 0;
    for (int i = 1; i < *nt; i++)
        if (!pthread_create(&th[started], NULL, worker, &wa))
            started++;
    worker(&wa);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&J.mu);
    if (J.failed) {
        if (err)
            *err = J.err;
        return J.err.code ? J.err.code : SFI_EINVAL;
    }
    res->n_rows = J.n_jobs;
    for (int i = 0; i < res->n_rows; i++)
        if (res->rows[i].kind == SFI_POLICY_KASCADE) {
            res->n_kascade_anchors = res->rows[i].n_anchors;
            memcpy(res->kascade_anchors, res->rows[i].anchors, sizeof res->kascade_anchors);
        }
    return SFI_OK;
}

sfi_status sfi_eval_run(const sfi_qwen3 *m, const sfi_eval_opts *o, const int32_t *tokens,
                        int n_text, sfi_eval_result *res, sfi_error *err)
{
    memset(res, 0, sizeof *res);
    sfi_status rc = eval_check(sfi_qwen3_config(m), o, tokens, n_text, err);
    if (rc)
        return rc;
    /* full KV is the reference every row is compared with, not a row */
    unsigned mask = o->policies & SFI_POLICY_ALL & ~(1u << SFI_POLICY_FULL);

    double t0 = now_s(), c0 = cpu_s();
    ectx e;
    if ((rc = eval_setup(&e, m, o, tokens, mask, res, err)) || (rc = eval_prefill(&e, res, err)))
        goto fail;
    /* Decode steps multiply single vectors: BLAS threads only wait on
     * each other there, so they run on one thread each and the runs
     * themselves go in parallel (sfi_eval_opts.n_threads). */
    int nt = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1)
        nt = 1;
    if (nt > SFI_EVAL_MAX_THREADS)
        nt = SFI_EVAL_MAX_THREADS;
#ifdef SFI_HAVE_OPENBLAS
    int blas_threads = openblas_get_num_threads();
    if (o->backend == SFI_BACKEND_BLAS)
        openblas_set_num_threads(1);
#endif
    rc = eval_full(&e, res);
    if (!rc)
        rc = eval_rows(&e, mask, &nt, res, err);
#ifdef SFI_HAVE_OPENBLAS
    openblas_set_num_threads(blas_threads);
#endif
    if (rc)
        goto fail;
    res->seconds = now_s() - t0;
    res->cpu_seconds = cpu_s() - c0;
    res->n_threads = nt;
    ectx_free(&e);
    return SFI_OK;
fail:
    ectx_free(&e);
    sfi_eval_result_free(res);
    return rc;
}
