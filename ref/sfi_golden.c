/* The golden-digest suite; see sfi_golden.h.
 *
 * Inputs come from a 64-bit LCG and are built with exact operations only
 * (24 random bits scaled by a power of two, then one float multiply-add
 * evaluated as written), so they are the same bits everywhere. Parameter
 * values are written out here rather than taken from sfi_params_default,
 * so that a change of defaults does not move the digests. */
#include <config.h>

#include "sfi_golden.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_attention.h"
#include "sfi_math.h"
#include "sfi_selector.h"
#include "sfi_state.h"

typedef struct {
    uint64_t s;
} lcg;

static uint32_t next24(lcg *g)
{
    g->s = g->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g->s >> 40);
}

/* Uniform in [lo, hi): lo + (hi - lo) * u, u = k / 2^24 exact. */
static float uni(lcg *g, float lo, float hi)
{
    float u = (float)next24(g) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
}

static float *fill(lcg *g, size_t n, float lo, float hi)
{
    float *b = malloc((n ? n : 1) * sizeof *b);
    if (b)
        for (size_t i = 0; i < n; i++)
            b[i] = uni(g, lo, hi);
    return b;
}

/* The suite runs the method's defaults (sfi(7)), so its digests pin them
 * too; tests/test_params checks the defaults against an independent copy. */
static sfi_params suite_params(void)
{
    sfi_params p;
    sfi_params_default(&p);
    return p;
}

typedef struct {
    sfi_golden_emit emit;
    void *ctx;
    sfi_error *err;
    sfi_hasher h;
    const char *name;
} runner;

static sfi_status begin(runner *r, const char *name)
{
    r->name = name;
    sfi_status st = sfi_hasher_init(&r->h, r->err);
    if (st == SFI_OK)
        sfi_hasher_update_str(&r->h, name);
    return st;
}

static sfi_status finish(runner *r)
{
    char hex[SFI_DIGEST_HEX_LEN + 1];
    sfi_status st = sfi_hasher_final_hex(&r->h, hex, NULL, r->err);
    if (st != SFI_OK)
        return sfi_error_prefix(r->err, "%s", r->name);
    r->emit(r->name, hex, r->ctx);
    return SFI_OK;
}

static sfi_status fail(runner *r, sfi_status st)
{
    sfi_hasher_free(&r->h);
    if (st == SFI_ENOMEM)
        sfi_error_set(r->err, SFI_ENOMEM, "out of memory");
    return sfi_error_prefix(r->err, "golden case %s", r->name);
}

static sfi_status case_math(runner *r)
{
    enum { N = 200000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return SFI_ENOMEM;
    }
    lcg g = {1};
    sfi_status st = begin(r, "math.expf");
    if (st != SFI_OK)
        goto out;
    /* The whole finite range of exp: softmax arguments, prior, SiLU. */
    for (int i = 0; i < N; i++) {
        x[i] = uni(&g, -105.0f, 90.0f);
        y[i] = sfi_expf(x[i]);
    }
    sfi_hasher_update_f32(&r->h, y, N);
    if ((st = finish(r)) != SFI_OK || (st = begin(r, "math.logf")) != SFI_OK)
        goto out;
    /* Arbitrary positive floats by bit pattern, subnormals included. */
    for (int i = 0; i < N; i++) {
        uint32_t u = (next24(&g) << 7) ^ next24(&g);
        u &= 0x7fffffffu;
        if (u >= 0x7f800000u)
            u -= 0x7f800000u;
        memcpy(&x[i], &u, 4);
        y[i] = sfi_logf(x[i]);
    }
    sfi_hasher_update_f32(&r->h, y, N);
    if ((st = finish(r)) != SFI_OK || (st = begin(r, "math.sqrtf")) != SFI_OK)
        goto out;
    for (int i = 0; i < N; i++)
        y[i] = sfi_sqrtf(x[i]);
    sfi_hasher_update_f32(&r->h, y, N);
    if ((st = finish(r)) != SFI_OK || (st = begin(r, "math.softmax")) != SFI_OK)
        goto out;
    static const int sizes[] = {1, 2, 7, 64, 1000, 33333};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        for (int i = 0; i < sizes[c]; i++)
            x[i] = uni(&g, -30.0f, 30.0f);
        sfi_softmax(x, (size_t)sizes[c]);
        sfi_hasher_update_f32(&r->h, x, (size_t)sizes[c]);
        float d = sfi_dot(x, x, (size_t)sizes[c]);
        float s = sfi_sum(x, (size_t)sizes[c]);
        sfi_hasher_update_f32(&r->h, &d, 1);
        sfi_hasher_update_f32(&r->h, &s, 1);
    }
    st = finish(r);
out:
    free(x);
    free(y);
    return st;
}

static sfi_status case_attention(runner *r)
{
    static const int shapes[][4] = {
        {1, 1, 8, 1}, {4, 2, 64, 300}, {16, 8, 128, 2049}, {32, 8, 128, 777}};
    char name[64];
    lcg g = {2};
    sfi_status st = SFI_OK;
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0] && st == SFI_OK; c++) {
        sfi_attn_shape s = {shapes[c][0], shapes[c][1], shapes[c][2]};
        int n = shapes[c][3];
        size_t qn = (size_t)s.n_heads * (size_t)s.head_dim,
               kvn = (size_t)n * (size_t)s.n_kv_heads * (size_t)s.head_dim;
        float *q = fill(&g, qn, -2.0f, 2.0f), *k = fill(&g, kvn, -2.0f, 2.0f),
              *v = fill(&g, kvn, -1.0f, 1.0f);
        float *out = malloc(qn * sizeof *out),
              *lg = malloc((size_t)s.n_heads * (size_t)n * sizeof *lg);
        int32_t **idx = calloc((size_t)s.n_kv_heads, sizeof *idx);
        int *cnt = calloc((size_t)s.n_kv_heads, sizeof *cnt);
        int ok = q && k && v && out && lg && idx && cnt;
        for (int h = 0; ok && h < s.n_kv_heads; h++)
            ok = (idx[h] = malloc((size_t)n * sizeof **idx)) != NULL;
        if (!ok) {
            st = SFI_ENOMEM;
        } else {
            snprintf(name, sizeof name, "attn.dense.%dq%dkv%dd.n%d", s.n_heads, s.n_kv_heads,
                     s.head_dim, n);
            if ((st = begin(r, name)) == SFI_OK) {
                st = sfi_attn_dense_decode(&s, q, k, v, n, out, lg, r->err);
                if (st != SFI_OK)
                    fail(r, st);
                else {
                    sfi_hasher_update_f32(&r->h, out, qn);
                    sfi_hasher_update_f32(&r->h, lg, (size_t)s.n_heads * (size_t)n);
                    st = finish(r);
                }
            }
            /* Sparse: per KV head a random subset (each position kept with
             * probability 1/3, at least position n-1), unsorted. */
            snprintf(name, sizeof name, "attn.sparse.%dq%dkv%dd.n%d", s.n_heads, s.n_kv_heads,
                     s.head_dim, n);
            if (st == SFI_OK && (st = begin(r, name)) == SFI_OK) {
                for (int h = 0; h < s.n_kv_heads; h++) {
                    cnt[h] = 0;
                    for (int j = n - 1; j >= 0; j--)
                        if (j == n - 1 || next24(&g) % 3 == 0)
                            idx[h][cnt[h]++] = j;
                    sfi_hasher_update_i32(&r->h, idx[h], (size_t)cnt[h]);
                }
                st = sfi_attn_sparse_decode(&s, q, k, v, n, (const int32_t *const *)idx, cnt, out,
                                            r->err);
                if (st != SFI_OK)
                    fail(r, st);
                else {
                    sfi_hasher_update_f32(&r->h, out, qn);
                    st = finish(r);
                }
            }
        }
        for (int h = 0; idx && h < s.n_kv_heads; h++)
            free(idx[h]);
        free(idx);
        free(cnt);
        free(q);
        free(k);
        free(v);
        free(out);
        free(lg);
    }
    if (st != SFI_OK)
        return st;
    /* Prefill: 40 queries after 10 cached positions, tail of 16. */
    sfi_attn_shape s = {8, 2, 32};
    const int T = 40, pos0 = 10, W = 16, nk = pos0 + T;
    size_t qn = (size_t)T * 8 * 32, kvn = (size_t)nk * 2 * 32;
    float *q = fill(&g, qn, -3.0f, 3.0f), *k = fill(&g, kvn, -3.0f, 3.0f),
          *v = fill(&g, kvn, -1.0f, 1.0f);
    float *out = malloc(qn * sizeof *out),
          *tail = malloc((size_t)W * 8 * (size_t)nk * sizeof *tail);
    if (!q || !k || !v || !out || !tail)
        st = SFI_ENOMEM;
    else if ((st = begin(r, "attn.prefill.8q2kv32d.T40.pos10.W16")) == SFI_OK) {
        st = sfi_attn_prefill(&s, q, T, pos0, k, v, out, W, tail, r->err);
        if (st != SFI_OK)
            fail(r, st);
        else {
            sfi_hasher_update_f32(&r->h, out, qn);
            sfi_hasher_update_f32(&r->h, tail, (size_t)W * 8 * (size_t)nk);
            st = finish(r);
        }
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(tail);
    return st;
}

typedef struct {
    const char *name;
    int H, n_win, n_pos, jb, je, K;
    float amp;
    /* overrides; 0 keeps the default */
    float alpha, gamma, lambda_clip, T, alpha_cross;
    int nms_radius;
} sel_case;

static sfi_status case_selector(runner *r)
{
    static const sel_case cases[] = {
        {"selector.decode.8h.J2000.K256", 8, 1, 2260, 4, 2004, 256, 8.0f, 0, 0, 0, 0, 0, -1},
        {"selector.prefill.8h.W32.J3000.K512", 8, 32, 3260, 4, 3004, 512, 6.0f, 0, 0, 0, 0, 0, -1},
        {"selector.variant.4h.W4.alpha1.gamma0.clip1.r0.T0.5", 4, 4, 1500, 4, 1244, 100, 10.0f,
         1.0f, -1.0f, 1.0f, 0.5f, 1.0f, 0},
        {"selector.smallJ.2h.J5.K2048", 2, 3, 265, 4, 9, 2048, 5.0f, 0, 0, 0, 0, 0, -1},
        {"selector.flat.4h.J600.K64", 4, 2, 860, 4, 604, 64, 0.001f, 0, 0, 0, 0, 0, -1},
    };
    lcg g = {3};
    sfi_status st = SFI_OK;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && st == SFI_OK; c++) {
        const sel_case *sc = &cases[c];
        sfi_params p = suite_params();
        p.K = sc->K;
        if (sc->alpha > 0)
            p.alpha = sc->alpha;
        if (sc->gamma != 0)
            p.gamma = sc->gamma < 0 ? 0.0f : sc->gamma;
        if (sc->lambda_clip > 0)
            p.lambda_clip = sc->lambda_clip;
        if (sc->T > 0)
            p.T = sc->T;
        if (sc->alpha_cross > 0)
            p.alpha_cross = sc->alpha_cross;
        if (sc->nms_radius >= 0)
            p.nms_radius = sc->nms_radius;
        const int nJ = sc->je - sc->jb;
        const int K_out = p.K < nJ ? p.K : nJ;
        size_t HJ = (size_t)sc->H * (size_t)nJ;
        float *lg =
            fill(&g, (size_t)sc->H * (size_t)sc->n_win * (size_t)sc->n_pos, -sc->amp, sc->amp);
        float *kn = fill(&g, (size_t)sc->H * (size_t)sc->n_pos, 0.25f, 30.0f);
        float *buf = malloc(6 * HJ * sizeof *buf);
        float lam[8];
        int32_t *sel = malloc((size_t)sc->H * (size_t)K_out * sizeof *sel);
        if (!lg || !kn || !buf || !sel) {
            st = SFI_ENOMEM;
        } else {
            sfi_selector_detail d = {buf,          buf + HJ,     lam,         buf + 2 * HJ,
                                     buf + 3 * HJ, buf + 4 * HJ, buf + 5 * HJ};
            sfi_selector_input in = {sc->H, sc->n_win, sc->n_pos, sc->jb, sc->je, lg, kn};
            int n = 0;
            if ((st = begin(r, sc->name)) == SFI_OK) {
                st = sfi_selector_run(&p, &in, sel, &n, &d, r->err);
                if (st != SFI_OK)
                    fail(r, st);
                else {
                    int32_t nn = n;
                    sfi_hasher_update_i32(&r->h, &nn, 1);
                    sfi_hasher_update_i32(&r->h, sel, (size_t)sc->H * (size_t)n);
                    sfi_hasher_update_f32(&r->h, lam, (size_t)sc->H);
                    sfi_hasher_update_f32(&r->h, buf, 6 * HJ);
                    st = finish(r);
                }
            }
        }
        free(lg);
        free(kn);
        free(buf);
        free(sel);
    }
    return st;
}

/* The prefill path as the decode loop runs it: causal attention with a
 * tail of W = 16 queries, key norms, the window re-layout (with masked
 * -inf entries inside J, since n_recent < W here), then the Selector. */
static sfi_status case_prefill_selector(runner *r)
{
    sfi_attn_shape sh = {8, 2, 64};
    const int T = 300, W = 16;
    lcg g = {5};
    size_t qn = (size_t)T * 8 * 64, kvn = (size_t)T * 2 * 64;
    float *q = fill(&g, qn, -2.0f, 2.0f), *k = fill(&g, kvn, -2.0f, 2.0f),
          *v = fill(&g, kvn, -1.0f, 1.0f);
    float *out = malloc(qn * sizeof *out), *tail = malloc((size_t)W * 8 * T * sizeof *tail);
    float *win = malloc((size_t)W * 8 * T * sizeof *win), *kn = malloc((size_t)2 * T * sizeof *kn);
    int32_t sel[2 * 64];
    float lam[2], *f = malloc((size_t)2 * T * sizeof *f), *zc = malloc((size_t)2 * T * sizeof *zc);
    sfi_selector_detail det = {0};
    det.f = f;
    det.lambda = lam;
    det.z_cross = zc;
    sfi_status st = SFI_ENOMEM;
    if (q && k && v && out && tail && win && kn && f && zc &&
        (st = begin(r, "selector.from_prefill.8q2kv64d.T300.W16")) == SFI_OK) {
        sfi_params p = suite_params();
        p.n_recent = 8;
        p.K = 64;
        int jb = 0, je = 0, n = 0;
        st = sfi_attn_prefill(&sh, q, T, 0, k, v, out, W, tail, r->err);
        if (st == SFI_OK) {
            sfi_key_norms(k, T, 2, 64, kn);
            sfi_selector_window_from_prefill(8, 2, W, T, tail, win);
            sfi_state_candidates(&p, T, &jb, &je);
            sfi_selector_input in = {2, 4 * W, T, jb, je, win, kn};
            st = sfi_selector_run(&p, &in, sel, &n, &det, r->err);
        }
        if (st != SFI_OK)
            fail(r, st);
        else {
            sfi_hasher_update_f32(&r->h, kn, (size_t)2 * T);
            sfi_hasher_update_i32(&r->h, sel, (size_t)2 * (size_t)n);
            sfi_hasher_update_f32(&r->h, lam, 2);
            sfi_hasher_update_f32(&r->h, f, (size_t)2 * (size_t)(je - jb));
            sfi_hasher_update_f32(&r->h, zc, (size_t)2 * (size_t)(je - jb));
            st = finish(r);
        }
    }
    free(q);
    free(k);
    free(v);
    free(out);
    free(tail);
    free(win);
    free(kn);
    free(f);
    free(zc);
    return st;
}

static sfi_status case_state(runner *r)
{
    lcg g = {4};
    enum { V = 50, STEPS = 1000 };
    uint8_t trig[V];
    for (int i = 0; i < V; i++)
        trig[i] = next24(&g) % 10 == 0;
    int32_t toks[STEPS];
    for (int i = 0; i < STEPS; i++)
        toks[i] = (int32_t)(next24(&g) % (V + 2)) - 1; /* -1 and V: out of range */
    sfi_params p = suite_params();
    p.T_max = 16;
    sfi_status st = begin(r, "state.triggers");
    if (st != SFI_OK)
        return st;
    for (int kind = SFI_TRIG_SFI; kind <= SFI_TRIG_NEVER; kind++) {
        sfi_trigger_policy tp;
        sfi_trigger_policy_init(&tp, (sfi_trigger_kind)kind, &p, trig, V, 7);
        int32_t rec[2 * STEPS];
        for (int t = 0; t < STEPS; t++) {
            sfi_step_reason why;
            rec[2 * t] = (int32_t)sfi_trigger_next(&tp, t ? toks[t - 1] : 0, &why);
            rec[2 * t + 1] = (int32_t)why;
        }
        sfi_hasher_update_i32(&r->h, rec, 2 * STEPS);
    }
    if ((st = finish(r)) != SFI_OK || (st = begin(r, "state.candidates.fast_set")) != SFI_OK)
        return st;
    sfi_state s;
    p.n_sink = 4;
    p.n_recent = 64;
    if ((st = sfi_state_init(&s, 2, 3, 32, r->err)) != SFI_OK)
        return fail(r, st);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 3; h++) {
            int32_t *sl = sfi_state_selected(&s, l, h);
            int n = 0;
            for (int j = 0; j < 400 && n < 32; j++)
                if (next24(&g) % 9 == 0)
                    sl[n++] = j;
            s.n_selected[l * 3 + h] = n;
        }
    int32_t idx[4 + 32 + 64];
    static const int ctxs[] = {1, 3, 4, 5, 60, 68, 69, 100, 300, 450};
    for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0]; c++) {
        int jb, je, n;
        sfi_state_candidates(&p, ctxs[c], &jb, &je);
        int32_t be[2] = {jb, je};
        sfi_hasher_update_i32(&r->h, be, 2);
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 3; h++) {
                sfi_state_fast_set(&s, &p, l, h, ctxs[c], idx, &n);
                int32_t nn = n;
                sfi_hasher_update_i32(&r->h, &nn, 1);
                sfi_hasher_update_i32(&r->h, idx, (size_t)n);
            }
    }
    sfi_state_free(&s);
    return finish(r);
}

sfi_status sfi_golden_suite(sfi_golden_emit emit, void *ctx, sfi_error *err)
{
    runner r = {emit, ctx, err, {NULL, 0}, ""};
    sfi_status (*cases[])(runner *) = {case_math, case_attention, case_selector,
                                       case_prefill_selector, case_state};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sfi_status st = cases[i](&r);
        if (st == SFI_ENOMEM)
            return sfi_error_set(err, SFI_ENOMEM, "golden case %s: out of memory", r.name);
        if (st != SFI_OK)
            return st;
    }
    return SFI_OK;
}
