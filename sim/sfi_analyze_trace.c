/* Full-level trace files as analyzer sources (see sfi_analyze_trace.h).
 * Everything is read once, up front, from the one SQLite connection; the
 * worker threads then only read memory. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_analyze_trace.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

/* Snapshots of one (request, layer): the keys and values of the request's
 * last step that has them (every earlier step's cache is a prefix: a
 * position's key never changes once written), [pos][kvh][d]; the prompt
 * observation: the first step's query snapshot when it holds W > 1
 * queries (the prompt's last W positions, the step's own last), and the
 * accumulated prompt attention ('a'). */
typedef struct {
    float *k, *v;
    int n_kv;             /* positions k/v hold */
    float *tail;          /* [n_tail][n_heads][d] */
    int n_tail;
    float *colsum;        /* [n_heads][n_prompt] */
    int n_prompt;
} req_snap;

struct sfi_analyze_trace {
    sfi_analyze_source src;
    int *seq_begin;
    int32_t *n_ctx;
    uint8_t *trigger;
    int M;                /* entries per record slot */
    int32_t *pos;         /* [step][layer][kvh][M] */
    float *prob;
    int32_t *n;           /* [step][layer][kvh] */
    float *tail;
    float **snap;         /* [step][layer] -> the step's query, or NULL */
    req_snap *rs;         /* [request][layer] */
    int *step_req;        /* [step] request index */
    sfi_policy_calib *calib;
    int Mq;               /* query-head records (0: the trace has KV-head ones) */
    int32_t *qpos;        /* [step][layer][qhead][Mq] */
    float *qprob;
    int32_t *qn;
    float *qtail;
    long n_snap;
};

const sfi_analyze_source *sfi_analyze_trace_source(const sfi_analyze_trace *t)
{
    return &t->src;
}

long sfi_analyze_trace_n_snapshots(const sfi_analyze_trace *t)
{
    return t->n_snap;
}

void sfi_analyze_trace_free(sfi_analyze_trace *t)
{
    if (!t)
        return;
    if (t->snap)
        for (size_t i = 0; i < (size_t)t->src.n_steps * t->src.n_layers; i++)
            free(t->snap[i]);
    free(t->snap);
    if (t->rs)
        for (size_t i = 0; i < (size_t)t->src.n_seq * t->src.n_layers; i++) {
            free(t->rs[i].k);
            free(t->rs[i].v);
            free(t->rs[i].tail);
            free(t->rs[i].colsum);
        }
    free(t->rs);
    free(t->step_req);
    if (t->calib)
        sfi_policy_calib_free(t->calib);
    free(t->calib);
    free(t->seq_begin);
    free(t->n_ctx);
    free(t->trigger);
    free(t->pos);
    free(t->prob);
    free(t->n);
    free(t->tail);
    free(t->qpos);
    free(t->qprob);
    free(t->qn);
    free(t->qtail);
    free(t);
}

static int tr_get(void *ctx, int step, int layer, int kvh, sfi_policy_obs *o, int32_t *pb,
                  float *qb, sfi_error *err)
{
    (void)pb;
    (void)qb;
    (void)err;
    const sfi_analyze_trace *t = ctx;
    size_t i = ((size_t)step * t->src.n_layers + layer) * t->src.n_kv_heads + kvh;
    o->n_ctx = t->n_ctx[step];
    o->n_top = t->n[i];
    o->pos = t->pos + i * t->M;
    o->prob = t->prob + i * t->M;
    o->tail = t->tail[i];
    return 0;
}

static int tr_get_q(void *ctx, int step, int layer, int qh, sfi_policy_obs *o, int32_t *pb,
                    float *qb, sfi_error *err)
{
    (void)pb;
    (void)qb;
    (void)err;
    const sfi_analyze_trace *t = ctx;
    size_t i = ((size_t)step * t->src.n_layers + layer) * t->src.n_heads + qh;
    o->n_ctx = t->n_ctx[step];
    o->n_top = t->qn[i];
    o->pos = t->qpos + i * t->Mq;
    o->prob = t->qprob + i * t->Mq;
    o->tail = t->qtail[i];
    return 0;
}

static int tr_snap(void *ctx, int step, int layer, const float **q, const float **k,
                   const float **v)
{
    const sfi_analyze_trace *t = ctx;
    const float *b = t->snap[(size_t)step * t->src.n_layers + layer];
    const req_snap *r = &t->rs[(size_t)t->step_req[step] * t->src.n_layers + layer];
    if (!b || !r->k || r->n_kv < t->n_ctx[step])
        return 0;
    *q = b;
    *k = r->k;
    *v = r->v && r->n_kv >= t->n_ctx[step] ? r->v : NULL;
    return 1;
}

static int tr_prompt(void *ctx, int seq, int layer, sfi_policy_prompt *pr)
{
    const sfi_analyze_trace *t = ctx;
    const req_snap *r = &t->rs[(size_t)seq * t->src.n_layers + layer];
    int n_prompt = t->n_ctx[t->seq_begin[seq]];
    if (!r->k || r->n_tail < 2 || r->n_kv < n_prompt)
        return 0;
    memset(pr, 0, sizeof *pr);
    pr->n_prompt = n_prompt;
    pr->n_tail = r->n_tail;
    pr->q_tail = r->tail;
    pr->k = r->k;
    pr->colsum = r->colsum && r->n_prompt == n_prompt ? r->colsum : NULL;
    return 1;
}

const sfi_policy_calib *sfi_analyze_trace_calib(const sfi_analyze_trace *t)
{
    return t->calib;
}

/* Sorts entries by probability descending, ties to the smaller position
 * (insertion sort: recorder output is already in order). */
static void sort_entries(int32_t *pos, float *prob, int n)
{
    for (int i = 1; i < n; i++) {
        float pv = prob[i];
        int32_t pp = pos[i];
        int j = i - 1;
        while (j >= 0 && (prob[j] < pv || (prob[j] == pv && pos[j] > pp))) {
            prob[j + 1] = prob[j];
            pos[j + 1] = pos[j];
            j--;
        }
        prob[j + 1] = pv;
        pos[j + 1] = pp;
    }
}

/* Reads one snapshot matrix, checking its width; SFI_ENOTFOUND passes
 * through. */
static sfi_status read_mat(sfi_trace *tr, const char *path, int64_t req, int64_t step, int layer,
                           char kind, int cols, float **out, int32_t *rows, sfi_error *err)
{
    int32_t c;
    sfi_status s = sfi_trace_read_snapshot(tr, req, step, layer, kind, out, rows, &c, err);
    if (s)
        return s;
    if (c != cols || *rows < 1) {
        free(*out);
        *out = NULL;
        return sfi_error_set(err, SFI_EFORMAT, "%s: request %lld step %lld layer %d: '%c' "
                             "snapshot is %dx%d, expected %d columns", path, (long long)req,
                             (long long)step, layer, kind, *rows, c, cols);
    }
    return SFI_OK;
}

/* Keys/values of (request r, layer): the last step that has them. */
static sfi_status load_kv(sfi_trace *tr, const char *path, int64_t req, const sfi_trace_steps *st,
                          int layer, const sfi_trace_meta *m, req_snap *rs, sfi_error *err)
{
    int H = m->n_kv_heads, d = m->head_dim;
    for (int64_t i = st->n - 1; i >= 0; i--) {
        float *k = NULL, *v = NULL;
        int32_t r = 0, rv = 0;
        sfi_status s = read_mat(tr, path, req, i, layer, 'k', d, &k, &r, err);
        if (s == SFI_ENOTFOUND)
            continue;
        if (s)
            return s;
        int n = st->ctx_len[i];
        if (r != H * n) {
            free(k);
            return sfi_error_set(err, SFI_EFORMAT, "%s: request %lld step %lld layer %d: key "
                                 "snapshot has %d rows, expected %d (KV heads x context %d)",
                                 path, (long long)req, (long long)i, layer, r, H * n, n);
        }
        s = read_mat(tr, path, req, i, layer, 'v', d, &v, &rv, err);
        if (s && s != SFI_ENOTFOUND) {
            free(k);
            return s;
        }
        if (v && rv != r) {
            free(k);
            free(v);
            return sfi_error_set(err, SFI_EFORMAT, "%s: request %lld step %lld layer %d: value "
                                 "snapshot has %d rows, the keys %d", path, (long long)req,
                                 (long long)i, layer, rv, r);
        }
        rs->k = malloc(sizeof(float) * (size_t)r * d);
        rs->v = v ? malloc(sizeof(float) * (size_t)r * d) : NULL;
        if (!rs->k || (v && !rs->v)) {
            free(k);
            free(v);
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for snapshots", path);
        }
        /* head-major [kvh][pos][d] in the file, [pos][kvh][d] for ref/ */
        for (int h = 0; h < H; h++)
            for (int j = 0; j < n; j++) {
                memcpy(rs->k + ((size_t)j * H + h) * d, k + ((size_t)h * n + j) * d,
                       sizeof(float) * d);
                if (v)
                    memcpy(rs->v + ((size_t)j * H + h) * d, v + ((size_t)h * n + j) * d,
                           sizeof(float) * d);
            }
        rs->n_kv = n;
        free(k);
        free(v);
        return SFI_OK;
    }
    return SFI_OK;
}

/* Every step's query of (request, layer), and the prompt observation of
 * the request's first step. */
static sfi_status load_queries(sfi_analyze_trace *t, sfi_trace *tr, const char *path,
                               int64_t req, int r, const sfi_trace_steps *st, int layer,
                               const sfi_trace_meta *m, sfi_error *err)
{
    int L = m->n_layers, nh = m->n_heads, d = m->head_dim;
    req_snap *rs = &t->rs[(size_t)r * L + layer];
    for (int64_t i = 0; i < st->n; i++) {
        float *q = NULL;
        int32_t rows = 0;
        sfi_status s = read_mat(tr, path, req, i, layer, 'q', d, &q, &rows, err);
        if (s == SFI_ENOTFOUND)
            continue;
        if (s)
            return s;
        if (rows % nh || (i > 0 && rows != nh)) {
            free(q);
            return sfi_error_set(err, SFI_EFORMAT, "%s: request %lld step %lld layer %d: query "
                                 "snapshot has %d rows, expected %d%s", path, (long long)req,
                                 (long long)i, layer, rows, nh,
                                 i == 0 ? " or a multiple (prompt tail)" : "");
        }
        int g = t->seq_begin[r] + (int)i;
        size_t qn = (size_t)nh * d;
        float *own = malloc(sizeof(float) * qn);
        if (!own) {
            free(q);
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for snapshots", path);
        }
        memcpy(own, q + (size_t)(rows - nh) * d, sizeof(float) * qn);
        t->snap[(size_t)g * L + layer] = own;
        t->n_snap++;
        if (i == 0 && rows > nh) {
            rs->tail = q;
            rs->n_tail = rows / nh;
        } else {
            free(q);
        }
    }
    if (rs->n_tail > 0) {
        float *a = NULL;
        int32_t rows = 0, cols;
        sfi_status s = sfi_trace_read_snapshot(tr, req, 0, layer, 'a', &a, &rows, &cols, err);
        if (s == SFI_OK) {
            if (rows != nh || cols != st->ctx_len[0]) {
                free(a);
                return sfi_error_set(err, SFI_EFORMAT, "%s: request %lld layer %d: prompt "
                                     "attention snapshot is %dx%d, expected %dx%d", path,
                                     (long long)req, layer, rows, cols, nh, st->ctx_len[0]);
            }
            rs->colsum = a;
            rs->n_prompt = cols;
        } else if (s != SFI_ENOTFOUND) {
            return s;
        }
    }
    return SFI_OK;
}

/* sfi_analyze_trace_open's phases and what they share; open_free releases
 * it whichever phase failed. */
typedef struct {
    const char *path;
    sfi_trace *tr;
    const sfi_trace_meta *m;
    sfi_analyze_trace *t;
    int r0, nr;              /* the requests analyzed: r0 .. r0 + nr - 1 */
    sfi_trace_steps *steps;  /* [nr] */
    int64_t total;           /* their decode steps */
    int L, H, G, pooled, M;  /* layers, KV heads, query heads per KV head */
    size_t nrec, nqrec;      /* KV-head and (pooled) query-head records */
    int max_ctx;
    uint8_t *reason;         /* [total] the recorded step reasons */
    int32_t *token;          /* [total] the generated tokens */
    int32_t *tmp_pos;        /* [top_m] one query head's record */
    float *tmp_prob;
    float *acc;              /* [max_ctx + 1] pooling over a group (pooled) */
    int *seen;               /* [max_ctx + 1] stamp of acc's positions */
    int stamp;
} open_ctx;

static void open_free(open_ctx *c)
{
    if (c->steps)
        for (int r = 0; r < c->nr; r++)
            sfi_trace_steps_free(&c->steps[r]);
    free(c->steps);
    free(c->tmp_pos);
    free(c->tmp_prob);
    free(c->acc);
    free(c->seen);
    free(c->reason);
    free(c->token);
    sfi_analyze_trace_free(c->t);
    sfi_trace_close(c->tr);
}

/* What analysis needs beyond `sfi-sim trace check`: the full level with
 * every layer's top-M records, and a model shape to index them by. */
static sfi_status check_full(open_ctx *c, sfi_error *err)
{
    const sfi_trace_meta *m = c->m;
    const char *path = c->path;
    if (m->level != SFI_TRACE_FULL || sfi_trace_n_topm(c->tr) == 0)
        return sfi_error_set(err, SFI_EUNSUPPORTED, "%s: trace level is '%s' with %lld attention "
                             "records; the analyzer needs a full-level trace (record with "
                             "--trace-level full)", path, sfi_trace_level_name(m->level),
                             (long long)sfi_trace_n_topm(c->tr));
    char *layers = NULL;
    if (sfi_trace_get_meta_value(c->tr, "topm_layers", &layers, NULL) == SFI_OK &&
        strcmp(layers, "all")) {
        sfi_status s = sfi_error_set(err, SFI_EUNSUPPORTED, "%s: top-M records of layers %.200s "
                                     "only (recorded with --trace-layers); the analyzer needs "
                                     "every layer: record again without --trace-layers", path,
                                     layers);
        free(layers);
        return s;
    }
    free(layers);
    if (m->n_layers < 1 || m->n_kv_heads < 1 || m->n_heads < m->n_kv_heads ||
        m->n_heads % m->n_kv_heads || m->top_m < 1)
        return sfi_error_set(err, SFI_EFORMAT, "%s: bad model shape in meta (%d layers, %d "
                             "heads, %d KV heads, top_m %d)", path, m->n_layers, m->n_heads,
                             m->n_kv_heads, m->top_m);
    return SFI_OK;
}

/* The steps of the requests analyzed (request, or all when < 0), and where
 * each request's steps begin in the concatenation. */
static sfi_status read_steps(open_ctx *c, int request, sfi_error *err)
{
    sfi_analyze_trace *t = c->t;
    int64_t n_req = sfi_trace_n_requests(c->tr);
    if (request >= n_req || n_req < 1)
        return sfi_error_set(err, SFI_EINVAL, "%s: request %d asked for, the trace has %lld",
                             c->path, request, (long long)n_req);
    c->r0 = request >= 0 ? request : 0;
    c->nr = request >= 0 ? 1 : (int)n_req;
    c->steps = calloc((size_t)c->nr, sizeof *c->steps);
    t->seq_begin = malloc(sizeof(int) * (size_t)(c->nr + 1));
    if (!c->steps || !t->seq_begin)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", c->path);
    sfi_status s;
    c->total = 0;
    for (int r = 0; r < c->nr; r++) {
        if ((s = sfi_trace_read_steps(c->tr, c->r0 + r, &c->steps[r], err)))
            return s;
        t->seq_begin[r] = (int)c->total;
        c->total += c->steps[r].n;
    }
    t->seq_begin[c->nr] = (int)c->total;
    if (c->total < 1 || c->total > (1 << 24))
        return sfi_error_set(err, SFI_EINVAL, "%s: %lld decode steps to analyze (need 1..%d)",
                             c->path, (long long)c->total, 1 << 24);
    return SFI_OK;
}

/* The record arrays of every step x layer x head, refused above 8 GB. */
static sfi_status alloc_records(open_ctx *c, sfi_error *err)
{
    const sfi_trace_meta *m = c->m;
    sfi_analyze_trace *t = c->t;
    const char *path = c->path;
    c->L = m->n_layers;
    c->H = m->n_kv_heads;
    c->G = m->n_heads / m->n_kv_heads;
    c->pooled = m->topm_heads == SFI_TRACE_HEADS_QUERY;
    c->M = c->pooled ? m->top_m * c->G : m->top_m;
    c->nrec = (size_t)c->total * c->L * c->H;
    c->nqrec = c->pooled ? (size_t)c->total * c->L * m->n_heads : 0;
    size_t nrec = c->nrec, nqrec = c->nqrec;
    int M = c->M;
    if (((double)nrec * M + (double)nqrec * m->top_m) * 8.0 > 8e9)
        return sfi_error_set(err, SFI_ERANGE, "%s: %zu records of %d entries would need %.1f "
                             "GB; analyze one request at a time (--request)", path, nrec, M,
                             (double)nrec * M * 8.0 / 1e9);
    t->M = M;
    t->n_ctx = malloc(sizeof(int32_t) * (size_t)c->total);
    t->trigger = calloc((size_t)c->total, 1);
    c->reason = malloc((size_t)c->total);
    c->token = malloc(sizeof(int32_t) * (size_t)c->total);
    t->pos = malloc(sizeof(int32_t) * nrec * M);
    t->prob = malloc(sizeof(float) * nrec * M);
    t->n = malloc(sizeof(int32_t) * nrec);
    t->tail = malloc(sizeof(float) * nrec);
    if (c->pooled) {
        t->Mq = m->top_m;
        t->qpos = malloc(sizeof(int32_t) * nqrec * t->Mq);
        t->qprob = malloc(sizeof(float) * nqrec * t->Mq);
        t->qn = malloc(sizeof(int32_t) * nqrec);
        t->qtail = malloc(sizeof(float) * nqrec);
        if (!t->qpos || !t->qprob || !t->qn || !t->qtail)
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for %zu records", path,
                                 nqrec);
    }
    c->tmp_pos = malloc(sizeof(int32_t) * (size_t)m->top_m);
    c->tmp_prob = malloc(sizeof(float) * (size_t)m->top_m);
    if (!t->n_ctx || !t->trigger || !c->reason || !c->token || !t->pos || !t->prob || !t->n ||
        !t->tail || !c->tmp_pos || !c->tmp_prob)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for %zu records", path, nrec);
    return SFI_OK;
}

/* Every step's context, reason and token in one sequence; the pooling
 * scratch sized by the longest context. */
static sfi_status gather_steps(open_ctx *c, sfi_error *err)
{
    sfi_analyze_trace *t = c->t;
    c->max_ctx = 1;
    for (int r = 0; r < c->nr; r++)
        for (int64_t i = 0; i < c->steps[r].n; i++) {
            int g = t->seq_begin[r] + (int)i;
            t->n_ctx[g] = c->steps[r].ctx_len[i];
            c->reason[g] = c->steps[r].reason[i];
            c->token[g] = c->steps[r].token[i];
            if (t->n_ctx[g] > c->max_ctx)
                c->max_ctx = t->n_ctx[g];
        }
    if (c->pooled) {
        c->acc = malloc(sizeof(float) * ((size_t)c->max_ctx + 1));
        c->seen = malloc(sizeof(int) * ((size_t)c->max_ctx + 1));
        if (!c->acc || !c->seen)
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", c->path);
        for (int j = 0; j <= c->max_ctx; j++)
            c->seen[j] = -1;
    }
    c->stamp = 0;
    return SFI_OK;
}

/* The record of step i of request r (sequence step g), layer l, KV head
 * h: read as is, or pooled over the group's query-head records (their mean
 * per position), which are kept sorted for the policies that read them.
 * Positions must lie inside the step's context. */
static sfi_status read_record(open_ctx *c, int r, int64_t i, int g, int l, int h,
                              sfi_error *err)
{
    sfi_analyze_trace *t = c->t;
    const sfi_trace_meta *m = c->m;
    int pooled = c->pooled, G = c->G;
    size_t ri = ((size_t)g * c->L + l) * c->H + h;
    int32_t *P = t->pos + ri * c->M;
    float *Q = t->prob + ri * c->M;
    int n = 0;
    float tail = 0.0f;
    for (int qh = 0; qh < (pooled ? G : 1); qh++) {
        int head = pooled ? h * G + qh : h;
        int32_t mm = 0;
        float tl = 0.0f;
        size_t qi = ((size_t)g * c->L + l) * m->n_heads + head;
        sfi_status s = sfi_trace_read_topm(c->tr, c->r0 + r, i, l, head,
                                           pooled ? t->qpos + qi * t->Mq : P,
                                           pooled ? t->qprob + qi * t->Mq : Q, &mm, &tl, err);
        if (s == SFI_OK && pooled) {
            memcpy(c->tmp_pos, t->qpos + qi * t->Mq, sizeof(int32_t) * (size_t)mm);
            memcpy(c->tmp_prob, t->qprob + qi * t->Mq, sizeof(float) * (size_t)mm);
            sort_entries(t->qpos + qi * t->Mq, t->qprob + qi * t->Mq, mm);
            t->qn[qi] = mm;
            t->qtail[qi] = tl < 0.0f ? 0.0f : tl;
        }
        if (s == SFI_ENOTFOUND)
            s = sfi_error_set(err, SFI_EFORMAT, "%s: request %d step %lld layer %d head %d: no "
                              "top-M record (the analyzer needs every step x layer x head)",
                              c->path, c->r0 + r, (long long)i, l, head);
        if (s)
            return s;
        for (int e = 0; e < mm; e++) {
            int32_t p = pooled ? c->tmp_pos[e] : P[e];
            if (p < 0 || p >= t->n_ctx[g])
                return sfi_error_set(err, SFI_EFORMAT, "%s: request %d step %lld layer %d head "
                                     "%d: position %d outside the context of %d", c->path,
                                     c->r0 + r, (long long)i, l, head, (int)p, (int)t->n_ctx[g]);
        }
        if (!pooled) {
            n = mm;
            tail = tl;
            continue;
        }
        /* pool: mean over the group's query heads */
        if (qh == 0)
            c->stamp++;
        for (int e = 0; e < mm; e++) {
            int32_t p = c->tmp_pos[e];
            if (c->seen[p] != c->stamp) {
                c->seen[p] = c->stamp;
                c->acc[p] = 0.0f;
                P[n++] = p;
            }
            c->acc[p] += c->tmp_prob[e] / (float)G;
        }
        tail += tl / (float)G;
    }
    if (pooled)
        for (int e = 0; e < n; e++)
            Q[e] = c->acc[P[e]];
    sort_entries(P, Q, n);
    t->n[ri] = n;
    t->tail[ri] = tail < 0.0f ? 0.0f : tail;
    return SFI_OK;
}

static sfi_status read_records(open_ctx *c, sfi_error *err)
{
    sfi_status s;
    for (int r = 0; r < c->nr; r++)
        for (int64_t i = 0; i < c->steps[r].n; i++) {
            int g = c->t->seq_begin[r] + (int)i;
            for (int l = 0; l < c->L; l++)
                for (int h = 0; h < c->H; h++)
                    if ((s = read_record(c, r, i, g, l, h, err)))
                        return s;
        }
    return SFI_OK;
}

/* Sentence boundaries: the trigger set of vocab_dir's vocabulary, else the
 * recorded reasons of a policy whose reasons mark them. */
static sfi_status mark_triggers(open_ctx *c, const char *vocab_dir, const char *trigger_chars,
                                sfi_error *err)
{
    sfi_analyze_trace *t = c->t;
    const char *path = c->path;
    if (!vocab_dir) {
        const char *pol = c->m->policy ? c->m->policy : "";
        if (strcmp(pol, "sfi") && strcmp(pol, "boundary"))
            return sfi_error_set(err, SFI_EINVAL, "%s: recorded under trigger policy '%s', "
                                 "whose step reasons do not mark sentence ends; pass --vocab "
                                 "DIR (the model's tokenizer directory)", path, pol);
        for (int r = 0; r < c->nr; r++)
            for (int g = t->seq_begin[r]; g + 1 < t->seq_begin[r + 1]; g++)
                t->trigger[g] = c->reason[g + 1] == SFI_REASON_TRIGGER;
        return SFI_OK;
    }
    sfi_vocab *voc = NULL;
    sfi_trigger_set ts = {0};
    sfi_status s = sfi_vocab_load(vocab_dir, &voc, err);
    if (!s) {
        if (sfi_trace_tokenizer_matches(c->m->tokenizer, vocab_dir) == 0)
            fprintf(stderr, "sfi-sim analyze: note: %s/vocab.json is not the vocabulary %s was "
                    "recorded with (meta tokenizer: %.160s); sentence ends are taken from %s "
                    "all the same\n", vocab_dir, path, c->m->tokenizer, vocab_dir);
        s = sfi_trigger_set_build(voc, trigger_chars, &ts, err);
    }
    if (!s)
        for (int64_t g = 0; g < c->total; g++)
            t->trigger[g] =
                c->token[g] >= 0 && c->token[g] < ts.n_vocab && ts.is_trigger[c->token[g]];
    sfi_trigger_set_free(&ts);
    sfi_vocab_free(voc);
    return s;
}

/* Each step's request, and the q/K/V snapshots when the trace has any. */
static sfi_status load_snapshots(open_ctx *c, sfi_error *err)
{
    sfi_analyze_trace *t = c->t;
    const sfi_trace_meta *m = c->m;
    int L = c->L, nr = c->nr;
    t->src.n_layers = L;
    t->src.n_kv_heads = c->H;
    t->src.n_steps = (int)c->total;
    t->src.n_seq = nr;
    t->step_req = malloc(sizeof(int) * (size_t)c->total);
    t->rs = calloc((size_t)nr * L, sizeof *t->rs);
    if (!t->step_req || !t->rs)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", c->path);
    for (int r = 0; r < nr; r++)
        for (int g = t->seq_begin[r]; g < t->seq_begin[r + 1]; g++)
            t->step_req[g] = r;
    if (sfi_trace_n_snapshots(c->tr) <= 0 || m->head_dim <= 0)
        return SFI_OK;
    t->snap = calloc((size_t)c->total * L, sizeof(float *));
    if (!t->snap)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", c->path);
    sfi_status s;
    for (int r = 0; r < nr; r++)
        for (int l = 0; l < L; l++)
            if ((s = load_kv(c->tr, c->path, c->r0 + r, &c->steps[r], l, m,
                             &t->rs[(size_t)r * L + l], err)) ||
                (s = load_queries(t, c->tr, c->path, c->r0 + r, r, &c->steps[r], l, m, err)))
                return s;
    return SFI_OK;
}

/* The Kascade/FASA calibration recorded with the trace, if any. */
static sfi_status load_calib(open_ctx *c, sfi_error *err)
{
    sfi_analyze_trace *t = c->t;
    char *cj = NULL;
    sfi_status s = sfi_trace_get_meta_value(c->tr, "peer_calibration", &cj, err);
    if (s == SFI_ENOTFOUND)
        return SFI_OK;
    if (s)
        return s;
    t->calib = calloc(1, sizeof *t->calib);
    s = t->calib ? sfi_policy_calib_from_json(cj, c->path, t->calib, err)
                 : sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", c->path);
    free(cj);
    if (s) {
        sfi_error_prefix(err, "meta peer_calibration");
        free(t->calib);
        t->calib = NULL;
    }
    return s;
}

/* The analyzer's view of it all (sfi_analyze_source). */
static void fill_source(open_ctx *c)
{
    sfi_analyze_trace *t = c->t;
    t->src.n_heads = c->m->n_heads;
    t->src.head_dim = t->n_snap ? c->m->head_dim : 0;
    t->src.seq_begin = t->seq_begin;
    t->src.n_ctx = t->n_ctx;
    t->src.trigger = t->trigger;
    t->src.max_ctx = c->max_ctx;
    t->src.max_top = c->M;
    t->src.get = tr_get;
    t->src.snapshot = t->n_snap ? tr_snap : NULL;
    for (size_t i = 0; i < (size_t)c->nr * c->L && t->rs; i++)
        if (t->rs[i].n_tail > 1 && t->rs[i].k)
            t->src.prompt = tr_prompt;
    if (c->pooled) {
        t->src.get_q = tr_get_q;
        t->src.q_per_kv = c->G;
        t->src.max_top_q = t->Mq;
    }
    t->src.ctx = t;
}

sfi_status sfi_analyze_trace_open(const char *path, const char *vocab_dir,
                                  const char *trigger_chars, int request,
                                  sfi_analyze_trace **out, sfi_error *err)
{
    *out = NULL;
    open_ctx c = {.path = path};
    sfi_status s = sfi_trace_open(path, &c.tr, err);
    if (s)
        return s;
    /* The analyzer accepts exactly what `sfi-sim trace check` accepts: one
     * validator, then only what analysis adds (level, every record). */
    if ((s = sfi_trace_check(c.tr, err))) {
        sfi_trace_close(c.tr);
        return s;
    }
    c.m = sfi_trace_get_meta(c.tr);
    if (!(c.t = calloc(1, sizeof *c.t)))
        s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    if (!s)
        s = check_full(&c, err);
    if (!s)
        s = read_steps(&c, request, err);
    if (!s)
        s = alloc_records(&c, err);
    if (!s)
        s = gather_steps(&c, err);
    if (!s)
        s = read_records(&c, err);
    if (!s)
        s = mark_triggers(&c, vocab_dir, trigger_chars, err);
    if (!s)
        s = load_snapshots(&c, err);
    if (!s)
        s = load_calib(&c, err);
    if (!s) {
        fill_source(&c);
        *out = c.t;
        c.t = NULL;
    }
    open_free(&c);
    return s;
}
