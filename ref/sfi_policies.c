/* The comparison policies (see sfi_policies.h for the interface and
 * sfi-sim-analyze(1), POLICIES, for each rule against its paper). */
#include <config.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_policies.h"
#include "sfi_attention.h"
#include "sfi_math.h"
#include "sfi_selector.h"

/* ---------------------------------------------------------------- */
/* The list                                                           */

static const struct {
    const char *name, *help;
    sfi_trigger_kind trig;
} kinds[SFI_POLICY_N_KINDS] = {
    {"full", "full KV: dense attention every step", SFI_TRIG_ALWAYS},
    {"oracle", "exact top-B of the step's dense attention (upper bound; a dense QK pass "
               "every step)", SFI_TRIG_NEVER},
    {"streaming", "StreamingLLM: sink + recent window", SFI_TRIG_NEVER},
    {"h2o", "H2O: heavy hitters by accumulated attention (prompt included) + recent, "
            "evicting", SFI_TRIG_NEVER},
    {"snapkv", "SnapKV: prompt compressed once by the pooled attention of its last "
               "snapkv_window queries", SFI_TRIG_NEVER},
    {"quest", "Quest: per-page min/max key bound, top pages (quest_page=16, first "
              "quest_dense_layers=2 layers dense)", SFI_TRIG_NEVER},
    {"lfps", "LFPS: decayed vertical/slash tables seeded from the prompt, candidates, exact "
             "top-B inside them", SFI_TRIG_NEVER},
    {"kascade", "Kascade: layer 0 dense, exact top-B in anchor layers, reused by the others "
                "(calibrated)", SFI_TRIG_NEVER},
    {"fasa", "FASA: score on the N_tip dominant RoPE chunks, exact attention over the top B "
             "(calibrated)", SFI_TRIG_NEVER},
    {"sfi", "SFI: slow at step 0, after a boundary token or after T_max steps", SFI_TRIG_SFI},
    {"tmax", "SFI state, slow every T_max steps only", SFI_TRIG_TMAX},
    {"interval", "SFI state, slow every `interval` steps (interval=16)", SFI_TRIG_INTERVAL},
    {"boundary", "SFI state, slow after boundary tokens only (no T_max)", SFI_TRIG_BOUNDARY},
};

const char *sfi_policy_kind_name(sfi_policy_kind k)
{
    return (unsigned)k < SFI_POLICY_N_KINDS ? kinds[k].name : "?";
}

const char *sfi_policy_kind_help(sfi_policy_kind k)
{
    return (unsigned)k < SFI_POLICY_N_KINDS ? kinds[k].help : "?";
}

int sfi_policy_has_slow_steps(sfi_policy_kind k)
{
    return k == SFI_POLICY_SFI || k == SFI_POLICY_TMAX || k == SFI_POLICY_INTERVAL ||
           k == SFI_POLICY_BOUNDARY;
}

sfi_trigger_kind sfi_policy_trigger_kind(sfi_policy_kind k)
{
    return (unsigned)k < SFI_POLICY_N_KINDS ? kinds[k].trig : SFI_TRIG_NEVER;
}

int sfi_policy_needs_qk(sfi_policy_kind k)
{
    return k == SFI_POLICY_QUEST || k == SFI_POLICY_FASA;
}

sfi_status sfi_policy_kind_parse(const char *name, sfi_policy_kind *k, sfi_error *err)
{
    for (int i = 0; i < SFI_POLICY_N_KINDS; i++)
        if (!strcmp(name, kinds[i].name)) {
            *k = (sfi_policy_kind)i;
            return SFI_OK;
        }
    char known[256] = "";
    for (int i = 0; i < SFI_POLICY_N_KINDS; i++) {
        strncat(known, kinds[i].name, sizeof known - strlen(known) - 1);
        strncat(known, ", ", sizeof known - strlen(known) - 1);
    }
    return sfi_error_set(err, SFI_ENOTFOUND, "unknown policy '%s' (known: %sall)", name, known);
}

sfi_status sfi_policy_parse_list(const char *list, unsigned *mask, sfi_error *err)
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
            m |= SFI_POLICY_ALL;
        } else {
            sfi_policy_kind k = SFI_POLICY_FULL;
            sfi_status s = sfi_policy_kind_parse(name, &k, err);
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

/* ---------------------------------------------------------------- */
/* Parameters                                                         */

void sfi_policy_config_default(sfi_policy_config *c)
{
    memset(c, 0, sizeof *c);
    sfi_params_default(&c->prm);
    c->interval = 16;
    c->h2o_recent_frac = 0.5f;
    c->snapkv_window = 32;
    c->snapkv_pool = 3;
    c->quest_page = 16;
    c->quest_dense_layers = 2;
    c->lfps_r = 0.95f;
    c->lfps_a = 0.2f;
    c->lfps_s = 32;
    c->lfps_keep = 4;
    c->lfps_sink_share = 0.85f;
    c->lfps_cand = 0.0f;
    c->kascade_anchors = 0;
    c->kascade_calib_k = 64;
    c->fasa_tip = 0;
    c->fasa_calib_k = 256;
}

typedef struct {
    const char *key, *help;
    int is_int;
    size_t off;
    double lo, hi;
} cfg_key;

#define OFF(f) offsetof(sfi_policy_config, f)
static const cfg_key cfg_keys[] = {
    {"interval", "interval: steps between slow steps (16)", 1, OFF(interval), 1, 1 << 20},
    {"h2o_recent_frac", "H2O: recent share of the budget (0.5)", 0, OFF(h2o_recent_frac), 0, 1},
    {"snapkv_window", "SnapKV: observation window, prompt queries (32)", 1, OFF(snapkv_window),
     1, 1 << 20},
    {"snapkv_pool", "SnapKV: max-pool radius, kernel 2r+1 (3)", 1, OFF(snapkv_pool), 0, 64},
    {"quest_page", "Quest: tokens per page (16)", 1, OFF(quest_page), 1, 4096},
    {"quest_dense_layers", "Quest: first layers left dense (2)", 1, OFF(quest_dense_layers), 0,
     4096},
    {"lfps_r", "LFPS: table decay (0.95)", 0, OFF(lfps_r), 0, 0.999999},
    {"lfps_a", "LFPS: candidate threshold factor (0.2)", 0, OFF(lfps_a), 0, 1e6},
    {"lfps_s", "LFPS: prompt queries seeding the tables (32)", 1, OFF(lfps_s), 1, 1 << 20},
    {"lfps_keep", "LFPS: first tokens always kept (4)", 1, OFF(lfps_keep), 0, 4096},
    {"lfps_sink_share", "LFPS: sink bypass above this estimated share (0.85)", 0,
     OFF(lfps_sink_share), 0, 1},
    {"lfps_cand", "cost model: LFPS candidate share; 0 = the paper's table (0)", 0,
     OFF(lfps_cand), 0, 1},
    {"kascade_anchors", "Kascade: anchor layers besides layer 0; 0 = ceil(5 L / 36) (0)", 1,
     OFF(kascade_anchors), 0, 4096},
    {"kascade_calib_k", "Kascade: top-k of the calibration (64)", 1, OFF(kascade_calib_k), 1,
     1 << 20},
    {"fasa_tip", "FASA: dominant chunks; 0 = head_dim/8 (0)", 1, OFF(fasa_tip), 0, 4096},
    {"fasa_calib_k", "FASA: top-K of the calibration's agreement test (256)", 1,
     OFF(fasa_calib_k), 1, 1 << 20},
};
#undef OFF
enum { N_CFG_KEYS = sizeof cfg_keys / sizeof cfg_keys[0] };

size_t sfi_policy_config_key_count(void)
{
    return N_CFG_KEYS;
}

const char *sfi_policy_config_key_name(size_t i)
{
    return i < N_CFG_KEYS ? cfg_keys[i].key : NULL;
}

const char *sfi_policy_config_key_help(size_t i)
{
    return i < N_CFG_KEYS ? cfg_keys[i].help : NULL;
}

static int parse_num(const char *v, int is_int, double lo, double hi, double *out)
{
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end || !(d >= lo && d <= hi))
        return -1;
    if (is_int && d != (double)(long)d)
        return -1;
    *out = d;
    return 0;
}

/* Sets key (n chars) to v; 1 when the key is not ours. */
static int cfg_set_key(sfi_policy_config *c, const char *key, size_t n, const char *v,
                       sfi_error *err, sfi_status *st)
{
    for (size_t i = 0; i < N_CFG_KEYS; i++) {
        const cfg_key *k = &cfg_keys[i];
        if (strlen(k->key) != n || strncmp(key, k->key, n))
            continue;
        double d;
        if (parse_num(v, k->is_int, k->lo, k->hi, &d)) {
            *st = sfi_error_set(err, SFI_EINVAL, "%s: bad value '%s' (%s %g..%g)", k->key, v,
                                k->is_int ? "an integer in" : "a number in", k->lo, k->hi);
            return 0;
        }
        char *dst = (char *)c + k->off;
        if (k->is_int)
            *(int *)dst = (int)d;
        else
            *(float *)dst = (float)d;
        *st = SFI_OK;
        return 0;
    }
    return 1;
}

sfi_status sfi_policy_config_set(sfi_policy_config *c, const char *kv, sfi_error *err)
{
    const char *eq = strchr(kv, '=');
    if (!eq)
        return sfi_error_set(err, SFI_EINVAL, "--param '%s': expected key=value", kv);
    sfi_status st = SFI_OK;
    if (!cfg_set_key(c, kv, (size_t)(eq - kv), eq + 1, err, &st))
        return st ? sfi_error_prefix(err, "--param") : SFI_OK;
    return sfi_params_set(&c->prm, kv, "--param", err);
}

sfi_status sfi_policy_spec_parse(const char *spec, sfi_policy_kind *kind, sfi_policy_config *c,
                                 sfi_error *err)
{
    if (!spec || !spec[0])
        return sfi_error_set(err, SFI_EINVAL, "empty policy name");
    size_t nlen = strcspn(spec, ":");
    char name[32];
    if (nlen >= sizeof name)
        return sfi_error_set(err, SFI_ENOTFOUND, "unknown policy '%.*s'", (int)nlen, spec);
    memcpy(name, spec, nlen);
    name[nlen] = 0;
    for (char *q = name; *q; q++)
        if (*q >= 'A' && *q <= 'Z')
            *q = (char)(*q - 'A' + 'a');
    sfi_status st = sfi_policy_kind_parse(name, kind, err);
    if (st)
        return st;
    const char *s = spec + nlen;
    while (*s) {
        s++; /* ':' or ',' */
        size_t len = strcspn(s, ",");
        char kv[96];
        if (len == 0 || len >= sizeof kv)
            return sfi_error_set(err, SFI_EINVAL, "policy '%s': bad parameter list", spec);
        memcpy(kv, s, len);
        kv[len] = 0;
        s += len;
        char *eq = strchr(kv, '=');
        if (!eq)
            return sfi_error_set(err, SFI_EINVAL, "policy '%s': '%s' is not key=value", spec, kv);
        /* As given, then with the policy's prefix ("page" -> quest_page). */
        char full[160];
        snprintf(full, sizeof full, "%s_%.*s", name, (int)(eq - kv), kv);
        if (!cfg_set_key(c, kv, (size_t)(eq - kv), eq + 1, err, &st) ||
            !cfg_set_key(c, full, strlen(full), eq + 1, err, &st)) {
            if (st)
                return sfi_error_prefix(err, "policy '%s'", spec);
            continue;
        }
        if (sfi_params_set(&c->prm, kv, "policy", err))
            return sfi_error_set(err, SFI_EINVAL, "policy '%s': unknown parameter or value out "
                                 "of range: %s", spec, kv);
    }
    return SFI_OK;
}

int sfi_policy_kascade_anchors(const sfi_policy_config *c, int n_layers)
{
    int a = c->kascade_anchors > 0 ? c->kascade_anchors : (5 * n_layers + 35) / 36;
    if (a > n_layers - 1)
        a = n_layers - 1;
    return a < 1 ? (n_layers > 1 ? 1 : 0) : a;
}

int sfi_policy_fasa_tip(const sfi_policy_config *c, int head_dim)
{
    int half = head_dim / 2;
    int t = c->fasa_tip > 0 ? c->fasa_tip : (half + 3) / 4;
    if (t > half)
        t = half;
    return t < 1 ? 1 : t;
}

double sfi_policy_lfps_cand_share(const sfi_policy_config *c, int n)
{
    if (c->lfps_cand > 0.0f)
        return c->lfps_cand;
    /* The paper's candidate shares, 4.6% at 8K and 1.7% at 128K, linear in
     * log2 n between them and held outside. */
    const double n0 = 8192.0, s0 = 0.046, n1 = 131072.0, s1 = 0.017;
    if (n <= n0)
        return s0;
    if (n >= n1)
        return s1;
    double t = (double)sfi_logf((float)n) / (double)sfi_logf(2.0f);
    return s0 + (s1 - s0) * (t - 13.0) / (17.0 - 13.0);
}

/* ---------------------------------------------------------------- */
/* The budget                                                         */

sfi_status sfi_budget_parse(const char *s, sfi_budget *b, sfi_error *err)
{
    memset(b, 0, sizeof *b);
    if (!s || !*s)
        return sfi_error_set(err, SFI_EINVAL, "budget: empty");
    if (!strcmp(s, "sfi"))
        return SFI_OK;
    size_t n = strlen(s);
    char *end;
    double v = strtod(s, &end);
    if (end == s)
        return sfi_error_set(err, SFI_EINVAL, "budget '%s': neither a share (6%%, 0.06), a "
                             "count (2308) nor 'sfi'", s);
    if (*end == '%' && end[1] == 0) {
        if (!(v > 0.0 && v <= 100.0))
            return sfi_error_set(err, SFI_EINVAL, "budget '%s': a share must lie in (0%%, 100%%]",
                                 s);
        b->ratio = v / 100.0;
        return SFI_OK;
    }
    if (*end)
        return sfi_error_set(err, SFI_EINVAL, "budget '%s': neither a share (6%%, 0.06), a count "
                             "(2308) nor 'sfi'", s);
    int is_int = strspn(s, "0123456789") == n;
    if (is_int) {
        if (!(v >= 1.0 && v <= (double)INT_MAX))
            return sfi_error_set(err, SFI_EINVAL, "budget '%s': a count must lie in 1..%d", s,
                                 INT_MAX);
        b->positions = (int)v;
        return SFI_OK;
    }
    if (!(v > 0.0 && v <= 1.0))
        return sfi_error_set(err, SFI_EINVAL, "budget '%s': a share must lie in (0, 1]", s);
    b->ratio = v;
    return SFI_OK;
}

int sfi_budget_positions(const sfi_budget *b, const sfi_params *prm, int n_ctx)
{
    double B;
    if (b->ratio > 0.0)
        B = b->ratio * n_ctx + 0.5;
    else if (b->positions > 0)
        B = b->positions;
    else
        B = (double)prm->n_sink + prm->K + prm->n_recent;
    if (B > n_ctx)
        B = n_ctx;
    return B < 1.0 ? 1 : (int)B;
}

void sfi_budget_format(const sfi_budget *b, char *buf, size_t n)
{
    if (b->ratio > 0.0)
        snprintf(buf, n, "%g%%", b->ratio * 100.0);
    else if (b->positions > 0)
        snprintf(buf, n, "%d", b->positions);
    else
        snprintf(buf, n, "sfi");
}

void sfi_budget_sfi_split(const sfi_params *prm, int B, int n_ctx_max, int *n_recent, int *K)
{
    int r = (B - prm->n_sink) / 2;
    if (r > prm->n_recent)
        r = prm->n_recent;
    if (B >= n_ctx_max)
        r = B - prm->n_sink;
    if (r < 1)
        r = 1;
    int k = B - prm->n_sink - r;
    *n_recent = r;
    *K = k < 1 ? 1 : k;
}

/* ---------------------------------------------------------------- */
/* Sets                                                               */

void sfi_policy_set_indices(const sfi_policy_set *s, int32_t *idx, int *n)
{
    int m = 0;
    for (int32_t j = 0; j < s->n_ctx; j++)
        if (sfi_policy_set_contains(s, j))
            idx[m++] = j;
    *n = m;
}

double sfi_policy_set_recall(const sfi_policy_set *s, const sfi_policy_obs *o, int top_k,
                             double *lo, int *n_in, int *n_in_top)
{
    double mass = 0.0;
    int in = 0, in_top = 0;
    for (int i = 0; i < o->n_top; i++)
        if (sfi_policy_set_contains(s, o->pos[i])) {
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
/* Kernels on real q and K                                            */

void sfi_policy_colsum_add(const sfi_policy_shape *s, const float *q, const float *k, int n_ctx,
                           float *colsum, int stride)
{
    int H = s->n_kv_heads, G = s->n_heads / s->n_kv_heads, d = s->head_dim;
    float scale = sfi_attn_scale(d);
    float *lg = malloc(sizeof(float) * (size_t)n_ctx);
    if (!lg)
        return;
    for (int h = 0; h < s->n_heads; h++) {
        const float *qh = q + (size_t)h * d;
        for (int j = 0; j < n_ctx; j++)
            lg[j] = sfi_dot(qh, k + ((size_t)j * H + h / G) * d, (size_t)d) * scale;
        sfi_softmax(lg, (size_t)n_ctx);
        float *c = colsum + (size_t)h * stride;
        for (int j = 0; j < n_ctx; j++)
            c[j] += lg[j];
    }
    free(lg);
}

void sfi_policy_quest_scores(const float *q, const float *k, int n_ctx, int n_heads,
                             int n_kv_heads, int d, int kvh, int page, float *scores)
{
    int G = n_heads / n_kv_heads;
    int n_pages = (n_ctx + page - 1) / page;
    for (int pg = 0; pg < n_pages; pg++) {
        int j0 = pg * page, j1 = j0 + page < n_ctx ? j0 + page : n_ctx;
        float best = 0.0f;
        for (int g = 0; g < G; g++) {
            const float *qh = &q[(size_t)(kvh * G + g) * d];
            float s = 0.0f;
            for (int x = 0; x < d; x++) {
                float mn = k[((size_t)j0 * n_kv_heads + kvh) * d + x], mx = mn;
                for (int j = j0 + 1; j < j1; j++) {
                    float v = k[((size_t)j * n_kv_heads + kvh) * d + x];
                    if (v < mn)
                        mn = v;
                    if (v > mx)
                        mx = v;
                }
                float a = qh[x] * mn, b = qh[x] * mx;
                s += a > b ? a : b;
            }
            if (g == 0 || s > best)
                best = s;
        }
        scores[pg] = best;
    }
}

void sfi_policy_fasa_scores(const float *q, const float *k, int n_ctx, int n_heads, int n_kv,
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

void sfi_policy_lfps_moments(const double *tab, int n, double *mean, double *kurt)
{
    double s1 = 0.0;
    for (int i = 0; i < n; i++)
        s1 += tab[i];
    double m = n > 0 ? s1 / n : 0.0, s2 = 0.0, s4 = 0.0;
    for (int i = 0; i < n; i++) {
        double d = tab[i] - m;
        s2 += d * d;
        s4 += d * d * d * d;
    }
    *mean = m;
    *kurt = s2 > 0.0 ? s4 / (s2 * s2) : 0.0;
}

/* ---------------------------------------------------------------- */
/* Instances                                                          */

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

/* Per KV head state; each kind uses what it needs. */
typedef struct {
    uint64_t *bits;       /* membership bitmap over positions */
    int32_t *marked;      /* positions currently set in bits */
    int n_marked;
    int n_virtual;        /* of the last set (Kascade reuse copies it) */
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
    int32_t *cand;
    int n_cand;
    double *ksum, *kkt;   /* key statistics for the sink-share prior */
    double kn;
    int absorbed;
    /* FASA */
    int *tip;
    int n_tip;
    /* SFI */
    int32_t *sel;
    int n_sel;
} head_state;

typedef struct {
    head_state *hs;
    int epoch, last_step; /* Kascade: which step the sets below belong to */
    sfi_policy_set *sets; /* [H] of the last step */
    int started;          /* a step or the prompt was seen */
    int prompted;         /* sfi_policy_prompt_run ran */
    int seeded;           /* H2O/SnapKV/LFPS have their prompt observation */
    int fasa_ready;
    sfi_trigger_policy tp;
} layer_state;

struct sfi_policy {
    sfi_policy_kind kind;
    sfi_policy_config cfg;
    sfi_policy_shape sh;
    int H, G, max_ctx;
    size_t words;
    const sfi_policy_calib *calib;
    layer_state **ls;
    int epoch;
    /* Kascade's plan */
    int n_anchors;
    int *anchors;
    int *src_layer;       /* [L]: itself at anchors, -1 at layer 0 */
    int *src_head;        /* [L][H] */
    /* scratch */
    float *fbuf, *fbuf2, *lg;
    vi *vbuf;
    int32_t *ibuf, *ibuf2;
    int *stampv;          /* [max_ctx + 1] LFPS candidate marks */
    int stamp_id;
    float *logits, *norms;
    size_t logits_cap;
    const char *proxy;
};

sfi_policy_kind sfi_policy_get_kind(const sfi_policy *p)
{
    return p->kind;
}

const char *sfi_policy_proxy_note(const sfi_policy *p)
{
    return p->proxy;
}

static void note(sfi_policy *p, const char *what)
{
    if (!p->proxy)
        p->proxy = what;
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
    free(h->cand);
    free(h->ksum);
    free(h->kkt);
    free(h->tip);
    free(h->sel);
}

static void layer_free(layer_state *l, int H)
{
    if (!l)
        return;
    if (l->hs)
        for (int h = 0; h < H; h++)
            head_free(&l->hs[h]);
    free(l->hs);
    free(l->sets);
    free(l);
}

void sfi_policy_free(sfi_policy *p)
{
    if (!p)
        return;
    if (p->ls)
        for (int l = 0; l < p->sh.n_layers; l++)
            layer_free(p->ls[l], p->H);
    free(p->ls);
    free(p->anchors);
    free(p->src_layer);
    free(p->src_head);
    free(p->fbuf);
    free(p->fbuf2);
    free(p->lg);
    free(p->vbuf);
    free(p->ibuf);
    free(p->ibuf2);
    free(p->stampv);
    free(p->logits);
    free(p->norms);
    free(p);
}

static void layer_reset(sfi_policy *p, layer_state *l)
{
    l->started = l->prompted = l->seeded = 0;
    l->last_step = -1;
    size_t N = (size_t)p->max_ctx + 1;
    for (int h = 0; h < p->H; h++) {
        head_state *s = &l->hs[h];
        memset(s->bits, 0, p->words * sizeof(uint64_t));
        s->n_marked = s->n_virtual = 0;
        s->heap_n = s->rb = 0;
        s->n_ranking = s->k_cur = 0;
        s->n_sel = s->n_cand = 0;
        s->kn = 0.0;
        s->absorbed = 0;
        if (s->heap_at)
            for (size_t i = 0; i < N; i++)
                s->heap_at[i] = -1;
        if (s->score)
            memset(s->score, 0, sizeof(double) * N);
        if (s->ver) {
            memset(s->ver, 0, sizeof(double) * N);
            memset(s->sla, 0, sizeof(double) * N);
        }
        if (s->ksum) {
            memset(s->ksum, 0, sizeof(double) * (size_t)p->sh.head_dim);
            memset(s->kkt, 0, sizeof(double) * (size_t)p->sh.head_dim * p->sh.head_dim);
        }
    }
    /* The step says whether x_{t-1} ends a sentence: token 1 does. */
    static const uint8_t is_trig[2] = {0, 1};
    sfi_trigger_policy_init(&l->tp, sfi_policy_trigger_kind(p->kind), &p->cfg.prm, is_trig, 2,
                            p->cfg.interval);
}

void sfi_policy_reset(sfi_policy *p)
{
    p->epoch++;
    for (int l = 0; l < p->sh.n_layers; l++)
        if (p->ls[l])
            layer_reset(p, p->ls[l]);
}

static sfi_status layer_get(sfi_policy *p, int layer, layer_state **out, sfi_error *err)
{
    if (layer < 0 || layer >= p->sh.n_layers)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: layer %d outside 0..%d",
                             kinds[p->kind].name, layer, p->sh.n_layers - 1);
    if (p->ls[layer]) {
        *out = p->ls[layer];
        return SFI_OK;
    }
    int H = p->H, d = p->sh.head_dim;
    size_t N = (size_t)p->max_ctx + 1;
    layer_state *l = calloc(1, sizeof *l);
    int ok = l != NULL;
    if (ok) {
        l->hs = calloc((size_t)H, sizeof *l->hs);
        l->sets = calloc((size_t)H, sizeof *l->sets);
        ok = l->hs && l->sets;
    }
    for (int h = 0; ok && h < H; h++) {
        head_state *s = &l->hs[h];
        s->bits = calloc(p->words, sizeof(uint64_t));
        s->marked = malloc(sizeof(int32_t) * N);
        ok = s->bits && s->marked;
        switch (p->kind) {
        case SFI_POLICY_H2O:
            s->score = calloc(N, sizeof(double));
            s->heap = malloc(sizeof(int32_t) * N);
            s->heap_at = malloc(sizeof(int32_t) * N);
            ok = ok && s->score && s->heap && s->heap_at;
            break;
        case SFI_POLICY_SNAPKV:
            s->ranking = malloc(sizeof(int32_t) * N);
            ok = ok && s->ranking;
            break;
        case SFI_POLICY_LFPS:
            s->ver = calloc(N, sizeof(double));
            s->sla = calloc(N, sizeof(double));
            s->cand = malloc(sizeof(int32_t) * N);
            ok = ok && s->ver && s->sla && s->cand;
            if (ok && d > 0) {
                s->ksum = calloc((size_t)d, sizeof(double));
                s->kkt = calloc((size_t)d * d, sizeof(double));
                ok = s->ksum && s->kkt;
            }
            break;
        case SFI_POLICY_FASA:
            s->tip = malloc(sizeof(int) * (size_t)(d / 2 > 0 ? d / 2 : 1));
            ok = ok && s->tip;
            break;
        case SFI_POLICY_SFI:
        case SFI_POLICY_TMAX:
        case SFI_POLICY_INTERVAL:
        case SFI_POLICY_BOUNDARY:
            s->sel = malloc(sizeof(int32_t) * N);
            ok = ok && s->sel;
            break;
        default:
            break;
        }
    }
    if (!ok) {
        layer_free(l, H);
        return sfi_error_set(err, SFI_ENOMEM, "policy %s: out of memory for %d positions",
                             kinds[p->kind].name, p->max_ctx);
    }
    p->ls[layer] = l;
    layer_reset(p, l);
    *out = l;
    return SFI_OK;
}

/* Kascade's plan from the calibration: anchors by the DP, each reuse
 * layer's closest earlier anchor and the calibrated head map. */
static sfi_status kascade_plan(sfi_policy *p, sfi_error *err)
{
    int L = p->sh.n_layers, H = p->H;
    const sfi_policy_calib *c = p->calib;
    if (!c || !c->has_kascade)
        return sfi_error_set(err, SFI_EINVAL, "policy kascade: needs a calibration (sfi-ref "
                             "calibrate; sfi-sim analyze --calib)");
    if (c->n_layers != L || c->n_kv_heads != H)
        return sfi_error_set(err, SFI_EINVAL, "policy kascade: the calibration is for %d layers "
                             "x %d KV heads, the model has %d x %d", c->n_layers, c->n_kv_heads,
                             L, H);
    p->anchors = malloc(sizeof(int) * (size_t)(L > 0 ? L : 1));
    p->src_layer = malloc(sizeof(int) * (size_t)L);
    p->src_head = malloc(sizeof(int) * (size_t)L * H);
    if (!p->anchors || !p->src_layer || !p->src_head)
        return sfi_error_set(err, SFI_ENOMEM, "policy kascade: out of memory");
    p->n_anchors = sfi_policy_kascade_anchors(&p->cfg, L);
    if (p->n_anchors > 0)
        sfi_policy_kascade_dp(c->sim, c->weight, L, p->n_anchors, p->anchors);
    int cur = -1, ai = 0;
    for (int b = 0; b < L; b++) {
        if (ai < p->n_anchors && p->anchors[ai] == b)
            cur = b, ai++;
        p->src_layer[b] = b == 0 ? -1 : cur;
        for (int h = 0; h < H; h++)
            p->src_head[(size_t)b * H + h] =
                b == 0 || cur == b ? h : c->head[((size_t)cur * L + b) * H + h];
    }
    if (c->leaks)
        note(p, "calibrated on the evaluated trace's first steps");
    return SFI_OK;
}

sfi_status sfi_policy_create(sfi_policy_kind kind, const sfi_policy_config *cfg,
                             const sfi_policy_shape *shape, int max_ctx,
                             const sfi_policy_calib *calib, sfi_policy **out, sfi_error *err)
{
    *out = NULL;
    if ((unsigned)kind >= SFI_POLICY_N_KINDS)
        return sfi_error_set(err, SFI_EINVAL, "policy: bad kind %d", (int)kind);
    const sfi_policy_shape *s = shape;
    if (s->n_layers < 1 || s->n_kv_heads < 1 || s->n_heads < s->n_kv_heads ||
        s->n_heads % s->n_kv_heads || s->head_dim < 0 || (s->head_dim % 2) || max_ctx < 1)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: bad shape (%d layers, %d heads, %d KV "
                             "heads, head_dim %d, max context %d)", kinds[kind].name,
                             s->n_layers, s->n_heads, s->n_kv_heads, s->head_dim, max_ctx);
    sfi_status st = sfi_params_validate(&cfg->prm, err);
    if (st)
        return st;
    sfi_policy *p = calloc(1, sizeof *p);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    p->kind = kind;
    p->cfg = *cfg;
    p->sh = *s;
    p->H = s->n_kv_heads;
    p->G = s->n_heads / s->n_kv_heads;
    p->max_ctx = max_ctx;
    p->calib = calib;
    p->words = ((size_t)max_ctx + 64) / 64;
    size_t N = (size_t)max_ctx + 1;
    p->ls = calloc((size_t)s->n_layers, sizeof *p->ls);
    p->fbuf = malloc(sizeof(float) * N);
    p->fbuf2 = malloc(sizeof(float) * N);
    p->lg = malloc(sizeof(float) * N * (size_t)p->G);
    p->vbuf = malloc(sizeof(vi) * N);
    p->ibuf = malloc(sizeof(int32_t) * N);
    p->ibuf2 = malloc(sizeof(int32_t) * N);
    p->stampv = calloc(N, sizeof(int));
    if (!p->ls || !p->fbuf || !p->fbuf2 || !p->lg || !p->vbuf || !p->ibuf || !p->ibuf2 ||
        !p->stampv) {
        sfi_policy_free(p);
        return sfi_error_set(err, SFI_ENOMEM, "policy %s: out of memory for %d positions",
                             kinds[kind].name, max_ctx);
    }
    if (kind == SFI_POLICY_KASCADE && (st = kascade_plan(p, err))) {
        sfi_policy_free(p);
        return st;
    }
    if (kind == SFI_POLICY_FASA && calib && calib->has_fasa &&
        (calib->n_layers != s->n_layers || calib->n_kv_heads != s->n_kv_heads ||
         (s->head_dim > 0 && calib->head_dim != s->head_dim))) {
        sfi_policy_free(p);
        return sfi_error_set(err, SFI_EINVAL, "policy fasa: the calibration is for %d layers x "
                             "%d KV heads x head_dim %d, the model has %d x %d x %d",
                             calib->n_layers, calib->n_kv_heads, calib->head_dim, s->n_layers,
                             s->n_kv_heads, s->head_dim);
    }
    *out = p;
    return SFI_OK;
}

int sfi_policy_kascade_anchor_list(const sfi_policy *p, int *anchors, int max)
{
    int n = 0;
    for (int i = 0; i < p->n_anchors && n < max; i++)
        anchors[n++] = p->anchors[i];
    return n;
}

double sfi_policy_lfps_table(const sfi_policy *p, int layer, int kvh, int which, int idx)
{
    if (p->kind != SFI_POLICY_LFPS || layer < 0 || layer >= p->sh.n_layers || !p->ls[layer] ||
        kvh < 0 || kvh >= p->H || idx < 0 || idx > p->max_ctx)
        return 0.0;
    const head_state *s = &p->ls[layer]->hs[kvh];
    return which ? s->sla[idx] : s->ver[idx];
}

int sfi_policy_lfps_candidates(const sfi_policy *p, int layer, int kvh)
{
    if (p->kind != SFI_POLICY_LFPS || layer < 0 || layer >= p->sh.n_layers || !p->ls[layer] ||
        kvh < 0 || kvh >= p->H)
        return 0;
    return p->ls[layer]->hs[kvh].n_cand;
}

/* ---- set builders ---- */

static void set_dense(sfi_policy_set *o, int n_ctx)
{
    memset(o, 0, sizeof *o);
    o->n_ctx = n_ctx;
    o->dense = 1;
    o->recent_begin = n_ctx;
    o->size = n_ctx;
}

/* Every position, without a dense pass (a budget that covers the cache). */
static void set_all(sfi_policy_set *o, int n_ctx)
{
    memset(o, 0, sizeof *o);
    o->n_ctx = n_ctx;
    o->sink_end = n_ctx;
    o->recent_begin = n_ctx;
    o->size = n_ctx;
}

/* The marked positions as the set. */
static void set_marked(head_state *s, int n_ctx, int n_virtual, sfi_policy_set *out)
{
    memset(out, 0, sizeof *out);
    out->n_ctx = n_ctx;
    out->recent_begin = n_ctx;
    out->bits = s->bits;
    out->size = s->n_marked + n_virtual;
    out->n_virtual = n_virtual;
    s->n_virtual = n_virtual;
}

/* Top-b of the obs entries, the rest of b virtual. */
static void set_topb_obs(head_state *s, const sfi_policy_obs *o, int n_ctx, int b,
                         sfi_policy_set *out)
{
    unmark_all(s);
    if (b >= n_ctx) {
        set_all(out, n_ctx);
        return;
    }
    int k = o->n_top < b ? o->n_top : b;
    for (int i = 0; i < k; i++)
        if (o->pos[i] < n_ctx)
            mark(s, o->pos[i]);
    set_marked(s, n_ctx, b - s->n_marked, out);
}

/* Logits of the G query heads of KV head kvh at positions idx[0..n) (or
 * 0..n-1 when idx is NULL): lg[g*n + i]. */
static void group_logits(const sfi_policy *p, const float *q, const float *k, int kvh,
                         const int32_t *idx, int n, float *lg)
{
    int d = p->sh.head_dim, G = p->G;
    size_t row = (size_t)p->H * d;
    float scale = sfi_attn_scale(d);
    for (int g = 0; g < G; g++) {
        const float *qh = q + (size_t)(kvh * G + g) * d;
        for (int i = 0; i < n; i++) {
            size_t j = idx ? (size_t)idx[i] : (size_t)i;
            lg[(size_t)g * n + i] = sfi_dot(qh, k + j * row + (size_t)kvh * d, (size_t)d) * scale;
        }
    }
}

/* The group's attention over positions idx (or 0..n-1): per query head
 * the softmax over exactly those positions, then the mean over the
 * group (the "post-softmax pooling" of GQA). out[n]. */
static void pooled_probs(sfi_policy *p, const float *q, const float *k, int kvh,
                         const int32_t *idx, int n, float *out)
{
    group_logits(p, q, k, kvh, idx, n, p->lg);
    for (int i = 0; i < n; i++)
        out[i] = 0.0f;
    for (int g = 0; g < p->G; g++) {
        float *lg = p->lg + (size_t)g * n;
        sfi_softmax(lg, (size_t)n);
        for (int i = 0; i < n; i++)
            out[i] += lg[i] / (float)p->G;
    }
}

/* Exact top-b of the group's dense attention (ties to the smaller
 * position) as the set. */
static sfi_status set_topb_qk(sfi_policy *p, head_state *s, const float *q, const float *k,
                              int kvh, int n_ctx, int b, sfi_policy_set *out, sfi_error *err)
{
    unmark_all(s);
    if (b >= n_ctx) {
        set_all(out, n_ctx);
        return SFI_OK;
    }
    pooled_probs(p, q, k, kvh, NULL, n_ctx, p->fbuf);
    sfi_status st = sfi_topk(p->fbuf, n_ctx, b, p->ibuf, err);
    if (st)
        return st;
    for (int i = 0; i < b; i++)
        mark(s, p->ibuf[i]);
    set_marked(s, n_ctx, 0, out);
    return SFI_OK;
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

/* H2O: the heavy set by accumulated attention plus the recent window;
 * then this step's attention over the kept set (renormalized, as H2O's
 * sparse attention computes it) joins the scores. */
static void step_h2o(sfi_policy *p, layer_state *l, int kvh, const sfi_policy_step *st,
                     int B, sfi_policy_set *out)
{
    head_state *s = &l->hs[kvh];
    int n_ctx = st->n_ctx, real = st->q && st->k;
    const sfi_policy_obs *o = st->obs ? &st->obs[kvh] : NULL;
    int Br = (int)(p->cfg.h2o_recent_frac * (float)B + 0.5f);
    if (Br < 1)
        Br = 1;
    if (Br > B)
        Br = B;
    int Bh = B - Br;
    int rb = n_ctx - Br > 0 ? n_ctx - Br : 0;
    if (!l->seeded && !l->started) {
        /* No prompt observation: this step's attention stands in for the
         * prompt's accumulated attention. */
        note(p, "prompt attention: the first decode step's");
        if (real) {
            pooled_probs(p, st->q, st->k, kvh, NULL, n_ctx, p->fbuf);
            for (int j = 0; j < n_ctx; j++)
                s->score[j] += p->fbuf[j];
        } else {
            for (int i = 0; i < o->n_top; i++)
                if (o->pos[i] < n_ctx)
                    s->score[o->pos[i]] += o->prob[i];
        }
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
    if (real) {
        int n = 0;
        for (int i = 0; i < s->heap_n; i++)
            p->ibuf[n++] = s->heap[i];
        for (int32_t j = rb; j < n_ctx; j++)
            p->ibuf[n++] = j;
        pooled_probs(p, st->q, st->k, kvh, p->ibuf, n, p->fbuf);
        for (int i = 0; i < n; i++) {
            int32_t j = p->ibuf[i];
            s->score[j] += p->fbuf[i];
        }
        for (int i = s->heap_n / 2; i >= 0 && s->heap_n > 0; i--)
            heap_down(s, i);
        return;
    }
    double R = sfi_policy_set_recall(out, o, 0, NULL, NULL, NULL);
    if (R <= 0.0)
        return;
    for (int i = 0; i < o->n_top; i++) {
        int32_t j = o->pos[i];
        if (j >= n_ctx || !sfi_policy_set_contains(out, j))
            continue;
        s->score[j] += o->prob[i] / R;
        if (s->heap_at[j] >= 0)
            heap_down(s, s->heap_at[j]);
    }
}

/* ---- SnapKV ---- */

/* Ranks positions [0, P) by pooled score sc (ties to the later
 * position: recency among the unscored). */
static void snapkv_rank(sfi_policy *p, head_state *s, int P)
{
    int r = p->cfg.snapkv_pool;
    float *pooled = p->fbuf2;
    for (int j = 0; j < P; j++) {
        float m = 0.0f;
        for (int x = j - r; x <= j + r; x++)
            if (x >= 0 && x < P && p->fbuf[x] > m)
                m = p->fbuf[x];
        pooled[j] = m;
    }
    vi *t = p->vbuf;
    for (int j = 0; j < P; j++)
        t[j].v = pooled[j], t[j].i = -j;
    qsort(t, (size_t)P, sizeof *t, cmp_vi_desc);
    for (int j = 0; j < P; j++)
        s->ranking[j] = -t[j].i;
    s->n_ranking = P;
    s->k_cur = 0;
}

static void step_snapkv(sfi_policy *p, layer_state *l, int kvh, const sfi_policy_step *st,
                        int B, sfi_policy_set *out)
{
    head_state *s = &l->hs[kvh];
    int n_ctx = st->n_ctx;
    if (!l->seeded && !l->started) {
        /* No prompt observation: the first decode step's attention is the
         * observation window (one query). */
        note(p, "observation window: the first decode step's attention");
        int w = p->cfg.snapkv_window < n_ctx ? p->cfg.snapkv_window : n_ctx;
        int P = n_ctx - w;
        for (int j = 0; j < P; j++)
            p->fbuf[j] = 0.0f;
        if (st->q && st->k) {
            pooled_probs(p, st->q, st->k, kvh, NULL, n_ctx, p->fbuf2);
            memcpy(p->fbuf, p->fbuf2, sizeof(float) * (size_t)P);
        } else {
            const sfi_policy_obs *o = &st->obs[kvh];
            for (int i = 0; i < o->n_top; i++)
                if (o->pos[i] < P)
                    p->fbuf[o->pos[i]] = o->prob[i];
        }
        snapkv_rank(p, s, P);
    }
    /* Kept: the window and every later token (SnapKV evicts nothing after
     * the prompt); under a per-step budget the oldest of them drop out
     * once they alone exceed B (our choice). */
    int rb = s->n_ranking;
    if (n_ctx - rb > B)
        rb = n_ctx - B;
    int k = B - (n_ctx - rb);
    if (k > s->n_ranking)
        k = s->n_ranking;
    if (k < 0)
        k = 0;
    for (; s->k_cur < k; s->k_cur++)
        bit_set(s->bits, s->ranking[s->k_cur]);
    for (; s->k_cur > k; s->k_cur--)
        bit_clr(s->bits, s->ranking[s->k_cur - 1]);
    memset(out, 0, sizeof *out);
    out->n_ctx = n_ctx;
    out->recent_begin = rb;
    out->bits = s->bits;
    out->size = k + (n_ctx - rb);
}

/* ---- Quest ---- */
static void step_quest(sfi_policy *p, int layer, head_state *s, int kvh,
                       const sfi_policy_step *st, int B, sfi_policy_set *out)
{
    int n_ctx = st->n_ctx, page = p->cfg.quest_page;
    unmark_all(s);
    if (layer < p->cfg.quest_dense_layers) {
        set_dense(out, n_ctx);
        return;
    }
    int n_pages = (n_ctx + page - 1) / page;
    int P = B / page;
    if (P < 1)
        P = 1;
    if (P >= n_pages) {
        set_all(out, n_ctx);
        return;
    }
    float *sc = p->fbuf;
    sfi_policy_quest_scores(st->q, st->k, n_ctx, p->sh.n_heads, p->H, p->sh.head_dim, kvh, page,
                            sc);
    vi *t = p->vbuf;
    for (int g = 0; g < n_pages; g++)
        t[g].v = sc[g], t[g].i = g;
    qsort(t, (size_t)n_pages, sizeof *t, cmp_vi_desc);
    for (int i = 0; i < P; i++) {
        int g = t[i].i;
        for (int32_t j = g * page; j < (g + 1) * page && j < n_ctx; j++)
            mark(s, j);
    }
    set_marked(s, n_ctx, 0, out);
}

/* ---- LFPS ---- */

/* Adds keys [s->absorbed, n_ctx) past the kept first tokens to the key
 * statistics of the sink-share prior. */
static void lfps_absorb(sfi_policy *p, head_state *s, const float *k, int kvh, int n_ctx)
{
    int d = p->sh.head_dim, keep = p->cfg.lfps_keep;
    size_t row = (size_t)p->H * d;
    for (int j = s->absorbed > keep ? s->absorbed : keep; j < n_ctx; j++) {
        const float *kj = k + (size_t)j * row + (size_t)kvh * d;
        for (int a = 0; a < d; a++) {
            s->ksum[a] += kj[a];
            double *r = s->kkt + (size_t)a * d;
            for (int b = 0; b < d; b++)
                r[b] += (double)kj[a] * kj[b];
        }
        s->kn += 1.0;
    }
    if (n_ctx > s->absorbed)
        s->absorbed = n_ctx;
}

/* The sink share estimated before selecting: the kept first tokens'
 * logits exactly, the others' partition function from a log-normal prior
 * (the logits of the other keys taken as normal with the mean and
 * variance that the keys' mean and covariance give for this query:
 * E[sum e^l] = n e^(mu + sigma^2/2)); mean over the group. */
static double lfps_sink_share_qk(sfi_policy *p, head_state *s, const float *q, const float *k,
                                 int kvh, int n_ctx)
{
    int d = p->sh.head_dim, keep = p->cfg.lfps_keep < n_ctx ? p->cfg.lfps_keep : n_ctx;
    if (keep < 1)
        return 0.0;
    if (keep >= n_ctx || s->kn < 1.0)
        return 1.0;
    float scale = sfi_attn_scale(d);
    size_t row = (size_t)p->H * d;
    double share = 0.0;
    for (int g = 0; g < p->G; g++) {
        const float *qh = q + (size_t)(kvh * p->G + g) * d;
        float mx = -1e30f, z = 0.0f;
        float ls[64];
        int nk = keep < 64 ? keep : 64;
        for (int j = 0; j < nk; j++) {
            ls[j] = sfi_dot(qh, k + (size_t)j * row + (size_t)kvh * d, (size_t)d) * scale;
            if (ls[j] > mx)
                mx = ls[j];
        }
        for (int j = 0; j < nk; j++)
            z += sfi_expf(ls[j] - mx);
        double log_zs = mx + sfi_logf(z);
        double mu = 0.0, var = 0.0;
        for (int a = 0; a < d; a++)
            mu += qh[a] * (s->ksum[a] / s->kn);
        for (int a = 0; a < d; a++) {
            double ma = s->ksum[a] / s->kn, acc = 0.0;
            for (int b = 0; b < d; b++)
                acc += (s->kkt[(size_t)a * d + b] / s->kn - ma * (s->ksum[b] / s->kn)) * qh[b];
            var += qh[a] * acc;
        }
        mu *= scale;
        var *= (double)scale * scale;
        if (var < 0.0)
            var = 0.0;
        double log_zr = sfi_logf((float)(n_ctx - keep)) + mu + var / 2.0;
        double x = log_zr - log_zs;
        share += x > 80.0 ? 0.0 : x < -80.0 ? 1.0 : 1.0 / (1.0 + sfi_expf((float)x));
    }
    return share / p->G;
}

static void lfps_cand(sfi_policy *p, head_state *s, int32_t j, int n_ctx, int *nc, int id)
{
    if (j < 0 || j >= n_ctx || p->stampv[j] == id)
        return;
    p->stampv[j] = id;
    s->cand[(*nc)++] = j;
}

/* Seeds the tables from the attention w_t of prompt queries at positions
 * pos_t: Phi(i) += w_t(i) / (2 s (1 - r)) (vertical by position, slash by
 * offset pos_t - i), never negative. */
static void lfps_seed(sfi_policy *p, head_state *s, const float *w, int n, int pos, int n_s)
{
    double f = 1.0 / (2.0 * n_s * (1.0 - p->cfg.lfps_r));
    for (int j = 0; j < n; j++) {
        s->ver[j] += w[j] * f;
        s->sla[pos - j] += w[j] * f;
    }
}

static void step_lfps(sfi_policy *p, layer_state *l, int kvh, const sfi_policy_step *st, int B,
                      sfi_policy_set *out)
{
    head_state *s = &l->hs[kvh];
    int n_ctx = st->n_ctx, real = st->q && st->k;
    const sfi_policy_obs *o = st->obs ? &st->obs[kvh] : NULL;
    int keep = p->cfg.lfps_keep < n_ctx ? p->cfg.lfps_keep : n_ctx;
    unmark_all(s);
    if (real)
        lfps_absorb(p, s, st->k, kvh, n_ctx);
    if (!l->seeded && !l->started) {
        /* No prompt observation: this step is dense and its attention
         * seeds the tables as one prompt query would. */
        note(p, "tables seeded from the first decode step (dense) instead of the last s "
                "prompt queries");
        if (real) {
            pooled_probs(p, st->q, st->k, kvh, NULL, n_ctx, p->fbuf);
        } else {
            for (int j = 0; j < n_ctx; j++)
                p->fbuf[j] = 0.0f;
            for (int i = 0; i < o->n_top; i++)
                p->fbuf[o->pos[i]] = o->prob[i];
        }
        lfps_seed(p, s, p->fbuf, n_ctx, n_ctx - 1, 1);
        s->n_cand = n_ctx;
        set_dense(out, n_ctx);
        return;
    }
    /* Sink bypass, decided before selecting. */
    double sink;
    if (real) {
        sink = lfps_sink_share_qk(p, s, st->q, st->k, kvh, n_ctx);
    } else {
        note(p, "sink share read from the recorded attention instead of the log-normal prior");
        sink = 0.0;
        for (int i = 0; i < o->n_top; i++)
            if (o->pos[i] < keep)
                sink += o->prob[i];
    }
    for (int j = 0; j < keep; j++)
        mark(s, j);
    if (sink > p->cfg.lfps_sink_share) {
        /* the sink-weighted value: attention over the kept first tokens;
         * the tables are not updated */
        s->n_cand = 0;
        set_marked(s, n_ctx, 0, out);
        return;
    }
    /* Candidates from both tables, then the expansion by {-1, 0, 1, 2}
     * where a neighbour's vertical or slash score exceeds that table's
     * mean. */
    double mv, kv_, ms, ks;
    sfi_policy_lfps_moments(s->ver, n_ctx, &mv, &kv_);
    sfi_policy_lfps_moments(s->sla, n_ctx, &ms, &ks);
    double tv = kv_ > 0.0 ? p->cfg.lfps_a * mv / kv_ : 1e300;
    double ts = ks > 0.0 ? p->cfg.lfps_a * ms / ks : 1e300;
    int id = ++p->stamp_id, nc = 0;
    for (int32_t j = 0; j < n_ctx; j++)
        if (s->ver[j] > tv || s->sla[n_ctx - 1 - j] > ts)
            lfps_cand(p, s, j, n_ctx, &nc, id);
    int base = nc;
    for (int i = 0; i < base; i++)
        for (int dlt = -1; dlt <= 2; dlt++) {
            int32_t x = s->cand[i] + dlt;
            if (dlt == 0 || x < 0 || x >= n_ctx)
                continue;
            if (s->ver[x] > mv || s->sla[n_ctx - 1 - x] > ms)
                lfps_cand(p, s, x, n_ctx, &nc, id);
        }
    s->n_cand = nc;
    /* Exact top-(B - kept) inside the candidates past the kept tokens. */
    int m = 0;
    for (int i = 0; i < nc; i++)
        if (s->cand[i] >= keep)
            p->ibuf[m++] = s->cand[i];
    int room = B - keep > 0 ? B - keep : 0;
    if (m > room) {
        vi *t = p->vbuf;
        if (real) {
            pooled_probs(p, st->q, st->k, kvh, p->ibuf, m, p->fbuf);
            for (int i = 0; i < m; i++)
                t[i].v = p->fbuf[i], t[i].i = p->ibuf[i];
        } else {
            /* recorded probabilities; unrecorded ones after, earlier first */
            for (int i = 0; i < m; i++)
                p->fbuf2[p->ibuf[i]] = -1.0f;
            for (int i = 0; i < o->n_top; i++)
                p->fbuf2[o->pos[i]] = o->prob[i];
            for (int i = 0; i < m; i++)
                t[i].v = p->fbuf2[p->ibuf[i]], t[i].i = p->ibuf[i];
        }
        qsort(t, (size_t)m, sizeof *t, cmp_vi_desc);
        m = room;
        for (int i = 0; i < m; i++)
            p->ibuf[i] = t[i].i;
    }
    for (int i = 0; i < m; i++)
        mark(s, p->ibuf[i]);
    set_marked(s, n_ctx, 0, out);
    /* Weights over the final set C (its own sparse attention), then the
     * table updates: Phi <- r Phi + w - 1/(2|C|) on C, r Phi elsewhere. */
    int nC = s->n_marked;
    double r = p->cfg.lfps_r, base_w = 1.0 / (2.0 * nC);
    for (int32_t j = 0; j < n_ctx; j++) {
        s->ver[j] *= r;
        s->sla[j] *= r;
    }
    if (real) {
        pooled_probs(p, st->q, st->k, kvh, s->marked, nC, p->fbuf);
    } else {
        double R = sfi_policy_set_recall(out, o, 0, NULL, NULL, NULL);
        int rest = o->n_ctx - o->n_top;
        double tail_each = rest > 0 ? (double)o->tail / rest : 0.0;
        if (R <= 0.0)
            R = 1.0;
        for (int i = 0; i < nC; i++)
            p->fbuf2[s->marked[i]] = (float)tail_each;
        for (int i = 0; i < o->n_top; i++)
            if (bit_get(s->bits, o->pos[i]))
                p->fbuf2[o->pos[i]] = o->prob[i];
        for (int i = 0; i < nC; i++)
            p->fbuf[i] = (float)(p->fbuf2[s->marked[i]] / R);
    }
    for (int i = 0; i < nC; i++) {
        int32_t j = s->marked[i];
        s->ver[j] += p->fbuf[i] - base_w;
        s->sla[n_ctx - 1 - j] += p->fbuf[i] - base_w;
    }
    /* The slash table moves with the query: next step's offset o is this
     * step's o - 1 shifted; storing by offset from the current position
     * does that by itself. */
}

/* ---- FASA ---- */

/* Stand-in calibration on one step: the chunks whose single-chunk top-K
 * agrees most with the full score's top-K, K = min(fasa_calib_k, n/2). */
static sfi_status fasa_calibrate_one(sfi_policy *p, head_state *s, const float *q,
                                     const float *k, int kvh, int n_ctx, sfi_error *err)
{
    int d = p->sh.head_dim, half = d / 2, K = p->cfg.fasa_calib_k;
    if (K > n_ctx / 2)
        K = n_ctx / 2 > 0 ? n_ctx / 2 : 1;
    sfi_policy_fasa_scores(q, k, n_ctx, p->sh.n_heads, p->H, d, kvh, NULL, half, p->fbuf);
    sfi_status st = sfi_topk(p->fbuf, n_ctx, K, p->ibuf2, err);
    if (st)
        return st;
    uint8_t *mk = (uint8_t *)p->lg;
    memset(mk, 0, (size_t)n_ctx);
    for (int i = 0; i < K; i++)
        mk[p->ibuf2[i]] = 1;
    float agree[512];
    for (int c = 0; c < half && c < 512; c++) {
        sfi_policy_fasa_scores(q, k, n_ctx, p->sh.n_heads, p->H, d, kvh, &c, 1, p->fbuf);
        if ((st = sfi_topk(p->fbuf, n_ctx, K, p->ibuf, err)))
            return st;
        int ov = 0;
        for (int i = 0; i < K; i++)
            ov += mk[p->ibuf[i]];
        agree[c] = (float)ov;
    }
    s->n_tip = sfi_policy_fasa_tip(&p->cfg, d);
    if ((st = sfi_topk(agree, half < 512 ? half : 512, s->n_tip, p->ibuf, err)))
        return st;
    for (int i = 0; i < s->n_tip; i++)
        s->tip[i] = p->ibuf[i];
    return SFI_OK;
}

static sfi_status step_fasa(sfi_policy *p, int layer, layer_state *l, int kvh,
                            const sfi_policy_step *st, int B, sfi_policy_set *out,
                            sfi_error *err)
{
    head_state *s = &l->hs[kvh];
    int n_ctx = st->n_ctx;
    if (!l->fasa_ready) {
        const sfi_policy_calib *c = p->calib;
        if (c && c->has_fasa) {
            s->n_tip = c->n_tip;
            memcpy(s->tip, c->tip + ((size_t)layer * p->H + kvh) * c->n_tip,
                   sizeof(int) * (size_t)c->n_tip);
            if (c->leaks)
                note(p, "calibrated on the evaluated data");
        } else {
            note(p, "calibrated on the first step's query of the evaluated request");
            sfi_status e = fasa_calibrate_one(p, s, st->q, st->k, kvh, n_ctx, err);
            if (e)
                return e;
        }
        if (kvh == p->H - 1)
            l->fasa_ready = 1;
    }
    unmark_all(s);
    if (B >= n_ctx) {
        set_all(out, n_ctx);
        return SFI_OK;
    }
    sfi_policy_fasa_scores(st->q, st->k, n_ctx, p->sh.n_heads, p->H, p->sh.head_dim, kvh, s->tip,
                           s->n_tip, p->fbuf);
    sfi_status e = sfi_topk(p->fbuf, n_ctx, B, p->ibuf, err);
    if (e)
        return e;
    for (int i = 0; i < B; i++)
        mark(s, p->ibuf[i]);
    set_marked(s, n_ctx, 0, out);
    return SFI_OK;
}

/* ---- SFI and its trigger variants ---- */

static sfi_status sfi_ensure_logits(sfi_policy *p, size_t need, sfi_error *err)
{
    if (need <= p->logits_cap)
        return SFI_OK;
    float *nl = realloc(p->logits, sizeof(float) * need);
    if (!nl)
        return sfi_error_set(err, SFI_ENOMEM, "sfi: out of memory for logits");
    p->logits = nl;
    float *nn = realloc(p->norms, sizeof(float) * need);
    if (!nn)
        return sfi_error_set(err, SFI_ENOMEM, "sfi: out of memory for key norms");
    p->norms = nn;
    p->logits_cap = need;
    return SFI_OK;
}

/* Runs the Selector over in (logits laid out [H][n_win][n_pos]) and
 * stores every head's selection. */
static sfi_status sfi_select(sfi_policy *p, layer_state *l, int n_win, int n_pos,
                             const sfi_params *prm, sfi_error *err)
{
    int H = p->H, jb, je;
    sfi_state_candidates(prm, n_pos, &jb, &je);
    for (int h = 0; h < H; h++) {
        head_state *s = &l->hs[h];
        for (int i = 0; i < s->n_sel; i++)
            bit_clr(s->bits, s->sel[i]);
        s->n_sel = 0;
    }
    if (je <= jb)
        return SFI_OK;
    sfi_params q = *prm;
    sfi_selector_input in = {
        .n_kv_heads = H, .n_win = n_win, .n_pos = n_pos, .j_begin = jb, .j_end = je,
        .logits = p->logits, .key_norms = p->norms,
    };
    int kk = q.K < je - jb ? q.K : je - jb;
    int32_t *tmp = malloc(sizeof(int32_t) * (size_t)H * kk);
    if (!tmp)
        return sfi_error_set(err, SFI_ENOMEM, "sfi: out of memory");
    int n_sel = 0;
    sfi_status e = sfi_selector_run(&q, &in, tmp, &n_sel, NULL, err);
    if (!e)
        for (int h = 0; h < H; h++) {
            head_state *s = &l->hs[h];
            memcpy(s->sel, tmp + (size_t)h * n_sel, sizeof(int32_t) * (size_t)n_sel);
            s->n_sel = n_sel;
            for (int i = 0; i < n_sel; i++)
                bit_set(s->bits, s->sel[i]);
        }
    free(tmp);
    return e;
}

/* Key norms of a layer's keys into p->norms [H][n]. */
static void sfi_norms(sfi_policy *p, const float *k, int n)
{
    sfi_key_norms(k, n, p->H, p->sh.head_dim, p->norms);
}

static sfi_status step_sfi(sfi_policy *p, layer_state *l, const sfi_policy_step *st, int B,
                           sfi_policy_set *sets, int *slow, sfi_error *err)
{
    sfi_step_reason why;
    sfi_step_kind kind = sfi_trigger_next(&l->tp, st->prev_trigger ? 1 : 0, &why);
    int H = p->H, n_ctx = st->n_ctx;
    /* The budget's split into recent and selected (sfi_budget_sfi_split). */
    sfi_params sp = p->cfg.prm;
    sfi_budget_sfi_split(&p->cfg.prm, B, n_ctx, &sp.n_recent, &sp.K);
    const sfi_params *prm = &sp;
    int sink_end = prm->n_sink < n_ctx ? prm->n_sink : n_ctx;
    int rb = n_ctx - prm->n_recent > sink_end ? n_ctx - prm->n_recent : sink_end;
    if (kind == SFI_STEP_SLOW) {
        *slow = 1;
        if (!st->next_unused) {
            int real = st->q && st->k;
            int G = real ? p->G : st->qobs && st->q_per_kv > 0 ? st->q_per_kv : 1;
            sfi_status e = sfi_ensure_logits(p, (size_t)H * G * n_ctx, err);
            if (e)
                return e;
            if (real) {
                /* The step's dense logits: the G query heads are the
                 * window queries (W_decode = 1). */
                for (int h = 0; h < H; h++)
                    group_logits(p, st->q, st->k, h, NULL, n_ctx,
                                 p->logits + (size_t)h * G * n_ctx);
                sfi_norms(p, st->k, n_ctx);
            } else {
                /* The trace's top-M probabilities as logits (log p);
                 * positions outside the entries share the tail evenly.
                 * With the group's query-head records each query head is
                 * one window query (sfi(7) SELECTOR); otherwise the
                 * pooled record is the one window query. */
                for (int h = 0; h < H; h++) {
                    for (int g = 0; g < G; g++) {
                        const sfi_policy_obs *o = st->qobs && st->q_per_kv > 0
                                                      ? &st->qobs[(size_t)h * G + g]
                                                      : &st->obs[h];
                        float *lg = p->logits + ((size_t)h * G + g) * n_ctx;
                        int rest = o->n_ctx - o->n_top;
                        float floor_lg = -80.0f;
                        float tl = rest > 0 && o->tail > 0.0f ? sfi_logf(o->tail / (float)rest)
                                                              : floor_lg;
                        for (int j = 0; j < n_ctx; j++)
                            lg[j] = tl;
                        for (int i = 0; i < o->n_top; i++)
                            if (o->pos[i] < n_ctx)
                                lg[o->pos[i]] = o->prob[i] > 0.0f ? sfi_logf(o->prob[i])
                                                                  : floor_lg;
                    }
                    for (int j = 0; j < n_ctx; j++)
                        p->norms[(size_t)h * n_ctx + j] = 1.0f;
                }
            }
            if ((e = sfi_select(p, l, G, n_ctx, prm, err)))
                return e;
        }
        for (int h = 0; h < H; h++)
            set_dense(&sets[h], n_ctx);
        return SFI_OK;
    }
    *slow = 0;
    for (int h = 0; h < H; h++) {
        head_state *s = &l->hs[h];
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
        sfi_policy_set *o = &sets[h];
        memset(o, 0, sizeof *o);
        o->n_ctx = n_ctx;
        o->sink_end = sink_end;
        o->recent_begin = rb;
        o->bits = s->bits;
        o->size = sink_end + (n_ctx - rb) + lo;
    }
    return SFI_OK;
}

/* ---- Kascade ---- */
static sfi_status step_kascade(sfi_policy *p, int layer, layer_state *l, int kvh,
                               const sfi_policy_step *st, int B, sfi_policy_set *out,
                               sfi_error *err)
{
    head_state *s = &l->hs[kvh];
    int n_ctx = st->n_ctx, sl = p->src_layer[layer];
    int sh = p->src_head[(size_t)layer * p->H + kvh];
    int real = st->q && st->k;
    if (sl < 0) {
        unmark_all(s);
        set_dense(out, n_ctx);
        return SFI_OK;
    }
    if (sl == layer)
        return real ? set_topb_qk(p, s, st->q, st->k, kvh, n_ctx, B, out, err)
                    : (set_topb_obs(s, &st->obs[kvh], n_ctx, B, out), SFI_OK);
    /* Reuse: the anchor's set of this step, from this object when it ran
     * the anchor, else recomputed from the anchor's inputs. */
    layer_state *al = p->ls[sl];
    unmark_all(s);
    if (al && al->epoch == p->epoch && al->last_step == st->step) {
        const sfi_policy_set *as = &al->sets[sh];
        if (as->n_ctx != n_ctx) {
            return sfi_error_set(err, SFI_EINVAL, "policy kascade: layer %d's set is for a "
                                 "context of %d, layer %d's step has %d", sl, as->n_ctx, layer,
                                 n_ctx);
        }
        if (as->sink_end >= n_ctx) {
            set_all(out, n_ctx);
            return SFI_OK;
        }
        const head_state *ah = &al->hs[sh];
        for (int i = 0; i < ah->n_marked; i++)
            mark(s, ah->marked[i]);
        set_marked(s, n_ctx, ah->n_virtual, out);
        return SFI_OK;
    }
    if (real && st->layer_qk) {
        const float *aq = NULL, *ak = NULL;
        if (!st->layer_qk(st->layer_ctx, sl, &aq, &ak) || !aq || !ak)
            return sfi_error_set(err, SFI_EINVAL, "policy kascade: layer %d needs layer %d's q "
                                 "and K of the same step", layer, sl);
        return set_topb_qk(p, s, aq, ak, sh, n_ctx, B, out, err);
    }
    const sfi_policy_obs *so = st->layer_obs ? st->layer_obs(st->layer_ctx, sl, sh) : NULL;
    if (!so)
        return sfi_error_set(err, SFI_EINVAL, "policy kascade: layer %d needs layer %d's "
                             "attention of the same step", layer, sl);
    set_topb_obs(s, so, n_ctx, B, out);
    return SFI_OK;
}

/* ---------------------------------------------------------------- */
/* The prompt                                                          */

sfi_status sfi_policy_prompt_run(sfi_policy *p, int layer, const sfi_policy_prompt *pr,
                                 sfi_error *err)
{
    layer_state *l;
    sfi_status st = layer_get(p, layer, &l, err);
    if (st)
        return st;
    int n = pr->n_prompt, d = p->sh.head_dim, G = p->G, H = p->H;
    if (n < 1 || n > p->max_ctx || pr->n_tail < 0 || pr->n_tail > n || !pr->k ||
        (pr->n_tail > 0 && !pr->q_tail) || d < 2)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: bad prompt (%d positions, %d tail "
                             "queries, head_dim %d, max context %d)", kinds[p->kind].name, n,
                             pr->n_tail, d, p->max_ctx);
    if (l->started)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: the prompt comes before the first "
                             "step", kinds[p->kind].name);
    size_t qn = (size_t)p->sh.n_heads * d;
    int first_tail = n - pr->n_tail;
    switch (p->kind) {
    case SFI_POLICY_H2O:
        for (int h = 0; h < H; h++) {
            head_state *s = &l->hs[h];
            if (pr->colsum) {
                for (int j = 0; j < n; j++) {
                    double a = 0.0;
                    for (int g = 0; g < G; g++)
                        a += pr->colsum[(size_t)(h * G + g) * n + j];
                    s->score[j] = a / G;
                }
            } else {
                note(p, "prompt attention accumulated over the recorded tail queries only");
                for (int t = 0; t < pr->n_tail; t++) {
                    int np = first_tail + t + 1;
                    pooled_probs(p, pr->q_tail + (size_t)t * qn, pr->k, h, NULL, np, p->fbuf);
                    for (int j = 0; j < np; j++)
                        s->score[j] += p->fbuf[j];
                }
            }
            /* After the prefill: heavy hitters among the prompt, recent
             * window at its end (the first step's budget sets the split). */
            s->rb = 0;
        }
        l->seeded = 1;
        break;
    case SFI_POLICY_SNAPKV: {
        int w = p->cfg.snapkv_window < n ? p->cfg.snapkv_window : n;
        if (w > pr->n_tail) {
            note(p, "observation window shorter than snapkv_window (fewer recorded prompt "
                    "queries)");
            w = pr->n_tail;
        }
        int P = n - w;
        for (int h = 0; h < H; h++) {
            for (int j = 0; j < P; j++)
                p->fbuf[j] = 0.0f;
            for (int t = pr->n_tail - w; t < pr->n_tail; t++) {
                int np = first_tail + t + 1;
                pooled_probs(p, pr->q_tail + (size_t)t * qn, pr->k, h, NULL, np, p->fbuf2);
                for (int j = 0; j < P; j++)
                    p->fbuf[j] += p->fbuf2[j];
            }
            snapkv_rank(p, &l->hs[h], P);
        }
        l->seeded = 1;
        break;
    }
    case SFI_POLICY_LFPS: {
        int ns = p->cfg.lfps_s < pr->n_tail ? p->cfg.lfps_s : pr->n_tail;
        if (ns < p->cfg.lfps_s)
            note(p, "tables seeded from fewer than lfps_s prompt queries");
        for (int h = 0; h < H; h++) {
            head_state *s = &l->hs[h];
            for (int t = pr->n_tail - ns; t < pr->n_tail; t++) {
                int np = first_tail + t + 1;
                pooled_probs(p, pr->q_tail + (size_t)t * qn, pr->k, h, NULL, np, p->fbuf);
                lfps_seed(p, s, p->fbuf, np, np - 1, ns);
            }
            lfps_absorb(p, s, pr->k, h, n);
        }
        l->seeded = ns > 0;
        break;
    }
    case SFI_POLICY_SFI:
    case SFI_POLICY_TMAX:
    case SFI_POLICY_INTERVAL:
    case SFI_POLICY_BOUNDARY: {
        /* Step 0 (the prompt's last position) is slow: the Selector over
         * the last W_prefill prompt queries, as ref/sfi_decode.c does. */
        sfi_step_reason why;
        sfi_trigger_next(&l->tp, 0, &why);
        int W = p->cfg.prm.W_prefill < pr->n_tail ? p->cfg.prm.W_prefill : pr->n_tail;
        if (W < 1)
            break;
        int nw = W * G;
        if ((st = sfi_ensure_logits(p, (size_t)H * nw * n, err)))
            return st;
        for (int h = 0; h < H; h++)
            for (int w = 0; w < W; w++) {
                int t = pr->n_tail - W + w, np = first_tail + t + 1;
                group_logits(p, pr->q_tail + (size_t)t * qn, pr->k, h, NULL, np, p->lg);
                for (int g = 0; g < G; g++) {
                    float *row = p->logits + ((size_t)h * nw + (size_t)w * G + g) * n;
                    memcpy(row, p->lg + (size_t)g * np, sizeof(float) * (size_t)np);
                    for (int j = np; j < n; j++)
                        row[j] = -(float)INFINITY;
                }
            }
        sfi_norms(p, pr->k, n);
        int B = pr->budget > 0 ? pr->budget
                               : p->cfg.prm.n_sink + p->cfg.prm.K + p->cfg.prm.n_recent;
        sfi_params sp = p->cfg.prm;
        sfi_budget_sfi_split(&p->cfg.prm, B, n, &sp.n_recent, &sp.K);
        if ((st = sfi_select(p, l, nw, n, &sp, err)))
            return st;
        break;
    }
    default:
        break;
    }
    l->prompted = 1;
    return SFI_OK;
}

/* ---------------------------------------------------------------- */
/* A step                                                              */

sfi_status sfi_policy_run(sfi_policy *p, int layer, const sfi_policy_step *st,
                          sfi_policy_set *sets, int *available, int *slow, sfi_error *err)
{
    int n_ctx = st->n_ctx, B = st->budget;
    int dummy_slow = 0;
    if (!slow)
        slow = &dummy_slow;
    *slow = 0;
    *available = 1;
    layer_state *l;
    sfi_status e = layer_get(p, layer, &l, err);
    if (e)
        return e;
    const char *nm = kinds[p->kind].name;
    if (n_ctx < 1 || n_ctx > p->max_ctx)
        return sfi_error_set(err, SFI_ERANGE, "policy %s: context %d outside 1..%d", nm, n_ctx,
                             p->max_ctx);
    if (B < 1)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: budget %d < 1", nm, B);
    int real = st->q && st->k && p->sh.head_dim >= 2;
    if (!real && !st->obs)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: a step needs q and K or recorded "
                             "attention", nm);
    if (sfi_policy_needs_qk(p->kind) && !real) {
        *available = 0;
        return SFI_OK;
    }
    sfi_policy_step s2 = *st;
    if (!real)
        s2.q = s2.k = NULL;
    st = &s2;
    if (sfi_policy_has_slow_steps(p->kind)) {
        e = step_sfi(p, l, st, B, sets, slow, err);
    } else {
        for (int h = 0; h < p->H && !e; h++) {
            head_state *s = &l->hs[h];
            sfi_policy_set *out = &sets[h];
            switch (p->kind) {
            case SFI_POLICY_ORACLE:
                if (real)
                    e = set_topb_qk(p, s, st->q, st->k, h, n_ctx, B, out, err);
                else
                    set_topb_obs(s, &st->obs[h], n_ctx, B, out);
                break;
            case SFI_POLICY_FULL:
                set_dense(out, n_ctx);
                break;
            case SFI_POLICY_STREAMING: {
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
            case SFI_POLICY_H2O:
                step_h2o(p, l, h, st, B, out);
                break;
            case SFI_POLICY_SNAPKV:
                step_snapkv(p, l, h, st, B, out);
                break;
            case SFI_POLICY_QUEST:
                step_quest(p, layer, s, h, st, B, out);
                break;
            case SFI_POLICY_LFPS:
                step_lfps(p, l, h, st, B, out);
                break;
            case SFI_POLICY_KASCADE:
                e = step_kascade(p, layer, l, h, st, B, out, err);
                break;
            case SFI_POLICY_FASA:
                e = step_fasa(p, layer, l, h, st, B, out, err);
                break;
            default:
                e = sfi_error_set(err, SFI_EINVAL, "policy: bad kind");
                break;
            }
        }
    }
    if (e)
        return e;
    l->started = 1;
    l->epoch = p->epoch;
    l->last_step = st->step;
    memcpy(l->sets, sets, sizeof(sfi_policy_set) * (size_t)p->H);
    return SFI_OK;
}
