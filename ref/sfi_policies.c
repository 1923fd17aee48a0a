/* Comparison policies of sfi(7) PEER METHODS (see sfi_policies.h for what
 * each does with a budget and what it sees of a trace). */
#include <config.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_policies.h"
#include "sfi_math.h"
#include "sfi_selector.h"
#include "sfi_state.h"

static const char *const kind_names[SFI_PEER_N_KINDS] = {
    "oracle", "full", "streaming", "h2o", "snapkv", "quest", "lfps", "kascade", "fasa", "sfi",
};

const char *sfi_peer_kind_name(sfi_peer_kind k)
{
    return (unsigned)k < SFI_PEER_N_KINDS ? kind_names[k] : "?";
}

sfi_status sfi_peer_kind_parse(const char *name, sfi_peer_kind *k, sfi_error *err)
{
    for (int i = 0; i < SFI_PEER_N_KINDS; i++)
        if (!strcmp(name, kind_names[i])) {
            *k = (sfi_peer_kind)i;
            return SFI_OK;
        }
    return sfi_error_set(err, SFI_EINVAL,
                         "unknown policy '%s' (known: oracle, full, streaming, h2o, snapkv, "
                         "quest, lfps, kascade, fasa, sfi, all)", name);
}

sfi_status sfi_peer_set_parse_list(const char *list, unsigned *mask, sfi_error *err)
{
    unsigned m = 0;
    const char *p = list;
    if (!*p)
        return sfi_error_set(err, SFI_EINVAL, "empty policy list");
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char name[32];
        if (n == 0 || n >= sizeof name)
            return sfi_error_set(err, SFI_EINVAL, "bad policy list '%s'", list);
        memcpy(name, p, n);
        name[n] = 0;
        if (!strcmp(name, "all")) {
            m |= (1u << SFI_PEER_N_KINDS) - 1;
        } else {
            sfi_peer_kind k = SFI_PEER_ORACLE;
            sfi_status s = sfi_peer_kind_parse(name, &k, err);
            if (s)
                return s;
            m |= 1u << k;
        }
        p += n;
        if (*p == ',')
            p++;
    }
    *mask = m;
    return SFI_OK;
}

int sfi_peer_kind_needs_snapshot(sfi_peer_kind k)
{
    return k == SFI_PEER_FASA;
}

void sfi_peer_config_default(sfi_peer_config *c)
{
    memset(c, 0, sizeof *c);
    sfi_params_default(&c->prm);
    c->h2o_recent_frac = 0.5f;
    c->snapkv_pool = 3;
    c->quest_page = 16;
    c->lfps_r = 0.95f;
    c->lfps_a = 0.2f;
    c->lfps_sink_share = 0.85f;
    c->lfps_prune = 1e-7f;
    c->kascade_anchors = 4;
    c->fasa_tip = 16;
    c->fasa_calib_k = 64;
}

static int parse_f(const char *v, float lo, float hi, float *out)
{
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end || !(d >= lo && d <= hi))
        return -1;
    *out = (float)d;
    return 0;
}

static int parse_i(const char *v, long lo, long hi, int *out)
{
    char *end;
    long d = strtol(v, &end, 10);
    if (end == v || *end || d < lo || d > hi)
        return -1;
    *out = (int)d;
    return 0;
}

sfi_status sfi_peer_config_set(sfi_peer_config *c, const char *kv, sfi_error *err)
{
    const char *eq = strchr(kv, '=');
    if (!eq)
        return sfi_error_set(err, SFI_EINVAL, "--param '%s': expected key=value", kv);
    size_t n = (size_t)(eq - kv);
    const char *v = eq + 1;
    struct {
        const char *key;
        int is_int;
        void *dst;
        double lo, hi;
    } keys[] = {
        {"h2o_recent_frac", 0, &c->h2o_recent_frac, 0.0, 1.0},
        {"snapkv_pool", 1, &c->snapkv_pool, 0, 64},
        {"quest_page", 1, &c->quest_page, 1, 4096},
        {"lfps_r", 0, &c->lfps_r, 0.0, 1.0},
        {"lfps_a", 0, &c->lfps_a, 0.0, 1e6},
        {"lfps_sink_share", 0, &c->lfps_sink_share, 0.0, 1.0},
        {"lfps_prune", 0, &c->lfps_prune, 0.0, 1.0},
        {"kascade_anchors", 1, &c->kascade_anchors, 1, 4096},
        {"fasa_tip", 1, &c->fasa_tip, 1, 4096},
        {"fasa_calib_k", 1, &c->fasa_calib_k, 1, 1 << 20},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strlen(keys[i].key) != n || strncmp(kv, keys[i].key, n))
            continue;
        int bad = keys[i].is_int ? parse_i(v, (long)keys[i].lo, (long)keys[i].hi, keys[i].dst)
                                 : parse_f(v, (float)keys[i].lo, (float)keys[i].hi, keys[i].dst);
        if (bad)
            return sfi_error_set(err, SFI_EINVAL, "--param %s: bad value '%s' (range %g..%g)",
                                 keys[i].key, v, keys[i].lo, keys[i].hi);
        return SFI_OK;
    }
    return sfi_params_set(&c->prm, kv, "--param", err);
}

double sfi_peer_set_recall(const sfi_peer_set *s, const sfi_peer_obs *o, int top_k,
                           double *lo, int *n_in, int *n_in_top)
{
    double mass = 0.0;
    int in = 0, in_top = 0;
    for (int i = 0; i < o->n_top; i++)
        if (sfi_peer_set_contains(s, o->pos[i])) {
            mass += o->prob[i];
            in++;
            if (i < top_k)
                in_top++;
        }
    double r = mass;
    int rest = o->n_ctx - o->n_top;
    int outside = s->size - in;
    if (rest > 0 && outside > 0)
        r += (double)o->tail * (outside > rest ? rest : outside) / rest;
    if (lo)
        *lo = mass;
    if (n_in)
        *n_in = in;
    if (n_in_top)
        *n_in_top = in_top;
    return r;
}

/* ---------------------------------------------------------------- */
/* Kascade planning                                                  */

double sfi_peer_kascade_dp(const double *sim, int L, int A, int *anchors)
{
    if (A > L)
        A = L;
    if (A < 1)
        A = 1;
    /* seg(a, e) = sum_{b=a}^{e-1} sim[a][b], sim[a][a] = 1. */
    double *dp = malloc(sizeof(double) * (size_t)(A + 1) * (size_t)(L + 1));
    int *arg = malloc(sizeof(int) * (size_t)(A + 1) * (size_t)(L + 1));
    double *pre = malloc(sizeof(double) * (size_t)L * (size_t)(L + 1));
    if (!dp || !arg || !pre) {
        free(dp);
        free(arg);
        free(pre);
        return -1.0;
    }
    for (int a = 0; a < L; a++) {
        double acc = 0.0;
        for (int e = 0; e <= L; e++) {
            pre[(size_t)a * (L + 1) + e] = acc;  /* sum over b in [a, e) */
            if (e >= a && e < L)
                acc += e == a ? 1.0 : sim[(size_t)a * L + e];
        }
    }
#define DP(k, e) dp[(size_t)(k) * (L + 1) + (e)]
#define ARG(k, e) arg[(size_t)(k) * (L + 1) + (e)]
#define SEG(a, e) (pre[(size_t)(a) * (L + 1) + (e)] - pre[(size_t)(a) * (L + 1) + (a)])
    for (int k = 0; k <= A; k++)
        for (int e = 0; e <= L; e++) {
            DP(k, e) = -1e300;
            ARG(k, e) = -1;
        }
    for (int e = 1; e <= L; e++)
        DP(1, e) = SEG(0, e), ARG(1, e) = 0;
    for (int k = 2; k <= A; k++)
        for (int e = k; e <= L; e++)
            for (int a = k - 1; a < e; a++) {
                double v = DP(k - 1, a) + SEG(a, e);
                if (DP(k - 1, a) > -1e299 && v > DP(k, e) + 1e-12) {
                    DP(k, e) = v;
                    ARG(k, e) = a;
                }
            }
    double best = DP(A, L);
    int e = L;
    for (int k = A; k >= 1; k--) {
        int a = ARG(k, e);
        anchors[k - 1] = a;
        e = a;
    }
#undef DP
#undef ARG
#undef SEG
    free(dp);
    free(arg);
    free(pre);
    return best;
}

void sfi_peer_kascade_plan_free(sfi_peer_kascade_plan *plan)
{
    if (!plan)
        return;
    free(plan->is_anchor);
    free(plan->src_layer);
    free(plan->src_head);
    memset(plan, 0, sizeof *plan);
}

sfi_status sfi_peer_kascade_plan_build(const sfi_peer_obs *calib, int S, int L, int H,
                                       int top_k, int n_anchors,
                                       sfi_peer_kascade_plan *plan, sfi_error *err)
{
    memset(plan, 0, sizeof *plan);
    if (S < 1 || L < 1 || H < 1 || top_k < 1)
        return sfi_error_set(err, SFI_EINVAL, "kascade: needs at least one calibration step");
    int max_pos = 0;
    for (size_t i = 0; i < (size_t)S * L * H; i++)
        if (calib[i].n_ctx > max_pos)
            max_pos = calib[i].n_ctx;
    /* simh[(a*L+b)*H*H + g*H + h]: min over steps of the recovered fraction. */
    size_t nsim = (size_t)L * L * H * H;
    double *simh = malloc(sizeof(double) * nsim);
    int *stamp = malloc(sizeof(int) * (size_t)(max_pos + 1));
    double *sim = malloc(sizeof(double) * (size_t)L * L);
    int *anchors = malloc(sizeof(int) * (size_t)L);
    plan->is_anchor = calloc((size_t)L, 1);
    plan->src_layer = malloc(sizeof(int) * (size_t)L);
    plan->src_head = malloc(sizeof(int) * (size_t)L * H);
    if (!simh || !stamp || !sim || !anchors || !plan->is_anchor || !plan->src_layer ||
        !plan->src_head) {
        free(simh);
        free(stamp);
        free(sim);
        free(anchors);
        sfi_peer_kascade_plan_free(plan);
        return sfi_error_set(err, SFI_ENOMEM, "kascade: out of memory");
    }
    plan->n_layers = L;
    plan->n_kv_heads = H;
    for (size_t i = 0; i < nsim; i++)
        simh[i] = 1.0;
    for (int i = 0; i <= max_pos; i++)
        stamp[i] = -1;
    int id = 0;
    for (int s = 0; s < S; s++)
        for (int a = 0; a < L; a++)
            for (int g = 0; g < H; g++, id++) {
                const sfi_peer_obs *oa = &calib[((size_t)s * L + a) * H + g];
                int ka = oa->n_top < top_k ? oa->n_top : top_k;
                for (int i = 0; i < ka; i++)
                    stamp[oa->pos[i]] = id;
                for (int b = a + 1; b < L; b++)
                    for (int h = 0; h < H; h++) {
                        const sfi_peer_obs *ob = &calib[((size_t)s * L + b) * H + h];
                        int kb = ob->n_top < top_k ? ob->n_top : top_k;
                        double own = 0.0, got = 0.0;
                        for (int i = 0; i < ob->n_top; i++) {
                            if (i < kb)
                                own += ob->prob[i];
                            if (ob->pos[i] <= max_pos && stamp[ob->pos[i]] == id)
                                got += ob->prob[i];
                        }
                        double f = own > 0.0 ? got / own : 1.0;
                        if (f > 1.0)
                            f = 1.0;
                        double *d = &simh[((size_t)a * L + b) * H * H + (size_t)g * H + h];
                        if (f < *d)
                            *d = f;
                    }
            }
    /* Layer similarity and head map per (anchor, reuse) pair. */
    for (int a = 0; a < L; a++)
        for (int b = 0; b < L; b++) {
            double tot = 0.0;
            if (b <= a) {
                sim[(size_t)a * L + b] = b == a ? 1.0 : 0.0;
                continue;
            }
            for (int h = 0; h < H; h++) {
                double best = -1.0;
                for (int g = 0; g < H; g++) {
                    double v = simh[((size_t)a * L + b) * H * H + (size_t)g * H + h];
                    if (v > best)
                        best = v;
                }
                tot += best;
            }
            sim[(size_t)a * L + b] = tot / H;
        }
    int A = n_anchors < L ? n_anchors : L;
    plan->score = sfi_peer_kascade_dp(sim, L, A, anchors);
    for (int k = 0; k < A; k++)
        plan->is_anchor[anchors[k]] = 1;
    int cur = 0;
    for (int b = 0; b < L; b++) {
        if (plan->is_anchor[b])
            cur = b;
        plan->src_layer[b] = cur;
        for (int h = 0; h < H; h++) {
            int bg = h;
            if (cur != b) {
                double best = -1.0;
                for (int g = 0; g < H; g++) {
                    double v = simh[((size_t)cur * L + b) * H * H + (size_t)g * H + h];
                    if (v > best)
                        best = v, bg = g;
                }
            }
            plan->src_head[(size_t)b * H + h] = bg;
        }
    }
    free(simh);
    free(stamp);
    free(sim);
    free(anchors);
    return SFI_OK;
}

/* ---------------------------------------------------------------- */
/* Quest and FASA kernels on snapshots                                */

void sfi_peer_quest_scores(const float *q, const float *k, int n_ctx, int n_heads,
                           int n_kv_heads, int d, int kvh, int page, float *scores)
{
    int G = n_heads / n_kv_heads;
    int n_pages = (n_ctx + page - 1) / page;
    float mn[d > 0 ? d : 1], mx[d > 0 ? d : 1];
    for (int pg = 0; pg < n_pages; pg++) {
        int j0 = pg * page, j1 = j0 + page < n_ctx ? j0 + page : n_ctx;
        for (int x = 0; x < d; x++)
            mn[x] = mx[x] = k[((size_t)j0 * n_kv_heads + kvh) * d + x];
        for (int j = j0 + 1; j < j1; j++) {
            const float *kr = &k[((size_t)j * n_kv_heads + kvh) * d];
            for (int x = 0; x < d; x++) {
                if (kr[x] < mn[x])
                    mn[x] = kr[x];
                if (kr[x] > mx[x])
                    mx[x] = kr[x];
            }
        }
        float best = 0.0f;
        for (int g = 0; g < G; g++) {
            const float *qh = &q[(size_t)(kvh * G + g) * d];
            float s = 0.0f;
            for (int x = 0; x < d; x++) {
                float a = qh[x] * mn[x], b = qh[x] * mx[x];
                s += a > b ? a : b;
            }
            if (g == 0 || s > best)
                best = s;
        }
        scores[pg] = best;
    }
}

/* Sum over the group's query heads of the dot product restricted to the
 * chunks in tip (all chunks when tip is NULL). */
static void fasa_scores(const float *q, const float *k, int n_ctx, int n_heads, int n_kv,
                        int d, int kvh, const int *tip, int n_tip, float *out)
{
    int G = n_heads / n_kv, half = d / 2;
    for (int j = 0; j < n_ctx; j++) {
        const float *kr = &k[((size_t)j * n_kv + kvh) * d];
        float s = 0.0f;
        for (int g = 0; g < G; g++) {
            const float *qh = &q[(size_t)(kvh * G + g) * d];
            for (int t = 0; t < n_tip; t++) {
                int c = tip ? tip[t] : t;
                s += qh[c] * kr[c] + qh[c + half] * kr[c + half];
            }
        }
        out[j] = s;
    }
}

/* Indices of the top k of v[0..n) (ties to the smaller index), ascending,
 * through a partial selection on a copy; O(n log n) worst case. */
typedef struct {
    float v;
    int32_t i;
} vi;

static int cmp_vi_desc(const void *a, const void *b)
{
    const vi *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static sfi_status topk_idx(const float *v, int n, int k, int32_t *out, sfi_error *err)
{
    vi *t = malloc(sizeof(vi) * (size_t)(n > 0 ? n : 1));
    if (!t)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        t[i].v = v[i], t[i].i = i;
    qsort(t, (size_t)n, sizeof *t, cmp_vi_desc);
    if (k > n)
        k = n;
    for (int i = 0; i < k; i++)
        out[i] = t[i].i;
    qsort(out, (size_t)k, sizeof *out, cmp_i32);
    free(t);
    return SFI_OK;
}

sfi_status sfi_peer_fasa_calibrate(const float *q, const float *k, int n_ctx, int n_heads,
                                   int n_kv, int d, int kvh, int top_k, int n_tip, int *tip,
                                   sfi_error *err)
{
    int half = d / 2;
    if (d < 2 || d % 2 || n_tip < 1 || n_tip > half || n_ctx < 1 || n_heads % n_kv)
        return sfi_error_set(err, SFI_EINVAL,
                             "fasa: bad shape (head_dim %d, n_tip %d, n_ctx %d)", d, n_tip, n_ctx);
    if (top_k > n_ctx)
        top_k = n_ctx;
    float *sc = malloc(sizeof(float) * (size_t)n_ctx);
    int32_t *full = malloc(sizeof(int32_t) * (size_t)top_k);
    int32_t *one = malloc(sizeof(int32_t) * (size_t)top_k);
    uint8_t *mark = calloc((size_t)n_ctx, 1);
    float *agree = malloc(sizeof(float) * (size_t)half);
    sfi_status st = SFI_OK;
    if (!sc || !full || !one || !mark || !agree) {
        st = sfi_error_set(err, SFI_ENOMEM, "fasa: out of memory");
        goto out;
    }
    fasa_scores(q, k, n_ctx, n_heads, n_kv, d, kvh, NULL, half, sc);
    if ((st = topk_idx(sc, n_ctx, top_k, full, err)))
        goto out;
    for (int i = 0; i < top_k; i++)
        mark[full[i]] = 1;
    for (int c = 0; c < half; c++) {
        int cc = c;
        fasa_scores(q, k, n_ctx, n_heads, n_kv, d, kvh, &cc, 1, sc);
        if ((st = topk_idx(sc, n_ctx, top_k, one, err)))
            goto out;
        int ov = 0;
        for (int i = 0; i < top_k; i++)
            ov += mark[one[i]];
        agree[c] = (float)ov;
    }
    int32_t *pick = malloc(sizeof(int32_t) * (size_t)n_tip);
    if (!pick) {
        st = sfi_error_set(err, SFI_ENOMEM, "fasa: out of memory");
        goto out;
    }
    if ((st = topk_idx(agree, half, n_tip, pick, err)) == SFI_OK)
        for (int i = 0; i < n_tip; i++)
            tip[i] = pick[i];
    free(pick);
out:
    free(sc);
    free(full);
    free(one);
    free(mark);
    free(agree);
    return st;
}

/* ---------------------------------------------------------------- */
/* Policy instances                                                   */

/* Per KV head state; each kind uses what it needs. */
typedef struct {
    uint64_t *bits;       /* membership bitmap over positions */
    int32_t *marked;      /* positions currently set in bits */
    int n_marked;
    /* H2O */
    double *score;
    int32_t *heap;        /* kept heavy positions, min-heap on (score, pos) */
    int32_t *heap_at;     /* position -> heap index or -1 */
    int heap_n;
    int rb;               /* recent_begin of the last step */
    /* SnapKV */
    int32_t *ranking;
    int n_ranking;
    int k_cur;
    /* LFPS */
    double *ver, *sla;
    int32_t *act_v, *act_s;
    int n_act_v, n_act_s;
    uint8_t *in_v, *in_s;
    int32_t *stamp;
    float *pm;            /* the step's entry probabilities by position */
    int32_t *pm_stamp;
    int32_t *cand;
    int mean_v;
    /* FASA */
    int *tip;
    int calibrated;
    /* SFI */
    int32_t *sel;
    int n_sel;
} head_state;

struct sfi_peer {
    sfi_peer_kind kind;
    sfi_peer_config cfg;
    int layer, n_layers, H, n_heads, head_dim, max_ctx;
    const sfi_peer_kascade_plan *plan;
    head_state *hs;
    int started;
    int stamp_id;
    size_t words;
    /* scratch */
    float *fbuf;
    vi *vbuf;
    int32_t *ibuf;
    /* SFI */
    sfi_trigger_policy tp;
    float *logits, *norms;
    size_t logits_cap;    /* floats in logits */
};

sfi_peer_kind sfi_peer_get_kind(const sfi_peer *p)
{
    return p->kind;
}

double sfi_peer_lfps_table(const sfi_peer *p, int kvh, int which, int idx)
{
    if (p->kind != SFI_PEER_LFPS || kvh < 0 || kvh >= p->H || idx < 0 || idx > p->max_ctx)
        return 0.0;
    return which ? p->hs[kvh].sla[idx] : p->hs[kvh].ver[idx];
}

static void head_free(head_state *h)
{
    free(h->bits);
    free(h->marked);
    free(h->score);
    free(h->heap);
    free(h->heap_at);
    free(h->ranking);
    free(h->ver);
    free(h->sla);
    free(h->act_v);
    free(h->act_s);
    free(h->in_v);
    free(h->in_s);
    free(h->stamp);
    free(h->pm);
    free(h->pm_stamp);
    free(h->cand);
    free(h->tip);
    free(h->sel);
}

void sfi_peer_free(sfi_peer *p)
{
    if (!p)
        return;
    if (p->hs)
        for (int h = 0; h < p->H; h++)
            head_free(&p->hs[h]);
    free(p->hs);
    free(p->fbuf);
    free(p->vbuf);
    free(p->ibuf);
    free(p->logits);
    free(p->norms);
    free(p);
}

sfi_status sfi_peer_create(sfi_peer_kind kind, const sfi_peer_config *cfg, int layer,
                           int n_layers, int n_kv_heads, int n_heads, int head_dim,
                           int max_ctx, const sfi_peer_kascade_plan *plan, sfi_peer **out,
                           sfi_error *err)
{
    *out = NULL;
    if ((unsigned)kind >= SFI_PEER_N_KINDS)
        return sfi_error_set(err, SFI_EINVAL, "policy: bad kind %d", (int)kind);
    if (n_kv_heads < 1 || max_ctx < 1 || layer < 0 || layer >= n_layers)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: bad shape (layer %d of %d, %d KV heads, "
                             "max context %d)", kind_names[kind], layer, n_layers, n_kv_heads,
                             max_ctx);
    if (kind == SFI_PEER_KASCADE && (!plan || plan->n_layers != n_layers ||
                                     plan->n_kv_heads != n_kv_heads))
        return sfi_error_set(err, SFI_EINVAL, "policy kascade: needs a plan for %d layers x %d "
                             "KV heads", n_layers, n_kv_heads);
    if (kind == SFI_PEER_FASA && head_dim > 0 && cfg->fasa_tip > head_dim / 2)
        return sfi_error_set(err, SFI_EINVAL, "policy fasa: fasa_tip %d exceeds head_dim/2 = %d",
                             cfg->fasa_tip, head_dim / 2);
    sfi_peer *p = calloc(1, sizeof *p);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    p->kind = kind;
    p->cfg = *cfg;
    p->layer = layer;
    p->n_layers = n_layers;
    p->H = n_kv_heads;
    p->n_heads = n_heads;
    p->head_dim = head_dim;
    p->max_ctx = max_ctx;
    p->plan = plan;
    p->words = ((size_t)max_ctx + 64) / 64;
    size_t N = (size_t)max_ctx + 1;
    p->hs = calloc((size_t)n_kv_heads, sizeof *p->hs);
    p->fbuf = malloc(sizeof(float) * N);
    p->vbuf = malloc(sizeof(vi) * N);
    p->ibuf = malloc(sizeof(int32_t) * N);
    int ok = p->hs && p->fbuf && p->vbuf && p->ibuf;
    for (int h = 0; ok && h < n_kv_heads; h++) {
        head_state *s = &p->hs[h];
        s->bits = calloc(p->words, sizeof(uint64_t));
        s->marked = malloc(sizeof(int32_t) * N);
        ok = s->bits && s->marked;
        switch (kind) {
        case SFI_PEER_H2O:
            s->score = calloc(N, sizeof(double));
            s->heap = malloc(sizeof(int32_t) * N);
            s->heap_at = malloc(sizeof(int32_t) * N);
            ok = ok && s->score && s->heap && s->heap_at;
            break;
        case SFI_PEER_SNAPKV:
            s->ranking = malloc(sizeof(int32_t) * N);
            ok = ok && s->ranking;
            break;
        case SFI_PEER_LFPS:
            s->ver = calloc(N, sizeof(double));
            s->sla = calloc(N, sizeof(double));
            s->act_v = malloc(sizeof(int32_t) * N);
            s->act_s = malloc(sizeof(int32_t) * N);
            s->in_v = calloc(N, 1);
            s->in_s = calloc(N, 1);
            s->stamp = malloc(sizeof(int32_t) * N);
            s->pm = malloc(sizeof(float) * N);
            s->pm_stamp = malloc(sizeof(int32_t) * N);
            s->cand = malloc(sizeof(int32_t) * N);
            ok = ok && s->ver && s->sla && s->act_v && s->act_s && s->in_v && s->in_s &&
                 s->stamp && s->pm && s->pm_stamp && s->cand;
            break;
        case SFI_PEER_FASA:
            s->tip = malloc(sizeof(int) * (size_t)(cfg->fasa_tip > 0 ? cfg->fasa_tip : 1));
            ok = ok && s->tip;
            break;
        case SFI_PEER_SFI:
            s->sel = malloc(sizeof(int32_t) * N);
            ok = ok && s->sel;
            break;
        default:
            break;
        }
    }
    if (ok && kind == SFI_PEER_SFI) {
        p->logits = malloc(sizeof(float) * N * (size_t)n_kv_heads);
        p->logits_cap = N * (size_t)n_kv_heads;
        p->norms = malloc(sizeof(float) * N * (size_t)n_kv_heads);
        ok = p->logits && p->norms;
    }
    if (!ok) {
        sfi_peer_free(p);
        return sfi_error_set(err, SFI_ENOMEM, "policy %s: out of memory for %d positions",
                             kind_names[kind], max_ctx);
    }
    sfi_peer_reset(p);
    *out = p;
    return SFI_OK;
}

static inline void bit_set(uint64_t *b, int32_t i)
{
    b[i >> 6] |= (uint64_t)1 << (i & 63);
}

static inline void bit_clr(uint64_t *b, int32_t i)
{
    b[i >> 6] &= ~((uint64_t)1 << (i & 63));
}

static inline int bit_get(const uint64_t *b, int32_t i)
{
    return (int)((b[i >> 6] >> (i & 63)) & 1u);
}

/* Clears the marked bits (O(marked)). */
static void unmark_all(head_state *s)
{
    for (int i = 0; i < s->n_marked; i++)
        bit_clr(s->bits, s->marked[i]);
    s->n_marked = 0;
}

static inline void mark(head_state *s, int32_t pos)
{
    if (!bit_get(s->bits, pos)) {
        bit_set(s->bits, pos);
        s->marked[s->n_marked++] = pos;
    }
}

void sfi_peer_reset(sfi_peer *p)
{
    p->started = 0;
    for (int h = 0; h < p->H; h++) {
        head_state *s = &p->hs[h];
        memset(s->bits, 0, p->words * sizeof(uint64_t));
        s->n_marked = 0;
        s->heap_n = 0;
        s->rb = 0;
        s->n_ranking = 0;
        s->k_cur = 0;
        s->n_sel = 0;
        s->mean_v = 0;
        if (s->heap_at)
            for (int i = 0; i <= p->max_ctx; i++)
                s->heap_at[i] = -1;
        if (s->score)
            memset(s->score, 0, sizeof(double) * ((size_t)p->max_ctx + 1));
        if (s->ver) {
            for (int i = 0; i < s->n_act_v; i++)
                s->ver[s->act_v[i]] = 0.0, s->in_v[s->act_v[i]] = 0;
            for (int i = 0; i < s->n_act_s; i++)
                s->sla[s->act_s[i]] = 0.0, s->in_s[s->act_s[i]] = 0;
            s->n_act_v = s->n_act_s = 0;
            for (int i = 0; i <= p->max_ctx; i++)
                s->stamp[i] = s->pm_stamp[i] = -1;
        }
    }
    p->stamp_id = 0;
    if (p->kind == SFI_PEER_SFI) {
        static const uint8_t is_trig[2] = {0, 1};
        sfi_trigger_policy_init(&p->tp, SFI_TRIG_SFI, &p->cfg.prm, is_trig, 2, 0);
    }
}

static void set_dense(sfi_peer_set *o, int n_ctx)
{
    memset(o, 0, sizeof *o);
    o->n_ctx = n_ctx;
    o->dense = 1;
    o->recent_begin = n_ctx;
    o->size = n_ctx;
}

/* Every position, without a dense pass (a budget that covers the cache). */
static void set_all(sfi_peer_set *o, int n_ctx)
{
    memset(o, 0, sizeof *o);
    o->n_ctx = n_ctx;
    o->sink_end = n_ctx;
    o->recent_begin = n_ctx;
    o->size = n_ctx;
}

/* Top-b of the obs entries marked in s->bits, the rest of b virtual. */
static void set_topb(head_state *s, const sfi_peer_obs *o, int n_ctx, int b, sfi_peer_set *out)
{
    unmark_all(s);
    if (b >= n_ctx) {
        set_all(out, n_ctx);
        return;
    }
    int k = o->n_top < b ? o->n_top : b, n = 0;
    for (int i = 0; i < k; i++)
        if (o->pos[i] < n_ctx)
            mark(s, o->pos[i]), n++;
    memset(out, 0, sizeof *out);
    out->n_ctx = n_ctx;
    out->recent_begin = n_ctx;
    out->bits = s->bits;
    out->size = b;
    out->n_virtual = b - n;
}

/* ---- H2O: min-heap on (score, position) ---- */
static inline int h2o_less(const head_state *s, int32_t a, int32_t b)
{
    return s->score[a] < s->score[b] || (s->score[a] == s->score[b] && a < b);
}

static void heap_up(head_state *s, int i)
{
    int32_t x = s->heap[i];
    while (i > 0) {
        int pa = (i - 1) / 2;
        if (!h2o_less(s, x, s->heap[pa]))
            break;
        s->heap[i] = s->heap[pa];
        s->heap_at[s->heap[i]] = i;
        i = pa;
    }
    s->heap[i] = x;
    s->heap_at[x] = i;
}

static void heap_down(head_state *s, int i)
{
    int32_t x = s->heap[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= s->heap_n)
            break;
        if (c + 1 < s->heap_n && h2o_less(s, s->heap[c + 1], s->heap[c]))
            c++;
        if (!h2o_less(s, s->heap[c], x))
            break;
        s->heap[i] = s->heap[c];
        s->heap_at[s->heap[i]] = i;
        i = c;
    }
    s->heap[i] = x;
    s->heap_at[x] = i;
}

static void heap_push(head_state *s, int32_t pos)
{
    s->heap[s->heap_n] = pos;
    s->heap_at[pos] = s->heap_n;
    s->heap_n++;
    heap_up(s, s->heap_n - 1);
    bit_set(s->bits, pos);
}

static void heap_pop(head_state *s)
{
    int32_t x = s->heap[0];
    s->heap_at[x] = -1;
    bit_clr(s->bits, x);
    s->heap_n--;
    if (s->heap_n > 0) {
        s->heap[0] = s->heap[s->heap_n];
        s->heap_at[s->heap[0]] = 0;
        heap_down(s, 0);
    }
}

static void step_h2o(sfi_peer *p, head_state *s, const sfi_peer_obs *o, int n_ctx, int B,
                     int first, sfi_peer_set *out)
{
    int Br = (int)(p->cfg.h2o_recent_frac * (float)B + 0.5f);
    if (Br < 1)
        Br = 1;
    if (Br > B)
        Br = B;
    int Bh = B - Br;
    int rb = n_ctx - Br > 0 ? n_ctx - Br : 0;
    if (first) {
        /* The first step's attention stands in for the prompt's accumulated
         * attention (a trace holds decode steps only). */
        for (int i = 0; i < o->n_top; i++)
            if (o->pos[i] < n_ctx)
                s->score[o->pos[i]] += o->prob[i];
        s->rb = 0;
    }
    if (rb < s->rb)
        rb = s->rb;  /* the window never moves back over evicted positions */
    for (int32_t j = s->rb; j < rb; j++)
        heap_push(s, j);
    s->rb = rb;
    while (s->heap_n > Bh)
        heap_pop(s);
    memset(out, 0, sizeof *out);
    out->n_ctx = n_ctx;
    out->recent_begin = rb;
    out->bits = s->bits;
    out->size = s->heap_n + (n_ctx - rb);
    /* Accumulate this step's attention, renormalized over the kept set as
     * H2O's sparse attention sees it (the tail share is not attributed). */
    double lo;
    double R = sfi_peer_set_recall(out, o, 0, &lo, NULL, NULL);
    if (R <= 0.0)
        return;
    for (int i = 0; i < o->n_top; i++) {
        int32_t j = o->pos[i];
        if (j >= n_ctx || !sfi_peer_set_contains(out, j))
            continue;
        s->score[j] += o->prob[i] / R;
        if (s->heap_at[j] >= 0)
            heap_down(s, s->heap_at[j]);
    }
}

/* ---- SnapKV ---- */
static void step_snapkv(sfi_peer *p, head_state *s, const sfi_peer_obs *o, int n_ctx, int B,
                        int first, sfi_peer_set *out)
{
    int R = p->cfg.prm.n_recent < B ? p->cfg.prm.n_recent : B;
    if (first) {
        int P = n_ctx - R > 0 ? n_ctx - R : 0;
        float *sc = p->fbuf;
        for (int j = 0; j < P; j++)
            sc[j] = 0.0f;
        int r = p->cfg.snapkv_pool;
        for (int i = 0; i < o->n_top; i++) {
            int32_t c = o->pos[i];
            for (int32_t j = c - r; j <= c + r; j++)
                if (j >= 0 && j < P && o->prob[i] > sc[j])
                    sc[j] = o->prob[i];
        }
        /* Rank by pooled score, ties (the unscored) to the later position. */
        vi *t = p->vbuf;
        for (int j = 0; j < P; j++)
            t[j].v = sc[j], t[j].i = -j;
        qsort(t, (size_t)P, sizeof *t, cmp_vi_desc);
        for (int j = 0; j < P; j++)
            s->ranking[j] = -t[j].i;
        s->n_ranking = P;
        s->k_cur = 0;
    }
    int k = B - R;
    if (k > s->n_ranking)
        k = s->n_ranking;
    for (; s->k_cur < k; s->k_cur++)
        bit_set(s->bits, s->ranking[s->k_cur]);
    for (; s->k_cur > k; s->k_cur--)
        bit_clr(s->bits, s->ranking[s->k_cur - 1]);
    int rb = n_ctx - R;
    if (rb < s->n_ranking)
        rb = s->n_ranking;
    memset(out, 0, sizeof *out);
    out->n_ctx = n_ctx;
    out->recent_begin = rb;
    out->bits = s->bits;
    out->size = k + (n_ctx - rb);
}

/* ---- Quest ---- */
static void step_quest(sfi_peer *p, head_state *s, int kvh, const sfi_peer_step *st,
                       const sfi_peer_obs *o, int n_ctx, int B, sfi_peer_set *out)
{
    int page = p->cfg.quest_page;
    int n_pages = (n_ctx + page - 1) / page;
    int P = B / page;
    if (P < 1)
        P = 1;
    unmark_all(s);
    memset(out, 0, sizeof *out);
    out->n_ctx = n_ctx;
    out->recent_begin = n_ctx;
    out->bits = s->bits;
    if (P >= n_pages) {
        set_all(out, n_ctx);
        return;
    }
    vi *t = p->vbuf;
    int nt = 0;
    if (st->q && st->k && p->head_dim > 0) {
        float *sc = p->fbuf;
        sfi_peer_quest_scores(st->q, st->k, n_ctx, p->n_heads, p->H, p->head_dim, kvh, page, sc);
        for (int g = 0; g < n_pages; g++)
            t[g].v = sc[g], t[g].i = -g;
        nt = n_pages;
        qsort(t, (size_t)nt, sizeof *t, cmp_vi_desc);
    } else {
        /* Trace-only: a page's bound is its largest recorded probability
         * (an upper bound of what Quest's key bound can find); pages with
         * no entry follow, later pages first. */
        float *best = p->fbuf;
        int32_t *pages = p->ibuf;
        int np = 0;
        for (int i = 0; i < o->n_top; i++) {
            int g = o->pos[i] / page;
            if (o->pos[i] >= n_ctx)
                continue;
            if (!bit_get(s->bits, g))  /* bits double as a page-seen mark */
                bit_set(s->bits, g), best[g] = o->prob[i], pages[np++] = g;
            else if (o->prob[i] > best[g])
                best[g] = o->prob[i];
        }
        for (int i = 0; i < np; i++)
            t[i].v = best[pages[i]], t[i].i = -pages[i], bit_clr(s->bits, pages[i]);
        qsort(t, (size_t)np, sizeof *t, cmp_vi_desc);
        nt = np;
    }
    int chosen = 0, size = 0;
    for (int i = 0; i < nt && chosen < P; i++, chosen++) {
        int g = -t[i].i;
        for (int32_t j = g * page; j < (g + 1) * page && j < n_ctx; j++)
            mark(s, j), size++;
    }
    for (int g = n_pages - 1; g >= 0 && chosen < P; g--) {
        if (bit_get(s->bits, g * page))
            continue;
        for (int32_t j = g * page; j < (g + 1) * page && j < n_ctx; j++)
            mark(s, j), size++;
        chosen++;
    }
    out->size = size;
}

/* ---- LFPS ---- */
static void lfps_moments(const double *tab, const int32_t *act, int n_act, int n, double *mean,
                         double *kurt)
{
    double s1 = 0.0;
    for (int i = 0; i < n_act; i++)
        s1 += tab[act[i]];
    double m = s1 / n, s2 = 0.0, s4 = 0.0;
    for (int i = 0; i < n_act; i++) {
        double d = tab[act[i]] - m;
        s2 += d * d;
        s4 += d * d * d * d;
    }
    double z = (double)(n - n_act);  /* untouched entries are 0 */
    s2 += z * m * m;
    s4 += z * m * m * m * m;
    *mean = m;
    double var = s2 / n;
    *kurt = var > 0.0 ? (s4 / n) / (var * var) : 0.0;
}

static void lfps_add(double *tab, int32_t *act, int *n_act, uint8_t *in, int32_t i, double v)
{
    if (!in[i])
        in[i] = 1, act[(*n_act)++] = i;
    tab[i] += v;
}

static void lfps_decay(double *tab, int32_t *act, int *n_act, uint8_t *in, double r, double prune)
{
    int w = 0;
    for (int i = 0; i < *n_act; i++) {
        int32_t j = act[i];
        tab[j] *= r;
        if (tab[j] > prune || tab[j] < -prune)
            act[w++] = j;
        else
            tab[j] = 0.0, in[j] = 0;
    }
    *n_act = w;
}

static void lfps_cand_push(sfi_peer *p, head_state *s, int32_t j, int n_ctx, int *nc)
{
    if (j < 0 || j >= n_ctx || s->stamp[j] == p->stamp_id)
        return;
    s->stamp[j] = p->stamp_id;
    s->cand[(*nc)++] = j;
}

static void step_lfps(sfi_peer *p, head_state *s, const sfi_peer_obs *o, int n_ctx, int B,
                      int first, sfi_peer_set *out)
{
    p->stamp_id++;
    for (int i = 0; i < o->n_top; i++)
        if (o->pos[i] < n_ctx)
            s->pm[o->pos[i]] = o->prob[i], s->pm_stamp[o->pos[i]] = p->stamp_id;
    unmark_all(s);
    memset(out, 0, sizeof *out);
    out->n_ctx = n_ctx;
    out->recent_begin = n_ctx;
    out->bits = s->bits;
    int nC;
    if (first) {
        /* No tables yet: the step is dense and its attention initializes
         * them (a trace holds no prompt queries). */
        for (int i = 0; i < o->n_top; i++)
            if (o->pos[i] < n_ctx)
                mark(s, o->pos[i]);
        nC = s->n_marked;
        set_all(out, n_ctx);
    } else {
        int nc = 0;
        double mean, kurt;
        double a = p->cfg.lfps_a;
        lfps_moments(s->ver, s->act_v, s->n_act_v, n_ctx, &mean, &kurt);
        double thr = kurt > 0.0 ? a * mean / kurt : 1e300;
        if (thr < 0.0)
            thr = 0.0;
        for (int i = 0; i < s->n_act_v; i++) {
            int32_t j = s->act_v[i];
            double v = s->ver[j];
            if (j >= n_ctx || !(v > thr))
                continue;
            lfps_cand_push(p, s, j, n_ctx, &nc);
            if (v > mean)
                for (int d = -1; d <= 2; d += (d == -1 ? 2 : 1))
                    lfps_cand_push(p, s, j + d, n_ctx, &nc);
        }
        lfps_moments(s->sla, s->act_s, s->n_act_s, n_ctx, &mean, &kurt);
        thr = kurt > 0.0 ? a * mean / kurt : 1e300;
        if (thr < 0.0)
            thr = 0.0;
        for (int i = 0; i < s->n_act_s; i++) {
            int32_t off = s->act_s[i];
            double v = s->sla[off];
            int32_t j = n_ctx - 1 - off;
            if (j < 0 || !(v > thr))
                continue;
            lfps_cand_push(p, s, j, n_ctx, &nc);
            if (v > mean)
                for (int d = -1; d <= 2; d += (d == -1 ? 2 : 1))
                    lfps_cand_push(p, s, j + d, n_ctx, &nc);
        }
        /* Exact top-B inside the candidates: recorded probabilities first,
         * then the unrecorded ones (equal), later positions first. */
        vi *t = p->vbuf;
        for (int i = 0; i < nc; i++) {
            int32_t j = s->cand[i];
            t[i].v = s->pm_stamp[j] == p->stamp_id ? s->pm[j] : -1.0f;
            t[i].i = -j;
        }
        if (nc > B) {
            qsort(t, (size_t)nc, sizeof *t, cmp_vi_desc);
            nc = B;
        }
        for (int i = 0; i < nc; i++)
            mark(s, -t[i].i);
        nC = s->n_marked;
        out->size = nC;
    }
    if (nC == 0)
        return;
    /* Weights over C (renormalized), sink share, table updates. */
    double R = sfi_peer_set_recall(out, o, 0, NULL, NULL, NULL);
    int rest = o->n_ctx - o->n_top;
    double tail_each = rest > 0 ? (double)o->tail / rest : 0.0;
    if (R <= 0.0)
        R = 1.0;
    double r = p->cfg.lfps_r, base = 1.0 / (2.0 * nC), sink = 0.0;
    lfps_decay(s->ver, s->act_v, &s->n_act_v, s->in_v, r, p->cfg.lfps_prune);
    lfps_decay(s->sla, s->act_s, &s->n_act_s, s->in_s, r, p->cfg.lfps_prune);
    for (int i = 0; i < s->n_marked; i++) {
        int32_t j = s->marked[i];
        double w = (s->pm_stamp[j] == p->stamp_id ? s->pm[j] : tail_each) / R;
        if (j < p->cfg.prm.n_sink)
            sink += w;
        lfps_add(s->ver, s->act_v, &s->n_act_v, s->in_v, j, w - base);
        lfps_add(s->sla, s->act_s, &s->n_act_s, s->in_s, n_ctx - 1 - j, w - base);
    }
    out->mean_v = sink > p->cfg.lfps_sink_share;
}

/* ---- FASA ---- */
static sfi_status step_fasa(sfi_peer *p, head_state *s, int kvh, const sfi_peer_step *st,
                            int n_ctx, int B, sfi_peer_set *out, sfi_error *err)
{
    if (!s->calibrated) {
        sfi_status e = sfi_peer_fasa_calibrate(st->q, st->k, n_ctx, p->n_heads, p->H,
                                               p->head_dim, kvh, p->cfg.fasa_calib_k,
                                               p->cfg.fasa_tip, s->tip, err);
        if (e)
            return e;
        s->calibrated = 1;
    }
    unmark_all(s);
    if (B >= n_ctx) {
        set_all(out, n_ctx);
        return SFI_OK;
    }
    fasa_scores(st->q, st->k, n_ctx, p->n_heads, p->H, p->head_dim, kvh, s->tip,
                p->cfg.fasa_tip, p->fbuf);
    sfi_status e = topk_idx(p->fbuf, n_ctx, B, p->ibuf, err);
    if (e)
        return e;
    for (int i = 0; i < B; i++)
        mark(s, p->ibuf[i]);
    memset(out, 0, sizeof *out);
    out->n_ctx = n_ctx;
    out->recent_begin = n_ctx;
    out->bits = s->bits;
    out->size = B;
    return SFI_OK;
}

/* ---- SFI ---- */
static sfi_status step_sfi(sfi_peer *p, const sfi_peer_step *st, int n_ctx, int B,
                           sfi_peer_set *sets, int *slow, sfi_error *err)
{
    sfi_step_reason why;
    sfi_step_kind kind = sfi_trigger_next(&p->tp, st->prev_trigger ? 1 : 0, &why);
    int H = p->H;
    const sfi_params *prm = &p->cfg.prm;
    int sink_end = prm->n_sink < n_ctx ? prm->n_sink : n_ctx;
    int rb = n_ctx - prm->n_recent > sink_end ? n_ctx - prm->n_recent : sink_end;
    if (kind == SFI_STEP_SLOW) {
        *slow = 1;
        int jb, je;
        sfi_state_candidates(prm, n_ctx, &jb, &je);
        sfi_params q = *prm;
        q.K = B - prm->n_sink - prm->n_recent;
        if (q.K < 1)
            q.K = 1;
        for (int h = 0; h < H; h++) {
            head_state *s = &p->hs[h];
            for (int i = 0; i < s->n_sel; i++)
                bit_clr(s->bits, s->sel[i]);
            s->n_sel = 0;
        }
        if (je > jb && !st->next_unused) {
            /* The trace's top-M probabilities as logits (log p); positions
             * outside the entries share the tail evenly. With the group's
             * query-head records (qobs) each query head is one window query
             * (sfi(7) SELECTOR: W*G window queries, W = 1 at decode);
             * otherwise the pooled record is the one window query, and the
             * Selector's f is then the recorded distribution on J. */
            int G = st->qobs && st->q_per_kv > 0 ? st->q_per_kv : 1;
            size_t need = (size_t)H * G * n_ctx;
            if (need > p->logits_cap) {
                float *nl = realloc(p->logits, sizeof(float) * need);
                if (!nl)
                    return sfi_error_set(err, SFI_ENOMEM, "sfi: out of memory for logits");
                p->logits = nl;
                p->logits_cap = need;
            }
            for (int h = 0; h < H; h++) {
                for (int g = 0; g < G; g++) {
                    const sfi_peer_obs *o = st->qobs && st->q_per_kv > 0
                                                ? &st->qobs[(size_t)h * G + g] : &st->obs[h];
                    float *lg = p->logits + ((size_t)h * G + g) * n_ctx;
                    int rest = o->n_ctx - o->n_top;
                    float floor_lg = -80.0f;
                    float tl = rest > 0 && o->tail > 0.0f ? sfi_logf(o->tail / (float)rest)
                                                          : floor_lg;
                    for (int j = 0; j < n_ctx; j++)
                        lg[j] = tl;
                    for (int i = 0; i < o->n_top; i++)
                        if (o->pos[i] < n_ctx)
                            lg[o->pos[i]] = o->prob[i] > 0.0f ? sfi_logf(o->prob[i]) : floor_lg;
                }
                float *kn = p->norms + (size_t)h * n_ctx;
                if (st->k && p->head_dim > 0) {
                    for (int j = 0; j < n_ctx; j++) {
                        const float *kr = &st->k[((size_t)j * H + h) * p->head_dim];
                        kn[j] = sfi_sqrtf(sfi_dot(kr, kr, (size_t)p->head_dim));
                    }
                } else {
                    for (int j = 0; j < n_ctx; j++)
                        kn[j] = 1.0f;
                }
            }
            sfi_selector_input in = {
                .n_kv_heads = H, .n_win = G, .n_pos = n_ctx, .j_begin = jb, .j_end = je,
                .logits = p->logits, .key_norms = p->norms,
            };
            int32_t *selected = p->ibuf;  /* H * min(K, |J|) <= H * n_ctx? */
            int kk = q.K < je - jb ? q.K : je - jb;
            int32_t *tmp = selected;
            int32_t *heap_buf = NULL;
            if ((size_t)H * kk > (size_t)p->max_ctx + 1) {
                heap_buf = malloc(sizeof(int32_t) * (size_t)H * kk);
                if (!heap_buf)
                    return sfi_error_set(err, SFI_ENOMEM, "sfi: out of memory");
                tmp = heap_buf;
            }
            int n_sel = 0;
            sfi_status e = sfi_selector_run(&q, &in, tmp, &n_sel, NULL, err);
            if (e) {
                free(heap_buf);
                return e;
            }
            for (int h = 0; h < H; h++) {
                head_state *s = &p->hs[h];
                memcpy(s->sel, tmp + (size_t)h * n_sel, sizeof(int32_t) * (size_t)n_sel);
                s->n_sel = n_sel;
                for (int i = 0; i < n_sel; i++)
                    bit_set(s->bits, s->sel[i]);
            }
            free(heap_buf);
        }
        for (int h = 0; h < H; h++)
            set_dense(&sets[h], n_ctx);
        return SFI_OK;
    }
    *slow = 0;
    for (int h = 0; h < H; h++) {
        head_state *s = &p->hs[h];
        /* Selected positions that slid into the recent window count once:
         * sel is ascending, so count those below rb. */
        int lo = 0, hi = s->n_sel;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (s->sel[mid] < rb)
                lo = mid + 1;
            else
                hi = mid;
        }
        sfi_peer_set *o = &sets[h];
        memset(o, 0, sizeof *o);
        o->n_ctx = n_ctx;
        o->sink_end = sink_end;
        o->recent_begin = rb;
        o->bits = s->bits;
        o->size = sink_end + (n_ctx - rb) + lo;
    }
    return SFI_OK;
}

sfi_status sfi_peer_step_run(sfi_peer *p, const sfi_peer_step *st, sfi_peer_set *sets,
                             int *available, int *slow, sfi_error *err)
{
    int n_ctx = st->n_ctx, B = st->budget;
    int dummy_slow = 0;
    if (!slow)
        slow = &dummy_slow;
    *slow = 0;
    *available = 1;
    if (n_ctx < 1 || n_ctx > p->max_ctx)
        return sfi_error_set(err, SFI_ERANGE, "policy %s: context %d outside 1..%d",
                             kind_names[p->kind], n_ctx, p->max_ctx);
    if (B < 1)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: budget %d < 1", kind_names[p->kind], B);
    int first = !p->started;
    if (p->kind == SFI_PEER_FASA && (!st->q || !st->k || p->head_dim < 2)) {
        *available = 0;
        return SFI_OK;
    }
    p->started = 1;
    if (p->kind == SFI_PEER_SFI)
        return step_sfi(p, st, n_ctx, B, sets, slow, err);
    for (int h = 0; h < p->H; h++) {
        head_state *s = &p->hs[h];
        const sfi_peer_obs *o = &st->obs[h];
        sfi_peer_set *out = &sets[h];
        switch (p->kind) {
        case SFI_PEER_ORACLE:
            set_topb(s, o, n_ctx, B, out);
            break;
        case SFI_PEER_FULL:
            set_dense(out, n_ctx);
            break;
        case SFI_PEER_STREAMING: {
            memset(out, 0, sizeof *out);
            out->n_ctx = n_ctx;
            int se = p->cfg.prm.n_sink < B ? p->cfg.prm.n_sink : B;
            if (se > n_ctx)
                se = n_ctx;
            int rb = n_ctx - (B - se);
            if (rb < se)
                rb = se;
            out->sink_end = se;
            out->recent_begin = rb;
            out->size = se + n_ctx - rb;
            break;
        }
        case SFI_PEER_H2O:
            step_h2o(p, s, o, n_ctx, B, first, out);
            break;
        case SFI_PEER_SNAPKV:
            step_snapkv(p, s, o, n_ctx, B, first, out);
            break;
        case SFI_PEER_QUEST:
            step_quest(p, s, h, st, o, n_ctx, B, out);
            break;
        case SFI_PEER_LFPS:
            step_lfps(p, s, o, n_ctx, B, first, out);
            break;
        case SFI_PEER_KASCADE: {
            int sl = p->plan->src_layer[p->layer];
            int sh = p->plan->src_head[(size_t)p->layer * p->H + h];
            if (p->layer == 0) {
                set_dense(out, n_ctx);
            } else if (sl == p->layer) {
                set_topb(s, o, n_ctx, B, out);
            } else {
                const sfi_peer_obs *so = st->layer_obs ? st->layer_obs(st->layer_obs_ctx, sl, sh)
                                                       : NULL;
                if (!so)
                    return sfi_error_set(err, SFI_EINVAL, "policy kascade: layer %d needs layer "
                                         "%d's attention of the same step", p->layer, sl);
                set_topb(s, so, n_ctx, B, out);
            }
            break;
        }
        case SFI_PEER_FASA: {
            sfi_status e = step_fasa(p, s, h, st, n_ctx, B, out, err);
            if (e)
                return e;
            break;
        }
        default:
            return sfi_error_set(err, SFI_EINVAL, "policy: bad kind");
        }
    }
    return SFI_OK;
}
