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

sfi_status sfi_analyze_trace_open(const char *path, const char *vocab_dir,
                                  const char *trigger_chars, int request,
                                  sfi_analyze_trace **out, sfi_error *err)
{
    *out = NULL;
    sfi_trace *tr = NULL;
    sfi_status s = sfi_trace_open(path, &tr, err);
    if (s)
        return s;
    /* The analyzer accepts exactly what `sfi-sim trace check` accepts: one
     * validator, then only what analysis adds (level, every record). */
    if ((s = sfi_trace_check(tr, err))) {
        sfi_trace_close(tr);
        return s;
    }
    const sfi_trace_meta *m = sfi_trace_get_meta(tr);
    sfi_analyze_trace *t = calloc(1, sizeof *t);
    sfi_trace_steps *steps = NULL;
    sfi_vocab *voc = NULL;
    sfi_trigger_set ts = {0};
    int32_t *tmp_pos = NULL;
    float *tmp_prob = NULL, *acc = NULL;
    int *seen = NULL;
    uint8_t *reason = NULL;
    int32_t *token = NULL;
    if (!t) {
        s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (m->level != SFI_TRACE_FULL || sfi_trace_n_topm(tr) == 0) {
        s = sfi_error_set(err, SFI_EUNSUPPORTED, "%s: trace level is '%s' with %lld attention "
                          "records; the analyzer needs a full-level trace (record with "
                          "--trace-level full)", path, sfi_trace_level_name(m->level),
                          (long long)sfi_trace_n_topm(tr));
        goto fail;
    }
    char *layers = NULL;
    if (sfi_trace_get_meta_value(tr, "topm_layers", &layers, NULL) == SFI_OK &&
        strcmp(layers, "all")) {
        s = sfi_error_set(err, SFI_EUNSUPPORTED, "%s: top-M records of layers %.200s only "
                          "(recorded with --trace-layers); the analyzer needs every layer: "
                          "record again without --trace-layers", path, layers);
        free(layers);
        goto fail;
    }
    free(layers);
    if (m->n_layers < 1 || m->n_kv_heads < 1 || m->n_heads < m->n_kv_heads ||
        m->n_heads % m->n_kv_heads || m->top_m < 1) {
        s = sfi_error_set(err, SFI_EFORMAT, "%s: bad model shape in meta (%d layers, %d heads, "
                          "%d KV heads, top_m %d)", path, m->n_layers, m->n_heads, m->n_kv_heads,
                          m->top_m);
        goto fail;
    }
    int64_t n_req = sfi_trace_n_requests(tr);
    if (request >= n_req || n_req < 1) {
        s = sfi_error_set(err, SFI_EINVAL, "%s: request %d asked for, the trace has %lld",
                          path, request, (long long)n_req);
        goto fail;
    }
    int r0 = request >= 0 ? request : 0, r1 = request >= 0 ? request + 1 : (int)n_req;
    int nr = r1 - r0;
    steps = calloc((size_t)nr, sizeof *steps);
    t->seq_begin = malloc(sizeof(int) * (size_t)(nr + 1));
    if (!steps || !t->seq_begin) {
        s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    int64_t total = 0;
    for (int r = r0; r < r1; r++) {
        if ((s = sfi_trace_read_steps(tr, r, &steps[r - r0], err)))
            goto fail;
        t->seq_begin[r - r0] = (int)total;
        total += steps[r - r0].n;
    }
    t->seq_begin[nr] = (int)total;
    if (total < 1 || total > (1 << 24)) {
        s = sfi_error_set(err, SFI_EINVAL, "%s: %lld decode steps to analyze (need 1..%d)", path,
                          (long long)total, 1 << 24);
        goto fail;
    }
    int L = m->n_layers, H = m->n_kv_heads, G = m->n_heads / m->n_kv_heads;
    int pooled = m->topm_heads == SFI_TRACE_HEADS_QUERY;
    int M = pooled ? m->top_m * G : m->top_m;
    size_t nrec = (size_t)total * L * H;
    size_t nqrec = pooled ? (size_t)total * L * m->n_heads : 0;
    if (((double)nrec * M + (double)nqrec * m->top_m) * 8.0 > 8e9) {
        s = sfi_error_set(err, SFI_ERANGE, "%s: %zu records of %d entries would need %.1f GB; "
                          "analyze one request at a time (--request)", path, nrec, M,
                          (double)nrec * M * 8.0 / 1e9);
        goto fail;
    }
    t->M = M;
    t->n_ctx = malloc(sizeof(int32_t) * (size_t)total);
    t->trigger = calloc((size_t)total, 1);
    reason = malloc((size_t)total);
    token = malloc(sizeof(int32_t) * (size_t)total);
    t->pos = malloc(sizeof(int32_t) * nrec * M);
    t->prob = malloc(sizeof(float) * nrec * M);
    t->n = malloc(sizeof(int32_t) * nrec);
    t->tail = malloc(sizeof(float) * nrec);
    if (pooled) {
        t->Mq = m->top_m;
        t->qpos = malloc(sizeof(int32_t) * nqrec * t->Mq);
        t->qprob = malloc(sizeof(float) * nqrec * t->Mq);
        t->qn = malloc(sizeof(int32_t) * nqrec);
        t->qtail = malloc(sizeof(float) * nqrec);
        if (!t->qpos || !t->qprob || !t->qn || !t->qtail) {
            s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for %zu records", path, nqrec);
            goto fail;
        }
    }
    tmp_pos = malloc(sizeof(int32_t) * (size_t)m->top_m);
    tmp_prob = malloc(sizeof(float) * (size_t)m->top_m);
    if (!t->n_ctx || !t->trigger || !reason || !token || !t->pos || !t->prob || !t->n ||
        !t->tail || !tmp_pos || !tmp_prob) {
        s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for %zu records", path, nrec);
        goto fail;
    }
    int max_ctx = 1;
    for (int r = 0; r < nr; r++)
        for (int64_t i = 0; i < steps[r].n; i++) {
            int g = t->seq_begin[r] + (int)i;
            t->n_ctx[g] = steps[r].ctx_len[i];
            reason[g] = steps[r].reason[i];
            token[g] = steps[r].token[i];
            if (t->n_ctx[g] > max_ctx)
                max_ctx = t->n_ctx[g];
        }
    if (pooled) {
        acc = malloc(sizeof(float) * ((size_t)max_ctx + 1));
        seen = malloc(sizeof(int) * ((size_t)max_ctx + 1));
        if (!acc || !seen) {
            s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        for (int j = 0; j <= max_ctx; j++)
            seen[j] = -1;
    }
    int stamp = 0;
    for (int r = 0; r < nr; r++)
        for (int64_t i = 0; i < steps[r].n; i++) {
            int g = t->seq_begin[r] + (int)i;
            for (int l = 0; l < L; l++)
                for (int h = 0; h < H; h++) {
                    size_t ri = ((size_t)g * L + l) * H + h;
                    int32_t *P = t->pos + ri * M;
                    float *Q = t->prob + ri * M;
                    int n = 0;
                    float tail = 0.0f;
                    for (int qh = 0; qh < (pooled ? G : 1); qh++) {
                        int head = pooled ? h * G + qh : h;
                        int32_t mm = 0;
                        float tl = 0.0f;
                        size_t qi = ((size_t)g * L + l) * m->n_heads + head;
                        s = sfi_trace_read_topm(tr, r0 + r, i, l, head,
                                                pooled ? t->qpos + qi * t->Mq : P,
                                                pooled ? t->qprob + qi * t->Mq : Q, &mm, &tl, err);
                        if (s == SFI_OK && pooled) {
                            memcpy(tmp_pos, t->qpos + qi * t->Mq, sizeof(int32_t) * (size_t)mm);
                            memcpy(tmp_prob, t->qprob + qi * t->Mq, sizeof(float) * (size_t)mm);
                            sort_entries(t->qpos + qi * t->Mq, t->qprob + qi * t->Mq, mm);
                            t->qn[qi] = mm;
                            t->qtail[qi] = tl < 0.0f ? 0.0f : tl;
                        }
                        if (s == SFI_ENOTFOUND)
                            s = sfi_error_set(err, SFI_EFORMAT, "%s: request %d step %lld "
                                              "layer %d head %d: no top-M record (the analyzer "
                                              "needs every step x layer x head)", path, r0 + r,
                                              (long long)i, l, head);
                        if (s)
                            goto fail;
                        for (int e = 0; e < mm; e++) {
                            int32_t p = pooled ? tmp_pos[e] : P[e];
                            if (p < 0 || p >= t->n_ctx[g]) {
                                s = sfi_error_set(err, SFI_EFORMAT, "%s: request %d step %lld "
                                                  "layer %d head %d: position %d outside the "
                                                  "context of %d", path, r0 + r, (long long)i,
                                                  l, head, (int)p, (int)t->n_ctx[g]);
                                goto fail;
                            }
                        }
                        if (!pooled) {
                            n = mm;
                            tail = tl;
                            continue;
                        }
                        /* pool: mean over the group's query heads */
                        if (qh == 0)
                            stamp++;
                        for (int e = 0; e < mm; e++) {
                            int32_t p = tmp_pos[e];
                            if (seen[p] != stamp) {
                                seen[p] = stamp;
                                acc[p] = 0.0f;
                                P[n++] = p;
                            }
                            acc[p] += tmp_prob[e] / (float)G;
                        }
                        tail += tl / (float)G;
                    }
                    if (pooled)
                        for (int e = 0; e < n; e++)
                            Q[e] = acc[P[e]];
                    sort_entries(P, Q, n);
                    t->n[ri] = n;
                    t->tail[ri] = tail < 0.0f ? 0.0f : tail;
                }
        }
    /* Sentence boundaries. */
    if (vocab_dir) {
        if ((s = sfi_vocab_load(vocab_dir, &voc, err)))
            goto fail;
        if (sfi_trace_tokenizer_matches(m->tokenizer, vocab_dir) == 0)
            fprintf(stderr, "sfi-sim analyze: note: %s/vocab.json is not the vocabulary %s was "
                    "recorded with (meta tokenizer: %.160s); sentence ends are taken from %s "
                    "all the same\n", vocab_dir, path, m->tokenizer, vocab_dir);
        if ((s = sfi_trigger_set_build(voc, trigger_chars, &ts, err)))
            goto fail;
        for (int64_t g = 0; g < total; g++)
            t->trigger[g] = token[g] >= 0 && token[g] < ts.n_vocab && ts.is_trigger[token[g]];
    } else {
        const char *pol = m->policy ? m->policy : "";
        if (strcmp(pol, "sfi") && strcmp(pol, "boundary")) {
            s = sfi_error_set(err, SFI_EINVAL, "%s: recorded under trigger policy '%s', whose "
                              "step reasons do not mark sentence ends; pass --vocab DIR (the "
                              "model's tokenizer directory)", path, pol);
            goto fail;
        }
        for (int r = 0; r < nr; r++)
            for (int g = t->seq_begin[r]; g + 1 < t->seq_begin[r + 1]; g++)
                t->trigger[g] = reason[g + 1] == SFI_REASON_TRIGGER;
    }
    /* Snapshots, when the trace has any. */
    t->src.n_layers = L;
    t->src.n_kv_heads = H;
    t->src.n_steps = (int)total;
    t->src.n_seq = nr;
    t->step_req = malloc(sizeof(int) * (size_t)total);
    t->rs = calloc((size_t)nr * L, sizeof *t->rs);
    if (!t->step_req || !t->rs) {
        s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (int r = 0; r < nr; r++)
        for (int g = t->seq_begin[r]; g < t->seq_begin[r + 1]; g++)
            t->step_req[g] = r;
    if (sfi_trace_n_snapshots(tr) > 0 && m->head_dim > 0) {
        t->snap = calloc((size_t)total * L, sizeof(float *));
        if (!t->snap) {
            s = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        for (int r = 0; r < nr; r++)
            for (int l = 0; l < L; l++) {
                if ((s = load_kv(tr, path, r0 + r, &steps[r], l, m, &t->rs[(size_t)r * L + l],
                                 err)) ||
                    (s = load_queries(t, tr, path, r0 + r, r, &steps[r], l, m, err)))
                    goto fail;
            }
    }
    /* Kascade/FASA calibration recorded with the trace. */
    {
        char *cj = NULL;
        s = sfi_trace_get_meta_value(tr, "peer_calibration", &cj, err);
        if (s == SFI_OK) {
            t->calib = calloc(1, sizeof *t->calib);
            s = t->calib ? sfi_policy_calib_from_json(cj, path, t->calib, err)
                         : sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
            free(cj);
            if (s) {
                sfi_error_prefix(err, "meta peer_calibration");
                free(t->calib);
                t->calib = NULL;
                goto fail;
            }
        } else if (s != SFI_ENOTFOUND) {
            goto fail;
        }
        s = SFI_OK;
    }
    t->src.n_heads = m->n_heads;
    t->src.head_dim = t->n_snap ? m->head_dim : 0;
    t->src.seq_begin = t->seq_begin;
    t->src.n_ctx = t->n_ctx;
    t->src.trigger = t->trigger;
    t->src.max_ctx = max_ctx;
    t->src.max_top = M;
    t->src.get = tr_get;
    t->src.snapshot = t->n_snap ? tr_snap : NULL;
    for (size_t i = 0; i < (size_t)nr * L && t->rs; i++)
        if (t->rs[i].n_tail > 1 && t->rs[i].k)
            t->src.prompt = tr_prompt;
    if (pooled) {
        t->src.get_q = tr_get_q;
        t->src.q_per_kv = G;
        t->src.max_top_q = t->Mq;
    }
    t->src.ctx = t;
    s = SFI_OK;
    *out = t;
    t = NULL;
fail:
    if (steps)
        for (int r = 0; r < (request >= 0 ? 1 : (int)sfi_trace_n_requests(tr)); r++)
            sfi_trace_steps_free(&steps[r]);
    free(steps);
    free(tmp_pos);
    free(tmp_prob);
    free(acc);
    free(seen);
    free(reason);
    free(token);
    sfi_trigger_set_free(&ts);
    sfi_vocab_free(voc);
    sfi_analyze_trace_free(t);
    sfi_trace_close(tr);
    return s;
}
