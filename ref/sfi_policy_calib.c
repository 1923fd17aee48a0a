/* Calibration of Kascade and FASA (see sfi_policy_calib.h). */
#include <config.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_policy_calib.h"
#include "sfi_policies.h"
#include "sfi_attention.h"
#include "sfi_io.h"
#include "sfi_math.h"
#include "sfi_selector.h"

void sfi_policy_calib_free(sfi_policy_calib *c)
{
    if (!c)
        return;
    free(c->source);
    free(c->sim);
    free(c->head);
    free(c->weight);
    free(c->tip);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- */
/* JSON                                                              */

char *sfi_policy_calib_to_json(const sfi_policy_calib *c)
{
    int L = c->n_layers, H = c->n_kv_heads;
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "format", json_string("sfi-policy-calibration"));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "source", json_string(c->source ? c->source : ""));
    json_object_set_new(o, "n_layers", json_integer(L));
    json_object_set_new(o, "n_kv_heads", json_integer(H));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    if (c->has_kascade) {
        json_t *k = json_object(), *w = json_array(), *s = json_array(), *hm = json_array();
        for (int a = 0; a < L; a++) {
            json_array_append_new(w, json_real(c->weight[a]));
            json_t *row = json_array(), *hrow = json_array();
            for (int b = 0; b < L; b++) {
                json_array_append_new(row, json_real(c->sim[(size_t)a * L + b]));
                json_t *hh = json_array();
                for (int h = 0; h < H; h++)
                    json_array_append_new(hh, json_integer(c->head[((size_t)a * L + b) * H + h]));
                json_array_append_new(hrow, hh);
            }
            json_array_append_new(s, row);
            json_array_append_new(hm, hrow);
        }
        json_object_set_new(k, "k", json_integer(c->kascade_k));
        json_object_set_new(k, "weight", w);
        json_object_set_new(k, "sim", s);
        json_object_set_new(k, "head", hm);
        json_object_set_new(o, "kascade", k);
    }
    if (c->has_fasa) {
        json_t *f = json_object(), *t = json_array();
        for (int l = 0; l < L; l++) {
            json_t *lr = json_array();
            for (int h = 0; h < H; h++) {
                json_t *hr = json_array();
                for (int i = 0; i < c->n_tip; i++)
                    json_array_append_new(hr, json_integer(c->tip[((size_t)l * H + h) * c->n_tip + i]));
                json_array_append_new(lr, hr);
            }
            json_array_append_new(t, lr);
        }
        json_object_set_new(f, "k", json_integer(c->fasa_k));
        json_object_set_new(f, "n_tip", json_integer(c->n_tip));
        json_object_set_new(f, "tip", t);
        json_object_set_new(o, "fasa", f);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(o);
    return s;
}

static int get_int(json_t *o, const char *key, int lo, int hi, int *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return -1;
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_num(json_t *v, double lo, double hi, double *out)
{
    if (!json_is_number(v))
        return -1;
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return -1;
    *out = x;
    return 0;
}

sfi_status sfi_policy_calib_from_json(const char *text, const char *origin, sfi_policy_calib *c,
                                      sfi_error *err)
{
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o)
        return sfi_error_set(err, SFI_EFORMAT, "%s: not JSON (line %d: %s)", origin, je.line,
                             je.text);
    sfi_status st = SFI_OK;
    json_t *fmt = json_object_get(o, "format");
    int ver = 0;
    if (!json_is_object(o) || !json_is_string(fmt) ||
        strcmp(json_string_value(fmt), "sfi-policy-calibration")) {
        st = sfi_error_set(err, SFI_EFORMAT, "%s: not a policy calibration (format)", origin);
        goto out;
    }
    if (get_int(o, "version", 1, 1000, &ver) || ver != 1) {
        st = sfi_error_set(err, SFI_EVERSION, "%s: calibration version %d, this sfi reads 1",
                           origin, ver);
        goto out;
    }
    int L, H, d;
    if (get_int(o, "n_layers", 1, 4096, &L) || get_int(o, "n_kv_heads", 1, 4096, &H) ||
        get_int(o, "head_dim", 0, 65536, &d)) {
        st = sfi_error_set(err, SFI_EFORMAT, "%s: n_layers, n_kv_heads or head_dim missing or "
                           "out of range", origin);
        goto out;
    }
    c->n_layers = L;
    c->n_kv_heads = H;
    c->head_dim = d;
    json_t *src = json_object_get(o, "source");
    c->source = strdup(json_is_string(src) ? json_string_value(src) : "");
    if (!c->source) {
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", origin);
        goto out;
    }
    json_t *k = json_object_get(o, "kascade");
    if (k) {
        json_t *w = json_object_get(k, "weight"), *s = json_object_get(k, "sim"),
               *hm = json_object_get(k, "head");
        if (!json_is_object(k) || get_int(k, "k", 1, 1 << 24, &c->kascade_k) ||
            !json_is_array(w) || json_array_size(w) != (size_t)L || !json_is_array(s) ||
            json_array_size(s) != (size_t)L || !json_is_array(hm) ||
            json_array_size(hm) != (size_t)L) {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: kascade: k, weight, sim or head missing "
                               "or not of %d layers", origin, L);
            goto out;
        }
        c->sim = malloc(sizeof(double) * (size_t)L * L);
        c->weight = malloc(sizeof(double) * (size_t)L);
        c->head = malloc(sizeof(int) * (size_t)L * L * H);
        if (!c->sim || !c->weight || !c->head) {
            st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", origin);
            goto out;
        }
        for (int a = 0; a < L; a++) {
            json_t *row = json_array_get(s, (size_t)a), *hrow = json_array_get(hm, (size_t)a);
            if (get_num(json_array_get(w, (size_t)a), 0.0, 2.0, &c->weight[a]) ||
                !json_is_array(row) || json_array_size(row) != (size_t)L ||
                !json_is_array(hrow) || json_array_size(hrow) != (size_t)L) {
                st = sfi_error_set(err, SFI_EFORMAT, "%s: kascade: layer %d: bad weight, sim "
                                   "or head row", origin, a);
                goto out;
            }
            for (int b = 0; b < L; b++) {
                json_t *hh = json_array_get(hrow, (size_t)b);
                if (get_num(json_array_get(row, (size_t)b), 0.0, 1.0,
                            &c->sim[(size_t)a * L + b]) ||
                    !json_is_array(hh) || json_array_size(hh) != (size_t)H) {
                    st = sfi_error_set(err, SFI_EFORMAT, "%s: kascade: sim[%d][%d] outside "
                                       "[0,1] or head map not of %d heads", origin, a, b, H);
                    goto out;
                }
                for (int h = 0; h < H; h++) {
                    json_t *v = json_array_get(hh, (size_t)h);
                    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                        json_integer_value(v) >= H) {
                        st = sfi_error_set(err, SFI_EFORMAT, "%s: kascade: head[%d][%d][%d] "
                                           "is not a KV head", origin, a, b, h);
                        goto out;
                    }
                    c->head[((size_t)a * L + b) * H + h] = (int)json_integer_value(v);
                }
            }
        }
        c->has_kascade = 1;
    }
    json_t *f = json_object_get(o, "fasa");
    if (f) {
        json_t *t = json_object_get(f, "tip");
        int half = d / 2;
        if (!json_is_object(f) || get_int(f, "k", 1, 1 << 24, &c->fasa_k) ||
            get_int(f, "n_tip", 1, half > 0 ? half : 1, &c->n_tip) || d < 2 ||
            !json_is_array(t) || json_array_size(t) != (size_t)L) {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: fasa: k, n_tip (1..head_dim/2) or tip "
                               "missing or not of %d layers", origin, L);
            goto out;
        }
        c->tip = malloc(sizeof(int) * (size_t)L * H * c->n_tip);
        if (!c->tip) {
            st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", origin);
            goto out;
        }
        for (int l = 0; l < L; l++) {
            json_t *lr = json_array_get(t, (size_t)l);
            if (!json_is_array(lr) || json_array_size(lr) != (size_t)H) {
                st = sfi_error_set(err, SFI_EFORMAT, "%s: fasa: layer %d: not %d heads", origin,
                                   l, H);
                goto out;
            }
            for (int h = 0; h < H; h++) {
                json_t *hr = json_array_get(lr, (size_t)h);
                if (!json_is_array(hr) || json_array_size(hr) != (size_t)c->n_tip) {
                    st = sfi_error_set(err, SFI_EFORMAT, "%s: fasa: layer %d head %d: not %d "
                                       "chunks", origin, l, h, c->n_tip);
                    goto out;
                }
                int prev = -1;
                for (int i = 0; i < c->n_tip; i++) {
                    json_t *v = json_array_get(hr, (size_t)i);
                    if (!json_is_integer(v) || json_integer_value(v) <= prev ||
                        json_integer_value(v) >= half) {
                        st = sfi_error_set(err, SFI_EFORMAT, "%s: fasa: layer %d head %d: "
                                           "chunks must ascend within 0..%d", origin, l, h,
                                           half - 1);
                        goto out;
                    }
                    prev = (int)json_integer_value(v);
                    c->tip[((size_t)l * H + h) * c->n_tip + i] = prev;
                }
            }
        }
        c->has_fasa = 1;
    }
out:
    json_decref(o);
    if (st)
        sfi_policy_calib_free(c);
    return st;
}

sfi_status sfi_policy_calib_load(const char *path, sfi_policy_calib *c, sfi_error *err)
{
    memset(c, 0, sizeof *c);
    char *buf = NULL;
    size_t n = 0;
    sfi_status st = sfi_io_read(path, (size_t)64 << 20, "policy calibration", &buf, &n, err);
    if (st)
        return st;
    st = sfi_policy_calib_from_json(buf, path, c, err);
    free(buf);
    return st;
}

sfi_status sfi_policy_calib_save(const char *path, const sfi_policy_calib *c, sfi_error *err)
{
    char *s = sfi_policy_calib_to_json(c);
    if (!s)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    size_t n = strlen(s);
    s[n] = '\n'; /* json_dumps left room for the NUL: a trailing newline */
    sfi_status st = sfi_out_write(path, s, n + 1, err);
    free(s);
    return st;
}

/* ---------------------------------------------------------------- */
/* Kascade's dynamic program                                          */

double sfi_policy_kascade_dp(const double *sim, const double *weight, int L, int A, int *anchors)
{
    /* Layers 1..L-1; segment [a, e) anchored at a scores
     * sum_{b=a}^{e-1} w_b sim[a][b] with sim[a][a] = 1. */
    int n = L - 1;
    if (n < 1)
        return 0.0;
    if (A > n)
        A = n;
    if (A < 1)
        A = 1;
    double *dp = malloc(sizeof(double) * (size_t)(A + 1) * (size_t)(L + 1));
    int *arg = malloc(sizeof(int) * (size_t)(A + 1) * (size_t)(L + 1));
    double *pre = malloc(sizeof(double) * (size_t)L * (size_t)(L + 1));
    if (!dp || !arg || !pre) {
        free(dp);
        free(arg);
        free(pre);
        return -1.0;
    }
    for (int a = 1; a < L; a++) {
        double acc = 0.0;
        for (int e = 0; e <= L; e++) {
            pre[(size_t)a * (L + 1) + e] = acc;  /* sum over b in [a, e) */
            if (e >= a && e < L)
                acc += (weight ? weight[e] : 1.0) * (e == a ? 1.0 : sim[(size_t)a * L + e]);
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
    for (int e = 2; e <= L; e++)
        DP(1, e) = SEG(1, e), ARG(1, e) = 1;
    for (int k = 2; k <= A; k++)
        for (int e = k + 1; e <= L; e++)
            for (int a = k; a < e; a++) {
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

/* ---------------------------------------------------------------- */
/* Similarity accumulation, shared by the calibrator and the proxy   */

/* Per (a, b > a, g, h): the running min over the current prompt's tokens
 * and the sum over finished prompts of those minima. */
typedef struct {
    int L, H;
    double *cur;    /* [L][L][H][H], 2 = untouched this prompt */
    double *sum;
    int n_prompts;
} simacc;

static size_t sim_idx(const simacc *s, int a, int b, int g, int h)
{
    return (((size_t)a * s->L + b) * s->H + g) * s->H + h;
}

static int simacc_init(simacc *s, int L, int H)
{
    size_t n = (size_t)L * L * H * H;
    s->L = L;
    s->H = H;
    s->n_prompts = 0;
    s->cur = malloc(sizeof(double) * n);
    s->sum = calloc(n, sizeof(double));
    if (!s->cur || !s->sum)
        return -1;
    for (size_t i = 0; i < n; i++)
        s->cur[i] = 2.0;
    return 0;
}

static void simacc_free(simacc *s)
{
    free(s->cur);
    free(s->sum);
}

/* Closes the current prompt: a pair never measured counts as 1. */
static void simacc_end_prompt(simacc *s)
{
    size_t n = (size_t)s->L * s->L * s->H * s->H;
    int any = 0;
    for (size_t i = 0; i < n && !any; i++)
        any = s->cur[i] <= 1.0;
    if (!any)
        return;
    for (size_t i = 0; i < n; i++) {
        s->sum[i] += s->cur[i] <= 1.0 ? s->cur[i] : 1.0;
        s->cur[i] = 2.0;
    }
    s->n_prompts++;
}

static void simacc_take(simacc *s, int a, int b, int g, int h, double f)
{
    double *d = &s->cur[sim_idx(s, a, b, g, h)];
    if (f > 1.0)
        f = 1.0;
    if (f < *d)
        *d = f;
}

/* sim, head map from the accumulated sums. */
static sfi_status simacc_result(const simacc *s, sfi_policy_calib *c, sfi_error *err)
{
    int L = s->L, H = s->H;
    c->sim = malloc(sizeof(double) * (size_t)L * L);
    c->head = malloc(sizeof(int) * (size_t)L * L * H);
    if (!c->sim || !c->head)
        return sfi_error_set(err, SFI_ENOMEM, "calibration: out of memory");
    double np = s->n_prompts > 0 ? s->n_prompts : 1;
    for (int a = 0; a < L; a++)
        for (int b = 0; b < L; b++) {
            double tot = 0.0;
            for (int h = 0; h < H; h++) {
                int bg = h;
                double best = b == a ? 1.0 : -1.0;
                if (b > a)
                    for (int g = 0; g < H; g++) {
                        double v = s->n_prompts ? s->sum[sim_idx(s, a, b, g, h)] / np : 0.0;
                        if (v > best + 1e-12)
                            best = v, bg = g;
                    }
                if (b < a)
                    best = 0.0;
                c->head[((size_t)a * L + b) * H + h] = bg;
                tot += best;
            }
            c->sim[(size_t)a * L + b] = tot / H;
        }
    return SFI_OK;
}

/* Mass of the record (b's) inside the k-set marked with stamp id in
 * `stamp`, over its own top-k mass. */
static double recovered(const int32_t *pos, const float *prob, int n, int k, const int *stamp,
                        int id)
{
    double own = 0.0, got = 0.0;
    for (int i = 0; i < n; i++) {
        if (i < k)
            own += prob[i];
        if (stamp[pos[i]] == id)
            got += prob[i];
    }
    return own > 0.0 ? got / own : 1.0;
}

sfi_status sfi_policy_calib_kascade_from_records(const int32_t *const *pos,
                                                 const float *const *prob, const int *n, int S,
                                                 int L, int H, int k, sfi_policy_calib *out,
                                                 sfi_error *err)
{
    memset(out, 0, sizeof *out);
    if (S < 1 || L < 1 || H < 1 || k < 1)
        return sfi_error_set(err, SFI_EINVAL, "kascade: needs at least one calibration step");
    int max_pos = 0;
    for (size_t i = 0; i < (size_t)S * L * H; i++)
        for (int e = 0; e < n[i]; e++)
            if (pos[i][e] > max_pos)
                max_pos = pos[i][e];
    simacc sa;
    int *stamp = malloc(sizeof(int) * ((size_t)max_pos + 1));
    if (simacc_init(&sa, L, H) || !stamp) {
        simacc_free(&sa);
        free(stamp);
        return sfi_error_set(err, SFI_ENOMEM, "kascade: out of memory");
    }
    for (int i = 0; i <= max_pos; i++)
        stamp[i] = -1;
    int id = 0;
    for (int s = 0; s < S; s++)
        for (int a = 0; a < L; a++)
            for (int g = 0; g < H; g++, id++) {
                size_t ia = ((size_t)s * L + a) * H + g;
                int ka = n[ia] < k ? n[ia] : k;
                for (int i = 0; i < ka; i++)
                    stamp[pos[ia][i]] = id;
                for (int b = a + 1; b < L; b++)
                    for (int h = 0; h < H; h++) {
                        size_t ib = ((size_t)s * L + b) * H + h;
                        simacc_take(&sa, a, b, g, h,
                                    recovered(pos[ib], prob[ib], n[ib], k, stamp, id));
                    }
            }
    simacc_end_prompt(&sa);
    sfi_status st = simacc_result(&sa, out, err);
    out->n_layers = L;
    out->n_kv_heads = H;
    out->weight = malloc(sizeof(double) * (size_t)L);
    out->source = strdup("the evaluated trace's first steps");
    if (!st && (!out->weight || !out->source))
        st = sfi_error_set(err, SFI_ENOMEM, "kascade: out of memory");
    if (!st) {
        for (int l = 0; l < L; l++)
            out->weight[l] = 1.0;
        out->has_kascade = 1;
        out->kascade_k = k;
        out->leaks = 1;
    }
    simacc_free(&sa);
    free(stamp);
    if (st)
        sfi_policy_calib_free(out);
    return st;
}

/* ---------------------------------------------------------------- */
/* The calibrator                                                     */

enum { RING = 128 };  /* positions in flight: a prefill block is 64 */

typedef struct {
    int pos;              /* position held, -1 free */
    int n_ctx;
    int layers_done;
    float *probs;         /* [L][H][max_ctx] pooled attention */
    int32_t *top;         /* [L][H][kk] top-k positions, probability descending */
    int *n_top;           /* [L][H] */
} slot;

struct sfi_policy_calibrator {
    int L, nh, H, d, kk, fk, n_tip, max_ctx;
    simacc sa;
    slot ring[RING];
    int *stamp;           /* [max_ctx] */
    int stamp_id;
    /* FASA */
    double *agree;        /* [L][H][d/2] summed overlap shares */
    double *agree_n;      /* [L][H] tokens measured */
    /* Layer importance */
    double *imp;          /* [L] sum of 1 - cos */
    double *imp_n;
    /* scratch */
    float *lg;            /* [G][max_ctx] */
    float *sc;            /* [max_ctx] */
    int32_t *ia, *ib;     /* [max_ctx] */
    uint8_t *mk;          /* [max_ctx] */
};

void sfi_policy_calibrator_free(sfi_policy_calibrator *c)
{
    if (!c)
        return;
    simacc_free(&c->sa);
    for (int i = 0; i < RING; i++) {
        free(c->ring[i].probs);
        free(c->ring[i].top);
        free(c->ring[i].n_top);
    }
    free(c->stamp);
    free(c->agree);
    free(c->agree_n);
    free(c->imp);
    free(c->imp_n);
    free(c->lg);
    free(c->sc);
    free(c->ia);
    free(c->ib);
    free(c->mk);
    free(c);
}

sfi_status sfi_policy_calibrator_create(int kascade_k, int fasa_k, int n_tip, int L, int nh,
                                        int H, int d, int max_ctx, sfi_policy_calibrator **out,
                                        sfi_error *err)
{
    *out = NULL;
    if (L < 1 || H < 1 || nh < H || nh % H || d < 2 || d % 2 || max_ctx < 1 || kascade_k < 1 ||
        fasa_k < 1 || n_tip < 1 || n_tip > d / 2)
        return sfi_error_set(err, SFI_EINVAL, "calibration: bad shape (%d layers, %d heads, %d "
                             "KV heads, head_dim %d, N_tip %d, k %d, K %d)", L, nh, H, d, n_tip,
                             kascade_k, fasa_k);
    sfi_policy_calibrator *c = calloc(1, sizeof *c);
    if (!c)
        return sfi_error_set(err, SFI_ENOMEM, "calibration: out of memory");
    c->L = L, c->nh = nh, c->H = H, c->d = d, c->kk = kascade_k, c->fk = fasa_k;
    c->n_tip = n_tip, c->max_ctx = max_ctx;
    int G = nh / H, ok = simacc_init(&c->sa, L, H) == 0;
    for (int i = 0; ok && i < RING; i++) {
        c->ring[i].pos = -1;
        c->ring[i].probs = malloc(sizeof(float) * (size_t)L * H * max_ctx);
        c->ring[i].top = malloc(sizeof(int32_t) * (size_t)L * H * kascade_k);
        c->ring[i].n_top = calloc((size_t)L * H, sizeof(int));
        ok = c->ring[i].probs && c->ring[i].top && c->ring[i].n_top;
    }
    c->stamp = malloc(sizeof(int) * (size_t)max_ctx);
    c->agree = calloc((size_t)L * H * (d / 2), sizeof(double));
    c->agree_n = calloc((size_t)L * H, sizeof(double));
    c->imp = calloc((size_t)L, sizeof(double));
    c->imp_n = calloc((size_t)L, sizeof(double));
    c->lg = malloc(sizeof(float) * (size_t)G * max_ctx);
    c->sc = malloc(sizeof(float) * (size_t)max_ctx);
    c->ia = malloc(sizeof(int32_t) * (size_t)max_ctx);
    c->ib = malloc(sizeof(int32_t) * (size_t)max_ctx);
    c->mk = calloc((size_t)max_ctx, 1);
    if (!ok || !c->stamp || !c->agree || !c->agree_n || !c->imp || !c->imp_n || !c->lg ||
        !c->sc || !c->ia || !c->ib || !c->mk) {
        sfi_policy_calibrator_free(c);
        return sfi_error_set(err, SFI_ENOMEM, "calibration: out of memory for %d positions",
                             max_ctx);
    }
    for (int i = 0; i < max_ctx; i++)
        c->stamp[i] = -1;
    *out = c;
    return SFI_OK;
}

void sfi_policy_calibrator_begin(sfi_policy_calibrator *c)
{
    simacc_end_prompt(&c->sa);
    for (int i = 0; i < RING; i++)
        c->ring[i].pos = -1;
}

/* Top-k indices of v[0..n) by value, ties to the smaller index,
 * descending by value into out (k <= n). */
static sfi_status topk_desc(const float *v, int n, int k, int32_t *out, int32_t *tmp,
                            sfi_error *err)
{
    sfi_status st = sfi_topk(v, n, k, tmp, err);
    if (st)
        return st;
    /* sfi_topk gives ascending positions: order them by value. */
    for (int i = 0; i < k; i++) {
        int32_t x = tmp[i];
        int j = i - 1;
        while (j >= 0 && (v[out[j]] < v[x] || (v[out[j]] == v[x] && out[j] > x))) {
            out[j + 1] = out[j];
            j--;
        }
        out[j + 1] = x;
    }
    return SFI_OK;
}

/* Kascade's similarities of one finished position across all layers. */
static void finish_position(sfi_policy_calibrator *c, slot *s)
{
    int L = c->L, H = c->H, n = s->n_ctx;
    if (n > c->kk)
        for (int a = 0; a < L; a++)
            for (int g = 0; g < H; g++) {
                int id = ++c->stamp_id;
                const int32_t *ta = s->top + ((size_t)a * H + g) * c->kk;
                for (int i = 0; i < s->n_top[a * H + g]; i++)
                    c->stamp[ta[i]] = id;
                for (int b = a + 1; b < L; b++)
                    for (int h = 0; h < H; h++) {
                        const float *pb = s->probs + ((size_t)b * H + h) * c->max_ctx;
                        const int32_t *tb = s->top + ((size_t)b * H + h) * c->kk;
                        double own = 0.0, got = 0.0;
                        for (int i = 0; i < s->n_top[b * H + h]; i++)
                            own += pb[tb[i]];
                        for (int i = 0; i < s->n_top[a * H + g]; i++)
                            got += pb[ta[i]];
                        simacc_take(&c->sa, a, b, g, h, own > 0.0 ? got / own : 1.0);
                    }
            }
    s->pos = -1;
}

sfi_status sfi_policy_calibrator_add(sfi_policy_calibrator *c, int layer, const float *q,
                                     const float *k, int n_ctx, sfi_error *err)
{
    if (layer < 0 || layer >= c->L || n_ctx < 1 || n_ctx > c->max_ctx)
        return sfi_error_set(err, SFI_EINVAL, "calibration: layer %d or context %d out of range",
                             layer, n_ctx);
    int pos = n_ctx - 1, H = c->H, G = c->nh / H, d = c->d, half = d / 2;
    slot *s = &c->ring[pos % RING];
    if (s->pos != pos) {
        if (s->pos >= 0)
            return sfi_error_set(err, SFI_EINVAL, "calibration: position %d still waits for "
                                 "layers when %d arrives", s->pos, pos);
        s->pos = pos;
        s->n_ctx = n_ctx;
        s->layers_done = 0;
    }
    float scale = sfi_attn_scale(d);
    size_t row = (size_t)H * d;
    for (int h = 0; h < H; h++) {
        float *p = s->probs + ((size_t)layer * H + h) * c->max_ctx;
        for (int j = 0; j < n_ctx; j++)
            p[j] = 0.0f;
        for (int g = 0; g < G; g++) {
            const float *qh = q + (size_t)(h * G + g) * d;
            float *lg = c->lg + (size_t)g * n_ctx;
            for (int j = 0; j < n_ctx; j++)
                lg[j] = sfi_dot(qh, k + (size_t)j * row + (size_t)h * d, (size_t)d) * scale;
            sfi_softmax(lg, (size_t)n_ctx);
            for (int j = 0; j < n_ctx; j++)
                p[j] += lg[j] / (float)G;
        }
        int kk = c->kk < n_ctx ? c->kk : n_ctx;
        sfi_status st = topk_desc(p, n_ctx, kk, s->top + ((size_t)layer * H + h) * c->kk, c->ia,
                                  err);
        if (st)
            return st;
        s->n_top[layer * H + h] = kk;
        /* FASA's contextual agreement, on contexts well past K. */
        if (n_ctx > 2 * c->fk) {
            int K = c->fk;
            sfi_policy_fasa_scores(q, k, n_ctx, c->nh, H, d, h, NULL, half, c->sc);
            if ((st = sfi_topk(c->sc, n_ctx, K, c->ia, err)))
                return st;
            for (int i = 0; i < K; i++)
                c->mk[c->ia[i]] = 1;
            double *ag = c->agree + ((size_t)layer * H + h) * half;
            for (int ch = 0; ch < half; ch++) {
                sfi_policy_fasa_scores(q, k, n_ctx, c->nh, H, d, h, &ch, 1, c->sc);
                if ((st = sfi_topk(c->sc, n_ctx, K, c->ib, err)))
                    return st;
                int ov = 0;
                for (int i = 0; i < K; i++)
                    ov += c->mk[c->ib[i]];
                ag[ch] += (double)ov / K;
            }
            for (int i = 0; i < K; i++)
                c->mk[c->ia[i]] = 0;
            c->agree_n[layer * H + h] += 1.0;
        }
    }
    if (++s->layers_done == c->L)
        finish_position(c, s);
    return SFI_OK;
}

void sfi_policy_calibrator_hidden(sfi_policy_calibrator *c, int layer, const float *in,
                                  const float *out, int n)
{
    if (layer < 0 || layer >= c->L)
        return;
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int i = 0; i < n; i++) {
        ab += (double)in[i] * out[i];
        aa += (double)in[i] * in[i];
        bb += (double)out[i] * out[i];
    }
    double cs = aa > 0.0 && bb > 0.0 ? ab / sqrt(aa * bb) : 1.0;
    c->imp[layer] += 1.0 - cs;
    c->imp_n[layer] += 1.0;
}

sfi_status sfi_policy_calibrator_finish(sfi_policy_calibrator *c, const char *source,
                                        sfi_policy_calib *out, sfi_error *err)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < RING; i++)
        if (c->ring[i].pos >= 0)
            return sfi_error_set(err, SFI_EINVAL, "calibration: position %d has only %d of %d "
                                 "layers", c->ring[i].pos, c->ring[i].layers_done, c->L);
    simacc_end_prompt(&c->sa);
    int L = c->L, H = c->H, half = c->d / 2;
    /* Each part needs tokens past its k: a part nothing measured is left
     * out (has_kascade / has_fasa 0); with neither there is nothing. */
    int kascade = L > 1 && c->sa.n_prompts > 0, fasa = 1;
    for (int i = 0; i < L * H; i++)
        fasa &= c->agree_n[i] >= 1.0;
    if (!kascade && !fasa)
        return sfi_error_set(err, SFI_EINVAL, "calibration: no token had a context longer than "
                             "Kascade's k = %d or FASA's 2K = %d (use longer calibration "
                             "prompts)", c->kk, 2 * c->fk);
    out->n_layers = L;
    out->n_kv_heads = H;
    out->head_dim = c->d;
    sfi_status st = simacc_result(&c->sa, out, err);
    out->weight = malloc(sizeof(double) * (size_t)L);
    out->tip = malloc(sizeof(int) * (size_t)L * H * c->n_tip);
    out->source = strdup(source ? source : "");
    if (!st && (!out->weight || !out->tip || !out->source))
        st = sfi_error_set(err, SFI_ENOMEM, "calibration: out of memory");
    for (int l = 0; !st && l < L; l++)
        out->weight[l] = c->imp_n[l] > 0.0 ? c->imp[l] / c->imp_n[l] : 1.0;
    float *avg = malloc(sizeof(float) * (size_t)half);
    if (!st && !avg)
        st = sfi_error_set(err, SFI_ENOMEM, "calibration: out of memory");
    for (int i = 0; !st && fasa && i < L * H; i++) {
        for (int ch = 0; ch < half; ch++)
            avg[ch] = (float)(c->agree[(size_t)i * half + ch] / c->agree_n[i]);
        st = sfi_topk(avg, half, c->n_tip, c->ia, err);
        for (int t = 0; !st && t < c->n_tip; t++)
            out->tip[(size_t)i * c->n_tip + t] = c->ia[t];
    }
    free(avg);
    if (st) {
        sfi_policy_calib_free(out);
        return st;
    }
    out->has_kascade = kascade;
    out->kascade_k = c->kk;
    out->has_fasa = fasa;
    out->fasa_k = c->fk;
    out->n_tip = fasa ? c->n_tip : 0;
    return SFI_OK;
}
