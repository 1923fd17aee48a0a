/* ref/sfi_selector: hand-computed cases per step (sfi(7) SELECTOR),
 * properties on random inputs, agreement with a double-precision
 * evaluation, Top-K ties, and bad input. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_attention.h"
#include "sfi_math.h"
#include "sfi_selector.h"
#include "sfi_test_util.h"

static uint64_t rng = 12345;
static float urand(void) /* [0, 1), 24 bits */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng >> 40) / 16777216.0f;
}

START_TEST(hand_fusion_step5)
{
    sfi_params p = sfi_test_method_defaults();
    float s[2];
    /* f = (3/4, 1/4), r = (1/4, 3/4): num = sum f (f - r) = 0.75*0.5 +
     * 0.25*(-0.5) = 0.25; den = sum (f - r)^2 = 0.5; lambda = 0.5 (all
     * exact in binary). With clip 1: s = 0.5 f + 0.5 r = (0.5, 0.5), the
     * uniform distribution, which indeed minimises |s|^2. */
    const float f[2] = {0.75f, 0.25f}, r[2] = {0.25f, 0.75f};
    p.lambda_clip = 1.0f;
    ck_assert(sfi_selector_fuse(&p, 2, f, r, s) == 0.5f);
    ck_assert(s[0] == 0.5f && s[1] == 0.5f);
    /* Default clip 0.02: lambda = 0.02, s = 0.98 f + 0.02 r = (0.74, 0.26). */
    p.lambda_clip = 0.02f;
    ck_assert(sfi_selector_fuse(&p, 2, f, r, s) == 0.02f);
    ck_assert_float_eq_tol(s[0], 0.74f, 1e-7f);
    ck_assert_float_eq_tol(s[1], 0.26f, 1e-7f);
    /* f == r: denominator exactly 0, lambda = 0, s = f bit for bit. */
    ck_assert(sfi_selector_fuse(&p, 2, f, f, s) == 0.0f);
    ck_assert(s[0] == f[0] && s[1] == f[1]);
    /* f = (0.625, 0.375), r = (0.875, 0.125): num = 0.625*(-0.25) +
     * 0.375*0.25 = -0.0625 < 0: clipped to 0 (mixing in r would only make
     * s less uniform). */
    const float f2[2] = {0.625f, 0.375f}, r2[2] = {0.875f, 0.125f};
    ck_assert(sfi_selector_fuse(&p, 2, f2, r2, s) == 0.0f);
    /* f = (1, 0), r = (1/2, 1/2): num = 0.5, den = 0.5, lambda = 1 -> clip. */
    const float f3[2] = {1.0f, 0.0f}, r3[2] = {0.5f, 0.5f};
    p.lambda_clip = 1.0f;
    ck_assert(sfi_selector_fuse(&p, 2, f3, r3, s) == 1.0f);
    ck_assert(s[0] == 0.5f && s[1] == 0.5f);
}
END_TEST

START_TEST(hand_soft_nms_step7)
{
    sfi_params p = sfi_test_method_defaults();
    /* radius 1, alpha_soft 0.5, z = (-1, -3, -2, -2.5):
     * m = (max(-1,-3), max(-1,-3,-2), max(-3,-2,-2.5), max(-2,-2.5))
     *   = (-1, -1, -2, -2);
     * z' = z - 0.5 (m - z) = (-1, -3 - 1, -2, -2.5 - 0.25)
     *    = (-1, -4, -2, -2.75); all exact. */
    p.nms_radius = 1;
    const float z[4] = {-1.0f, -3.0f, -2.0f, -2.5f};
    float o[4];
    sfi_selector_soft_nms(&p, 4, z, o);
    ck_assert(o[0] == -1.0f && o[1] == -4.0f && o[2] == -2.0f && o[3] == -2.75f);
    /* radius 2: m(3) = max(-3,-2,-2.5) = -2 still; m(1) = -1; m(2) = -1:
     * z'(2) = -2 - 0.5*1 = -2.5. */
    p.nms_radius = 2;
    sfi_selector_soft_nms(&p, 4, z, o);
    ck_assert(o[0] == -1.0f && o[1] == -4.0f && o[2] == -2.5f && o[3] == -2.75f);
    /* radius 0: nothing changes. */
    p.nms_radius = 0;
    sfi_selector_soft_nms(&p, 4, z, o);
    ck_assert(memcmp(o, z, sizeof o) == 0);
}
END_TEST

START_TEST(hand_cross_head_step8)
{
    sfi_params p = sfi_test_method_defaults();
    /* Two heads, two positions, T = 1, alpha_cross = 0.35.
     * Position 0: z = (ln 3, 0): softmax (3/4, 1/4);
     *   z_0 = ln 3 + 0.35 ln 0.75 = 1.0986123 - 0.1006887 = 0.9979236,
     *   z_1 = 0 + 0.35 ln 0.25 = -0.4852030.
     * Position 1: z = (0, 0): (1/2, 1/2); both 0.35 ln 0.5 = -0.2426015. */
    float z[4] = {1.09861229f, 0.0f, 0.0f, 0.0f}; /* [head][pos] */
    ck_assert_int_eq(sfi_selector_cross_head(&p, 2, 2, z), SFI_OK);
    ck_assert_float_eq_tol(z[0], 0.9979236f, 1e-6f);
    ck_assert_float_eq_tol(z[1], -0.2426015f, 1e-6f);
    ck_assert_float_eq_tol(z[2], -0.4852030f, 1e-6f);
    ck_assert_float_eq_tol(z[3], -0.2426015f, 1e-6f);
    /* A single head: softmax is 1, log 1 = 0: unchanged. */
    float one[2] = {-3.0f, 5.0f};
    ck_assert_int_eq(sfi_selector_cross_head(&p, 1, 2, one), SFI_OK);
    ck_assert(one[0] == -3.0f && one[1] == 5.0f);
    /* T = 2 halves the scores first: (ln 9, 0) / 2 -> softmax (3/4, 1/4). */
    p.T = 2.0f;
    float z2[2] = {2.19722458f, 0.0f};
    ck_assert_int_eq(sfi_selector_cross_head(&p, 2, 1, z2), SFI_OK);
    ck_assert_float_eq_tol(z2[0], 2.19722458f - 0.1006887f, 1e-6f);
}
END_TEST

START_TEST(hand_whole_selector)
{
    /* One KV head, one window query, n_pos 4, J = {1, 2}.
     * Step 1: logits over J (ln 3, 0) -> p = (3/4, 1/4); steps 2-3 with
     *   one query: f = p exactly.
     * Step 4 with gamma 1, beta 0, eta 0, key norms (3, 1):
     *   kn = (1/3, 1) (eps negligible), pos = 1 -> r = (1/4, 3/4).
     * Step 5: lambda (unclipped) 0.5 as in hand_fusion_step5, clipped to
     *   0.02; s = (0.74, 0.26).
     * Step 6: z = (ln 0.74, ln 0.26) = (-0.3011051, -1.3470736).
     * Step 7, radius 2: m = (z0, z0): z1 -= 0.5 (z0 - z1) -> -1.8700579.
     * Step 8, one head: unchanged. Step 9, K = 1: position 1. */
    sfi_params p = sfi_test_method_defaults();
    p.beta = 0.0f;
    p.eta = 0.0f;
    p.K = 1;
    const float logits[4] = {100.0f, 1.09861229f, 0.0f, -100.0f}; /* outside J ignored */
    const float norms[4] = {0.0f, 3.0f, 1.0f, 0.0f};
    sfi_selector_input in = {1, 1, 4, 1, 3, logits, norms};
    float f[2], r[2], lam, s[2], zl[2], zn[2], zc[2];
    sfi_selector_detail d = {f, r, &lam, s, zl, zn, zc};
    int32_t sel[1];
    int n = 0;
    sfi_error e;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, &d, &e), SFI_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(sel[0], 1);
    ck_assert_float_eq_tol(f[0], 0.75f, 1e-7f);
    ck_assert_float_eq_tol(r[0], 0.25f, 1e-7f);
    ck_assert_float_eq_tol(r[1], 0.75f, 1e-7f);
    ck_assert(lam == 0.02f);
    ck_assert_float_eq_tol(s[0], 0.74f, 1e-6f);
    ck_assert_float_eq_tol(zl[0], -0.3011051f, 1e-6f);
    ck_assert_float_eq_tol(zl[1], -1.3470736f, 1e-6f);
    ck_assert(zn[0] == zl[0]);
    ck_assert_float_eq_tol(zn[1], -1.8700579f, 1e-6f);
    ck_assert(zc[0] == zn[0] && zc[1] == zn[1]);
}
END_TEST

START_TEST(hand_prior_step4)
{
    /* Defaults gamma 1, beta 1, p 2, eta 0.5; J = {0, 1, 2}, norms 1:
     * u = (0, 1/2, 1) (eps negligible against 2);
     * pos = (e^0 * 1^0.5, e^-0.25 * 0.5^0.5, e^-1 * (1e-8)^0.5)
     *     = (1, 0.5506953, 3.6787944e-5); r = pos / sum
     *     = (0.6447763, 0.3550766, 2.3719e-5) with sum = 1.5507321. */
    sfi_params p = sfi_test_method_defaults();
    const float logits[3] = {0, 0, 0}, norms[3] = {1, 1, 1};
    sfi_selector_input in = {1, 1, 3, 0, 3, logits, norms};
    float r[3];
    sfi_selector_detail d = {0};
    d.r = r;
    int32_t sel[3];
    int n;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, &d, NULL), SFI_OK);
    ck_assert_float_eq_tol(r[0], 1.0f / 1.5507321f, 1e-6f);
    ck_assert_float_eq_tol(r[1], 0.5506953f / 1.5507321f, 1e-6f);
    ck_assert_float_eq_tol(r[2], 3.6787944e-5f / 1.5507321f, 1e-9f);
    /* |J| = 3 <= K: everything selected, ascending. */
    ck_assert_int_eq(n, 3);
    ck_assert(sel[0] == 0 && sel[1] == 1 && sel[2] == 2);
}
END_TEST

START_TEST(hand_power_mean_steps2_3)
{
    /* Two window queries, J of 2, alpha 0.5: p_1 = (1, 0) (logit -200
     * underflows exp to exactly 0), p_2 = (0, 1).
     * mu = ((1 + 0)/2, (0 + 1)/2) = (0.5, 0.5); mu^2 = (0.25, 0.25);
     * f = (0.5, 0.5). With alpha = 1 (arithmetic mean) also (0.5, 0.5). */
    sfi_params p = sfi_test_method_defaults();
    const float logits[4] = {0.0f, -200.0f, -200.0f, 0.0f};
    const float norms[2] = {1, 1};
    sfi_selector_input in = {1, 2, 2, 0, 2, logits, norms};
    float f[2];
    sfi_selector_detail d = {0};
    d.f = f;
    int32_t sel[2];
    int n;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, &d, NULL), SFI_OK);
    ck_assert(f[0] == 0.5f && f[1] == 0.5f);
    /* p_2 = (1/2, 1/2) instead: alpha 0.5 gives mu = ((1 + 0.7071068)/2,
     * 0.7071068/2) = (0.8535534, 0.3535534), mu^2 = (0.7285534, 0.125),
     * f = (0.8535534, 0.1464466); alpha 1 gives (0.75, 0.25). */
    const float l2[4] = {0.0f, -200.0f, 0.0f, 0.0f};
    in.logits = l2;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, &d, NULL), SFI_OK);
    ck_assert_float_eq_tol(f[0], 0.8535534f, 1e-6f);
    ck_assert_float_eq_tol(f[1], 0.1464466f, 1e-6f);
    p.alpha = 1.0f;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, &d, NULL), SFI_OK);
    ck_assert(f[0] == 0.75f && f[1] == 0.25f);
}
END_TEST

START_TEST(topk_ties_to_smaller_position)
{
    const float sc[5] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
    int32_t o[5];
    ck_assert_int_eq(sfi_topk(sc, 5, 2, o, NULL), SFI_OK);
    ck_assert(o[0] == 1 && o[1] == 2);
    ck_assert_int_eq(sfi_topk(sc, 5, 3, o, NULL), SFI_OK);
    ck_assert(o[0] == 1 && o[1] == 2 && o[2] == 4);
    ck_assert_int_eq(sfi_topk(sc, 5, 4, o, NULL), SFI_OK);
    ck_assert(o[0] == 1 && o[1] == 2 && o[2] == 3 && o[3] == 4);
    /* All equal: the first k. -0 and +0 tie. */
    const float eq[6] = {0.0f, -0.0f, 0.0f, -0.0f, 0.0f, 0.0f};
    ck_assert_int_eq(sfi_topk(eq, 6, 3, o, NULL), SFI_OK);
    ck_assert(o[0] == 0 && o[1] == 1 && o[2] == 2);
    /* -inf scores are legal, lowest. */
    const float inf[3] = {-INFINITY, 1.0f, -INFINITY};
    ck_assert_int_eq(sfi_topk(inf, 3, 2, o, NULL), SFI_OK);
    ck_assert(o[0] == 0 && o[1] == 1);
    sfi_error e;
    ck_assert_int_eq(sfi_topk(sc, 5, 0, o, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_topk(sc, 5, 6, o, &e), SFI_EINVAL);
    const float nan[2] = {NAN, 1.0f};
    ck_assert_int_eq(sfi_topk(nan, 2, 1, o, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "NaN"));
}
END_TEST

/* Random selector problem: H heads, n_win queries, n_pos, J. */
typedef struct {
    int H, n_win, n_pos, jb, je;
    float *logits, *norms;
} problem;

static problem make_problem(int H, int n_win, int n_pos, int jb, int je, float amp)
{
    problem pr = {H, n_win, n_pos, jb, je, NULL, NULL};
    pr.logits = malloc((size_t)H * n_win * n_pos * sizeof *pr.logits);
    pr.norms = malloc((size_t)H * n_pos * sizeof *pr.norms);
    for (size_t i = 0; i < (size_t)H * n_win * n_pos; i++)
        pr.logits[i] = (urand() * 2.0f - 1.0f) * amp;
    for (size_t i = 0; i < (size_t)H * n_pos; i++)
        pr.norms[i] = 0.5f + urand() * 20.0f;
    return pr;
}

static void free_problem(problem *pr)
{
    free(pr->logits);
    free(pr->norms);
}

START_TEST(properties_on_random_inputs)
{
    const int cfg[][5] = {/* H, n_win, n_pos, jb, je */
                          {8, 1, 600, 4, 344},
                          {4, 16, 900, 4, 644},
                          {2, 32, 300, 0, 300},
                          {8, 2, 5000, 4, 4744}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        problem pr = make_problem(cfg[c][0], cfg[c][1], cfg[c][2], cfg[c][3], cfg[c][4], 6.0f);
        const int H = pr.H, nJ = pr.je - pr.jb;
        sfi_params p = sfi_test_method_defaults();
        p.K = nJ / 5;
        if (c == 2)
            p.lambda_clip = 1.0f; /* exercise the unclipped closed form too */
        size_t HJ = (size_t)H * nJ;
        float *f = malloc(HJ * 4), *r = malloc(HJ * 4), *s = malloc(HJ * 4), *zl = malloc(HJ * 4),
              *zn = malloc(HJ * 4), *zc = malloc(HJ * 4), lam[32];
        sfi_selector_detail d = {f, r, lam, s, zl, zn, zc};
        sfi_selector_input in = {H, pr.n_win, pr.n_pos, pr.jb, pr.je, pr.logits, pr.norms};
        int32_t *sel = malloc((size_t)H * p.K * sizeof *sel),
                *sel2 = malloc((size_t)H * p.K * sizeof *sel);
        int n = 0, n2 = 0;
        sfi_error e;
        ck_assert_msg(sfi_selector_run(&p, &in, sel, &n, &d, &e) == SFI_OK, "%s", e.msg);
        ck_assert_int_eq(n, p.K);
        /* Deterministic: a second run (no detail) gives the same sets. */
        ck_assert_int_eq(sfi_selector_run(&p, &in, sel2, &n2, NULL, &e), SFI_OK);
        ck_assert(memcmp(sel, sel2, (size_t)H * p.K * sizeof *sel) == 0);
        for (int h = 0; h < H; h++) {
            const float *fh = f + (size_t)h * nJ, *rh = r + (size_t)h * nJ,
                        *sh = s + (size_t)h * nJ;
            const float *zlh = zl + (size_t)h * nJ, *znh = zn + (size_t)h * nJ,
                        *zch = zc + (size_t)h * nJ;
            /* s is a distribution. */
            double sum = 0.0;
            for (int i = 0; i < nJ; i++) {
                ck_assert(sh[i] >= 0.0f);
                sum += sh[i];
            }
            ck_assert_msg(fabs(sum - 1.0) < 1e-5, "sum s = %.9f", sum);
            /* lambda* in [0, clip] and minimises |s|^2 over a grid of it. */
            ck_assert(lam[h] >= 0.0f && lam[h] <= p.lambda_clip);
            double best = 0.0;
            for (int i = 0; i < nJ; i++)
                best += (double)sh[i] * sh[i];
            for (int g = 0; g <= 100; g++) {
                double l = p.lambda_clip * g / 100.0, q = 0.0;
                for (int i = 0; i < nJ; i++) {
                    double v = (1.0 - l) * fh[i] + l * rh[i];
                    q += v * v;
                }
                ck_assert_msg(q >= best * (1.0 - 1e-5), "grid lambda %g beats lambda* %g", l,
                              (double)lam[h]);
            }
            /* W = 1: f is the softmax over J exactly. */
            if (pr.n_win == 1) {
                float *pj = malloc((size_t)nJ * sizeof *pj);
                memcpy(pj, pr.logits + (size_t)h * pr.n_pos + pr.jb, (size_t)nJ * sizeof *pj);
                sfi_softmax(pj, (size_t)nJ);
                ck_assert(memcmp(pj, fh, (size_t)nJ * sizeof *pj) == 0);
                free(pj);
            }
            for (int i = 0; i < nJ; i++) {
                /* z = log(s + eps). */
                ck_assert(zlh[i] == sfi_logf(sh[i] + p.eps));
                /* Soft-NMS never raises a score and leaves local maxima alone. */
                ck_assert(znh[i] <= zlh[i]);
                int is_max = 1;
                for (int t = i - p.nms_radius; t <= i + p.nms_radius; t++)
                    if (t >= 0 && t < nJ && zlh[t] > zlh[i])
                        is_max = 0;
                if (is_max)
                    ck_assert(znh[i] == zlh[i]);
                /* Cross-head exclusivity never raises a score. */
                ck_assert(zch[i] <= znh[i]);
            }
            /* Top-K: K distinct ascending positions of J, and no unselected
             * position scores higher than a selected one (ties: smaller
             * position wins). */
            const int32_t *sh_sel = sel + (size_t)h * p.K;
            char *in_set = calloc((size_t)nJ, 1);
            float worst_in = INFINITY;
            int32_t worst_pos = 0;
            for (int i = 0; i < p.K; i++) {
                ck_assert(sh_sel[i] >= pr.jb && sh_sel[i] < pr.je);
                if (i)
                    ck_assert(sh_sel[i] > sh_sel[i - 1]);
                in_set[sh_sel[i] - pr.jb] = 1;
                float z = zch[sh_sel[i] - pr.jb];
                if (z < worst_in || (z == worst_in && sh_sel[i] > worst_pos)) {
                    worst_in = z;
                    worst_pos = sh_sel[i];
                }
            }
            for (int i = 0; i < nJ; i++)
                if (!in_set[i])
                    ck_assert(zch[i] < worst_in || (zch[i] == worst_in && pr.jb + i > worst_pos));
            free(in_set);
        }
        free(f);
        free(r);
        free(s);
        free(zl);
        free(zn);
        free(zc);
        free(sel);
        free(sel2);
        free_problem(&pr);
    }
}
END_TEST

START_TEST(matches_double_precision)
{
    /* Steps 1-5 in double from the sfi(7) formulas (no shortcuts). */
    problem pr = make_problem(3, 8, 400, 10, 390, 4.0f);
    sfi_params p = sfi_test_method_defaults();
    p.K = 50;
    p.lambda_clip = 1.0f;
    const int H = pr.H, W = pr.n_win, nJ = pr.je - pr.jb;
    size_t HJ = (size_t)H * nJ;
    float *f = malloc(HJ * 4), *r = malloc(HJ * 4), *s = malloc(HJ * 4), lam[3];
    sfi_selector_detail d = {f, r, lam, s, NULL, NULL, NULL};
    sfi_selector_input in = {H, W, pr.n_pos, pr.jb, pr.je, pr.logits, pr.norms};
    int32_t sel[150];
    int n;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, &d, NULL), SFI_OK);
    double *mu = calloc((size_t)nJ, sizeof *mu), *df = malloc((size_t)nJ * 8),
           *dr = malloc((size_t)nJ * 8);
    for (int h = 0; h < H; h++) {
        memset(mu, 0, (size_t)nJ * sizeof *mu);
        for (int t = 0; t < W; t++) {
            const float *row = pr.logits + ((size_t)h * W + t) * pr.n_pos + pr.jb;
            double mx = -1e300, sum = 0.0;
            for (int i = 0; i < nJ; i++)
                mx = row[i] > mx ? row[i] : mx;
            for (int i = 0; i < nJ; i++)
                sum += exp(row[i] - mx);
            for (int i = 0; i < nJ; i++)
                mu[i] += pow(exp(row[i] - mx) / sum, p.alpha) / W;
        }
        double G = 0.0, R = 0.0;
        for (int i = 0; i < nJ; i++)
            G += pow(mu[i], 1.0 / p.alpha);
        for (int i = 0; i < nJ; i++) {
            df[i] = pow(mu[i], 1.0 / p.alpha) / G;
            double u = (double)i / ((double)(nJ - 1) + p.eps);
            dr[i] = pow(pr.norms[(size_t)h * pr.n_pos + pr.jb + i] + p.eps, -p.gamma) *
                    exp(-p.beta * pow(u, p.p)) * pow(1.0 - u + p.eps, p.eta);
            R += dr[i];
        }
        double ff = 0, fr = 0, rr = 0;
        for (int i = 0; i < nJ; i++) {
            dr[i] /= R;
            ff += df[i] * df[i];
            fr += df[i] * dr[i];
            rr += dr[i] * dr[i];
        }
        double dl = (ff - fr) / (ff - 2 * fr + rr);
        dl = dl < 0 ? 0 : dl > p.lambda_clip ? p.lambda_clip : dl;
        ck_assert_msg(fabs(dl - lam[h]) <= 1e-4 * (fabs(dl) + 1e-3), "lambda %g vs %g", dl,
                      (double)lam[h]);
        for (int i = 0; i < nJ; i++) {
            ck_assert_msg(fabs(df[i] - f[(size_t)h * nJ + i]) <= 1e-5 * df[i] + 1e-12,
                          "f[%d] %g vs %g", i, df[i], (double)f[(size_t)h * nJ + i]);
            /* r near u = 1 has (1 - u + eps)^0.5 with 1 - u rounded in float:
             * compare with an absolute floor. */
            ck_assert_msg(fabs(dr[i] - r[(size_t)h * nJ + i]) <= 1e-5 * dr[i] + 1e-9,
                          "r[%d] %g vs %g", i, dr[i], (double)r[(size_t)h * nJ + i]);
        }
    }
    free(mu);
    free(df);
    free(dr);
    free(f);
    free(r);
    free(s);
    free_problem(&pr);
}
END_TEST

START_TEST(small_J_selects_everything)
{
    problem pr = make_problem(2, 1, 20, 4, 9, 3.0f);
    sfi_params p = sfi_test_method_defaults(); /* K = 2048 > |J| = 5 */
    sfi_selector_input in = {2, 1, 20, 4, 9, pr.logits, pr.norms};
    int32_t sel[10];
    int n = 0;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, NULL), SFI_OK);
    ck_assert_int_eq(n, 5);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 5; i++)
            ck_assert_int_eq(sel[h * 5 + i], 4 + i);
    /* K == |J| as well; and |J| = 1 (u = 0 / eps = 0, no division by 0). */
    p.K = 5;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, NULL), SFI_OK);
    ck_assert_int_eq(n, 5);
    in.j_end = 5;
    p.K = 1;
    float r[2];
    sfi_selector_detail d = {0};
    d.r = r;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, &d, NULL), SFI_OK);
    ck_assert_int_eq(n, 1);
    ck_assert(sel[0] == 4 && sel[1] == 4);
    ck_assert(r[0] == 1.0f);
    free_problem(&pr);
}
END_TEST

START_TEST(bad_input)
{
    sfi_params p = sfi_test_method_defaults();
    float logits[8] = {0, 1, 2, 3, 4, 5, 6, 7}, norms[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    sfi_selector_input in = {1, 1, 8, 0, 8, logits, norms};
    int32_t sel[8];
    int n = -7;
    sfi_error e;
    p.K = 0;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "K=0"));
    p.K = 2;
    in.j_end = 0;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "empty"));
    in.j_end = 9;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    in.j_end = 8;
    logits[3] = NAN;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "position 3 is NaN"));
    logits[3] = INFINITY;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "infinite"));
    /* -inf is a masked position: probability 0, fine. */
    logits[3] = -INFINITY;
    float f[8];
    sfi_selector_detail d = {0};
    d.f = f;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, &d, &e), SFI_OK);
    ck_assert(f[3] == 0.0f);
    ck_assert(sel[0] == 6 && sel[1] == 7);
    /* ... but not every position of J masked. */
    for (int j = 0; j < 8; j++)
        logits[j] = -INFINITY;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "masked"));
    for (int j = 0; j < 8; j++)
        logits[j] = (float)j;
    /* Outside J a NaN does not matter: it is not read. */
    logits[3] = 3;
    logits[0] = NAN;
    in.j_begin = 1;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_OK);
    ck_assert_int_eq(n, 2);
    norms[5] = -1.0f;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "key norm"));
    norms[5] = 1.0f;
    in.n_kv_heads = 0;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    in.n_kv_heads = 1;
    p.alpha = 0.0f;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "alpha"));
    p = sfi_test_method_defaults();
    p.T = 0.0f;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    p = sfi_test_method_defaults();
    p.eps = NAN;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_EINVAL);
    p = sfi_test_method_defaults();
    ck_assert_int_eq(sfi_selector_run(&p, NULL, sel, &n, NULL, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_selector_run(NULL, &in, sel, &n, NULL, &e), SFI_EINVAL);
}
END_TEST

START_TEST(extreme_finite_inputs_never_crash)
{
    /* Finite but extreme logits and key norms, random mixes: either a
     * valid selection or an error with a message, never NaN rankings or a
     * crash. */
    sfi_params p = sfi_test_method_defaults();
    p.K = 3;
    const float vals[] = {-3e38f, 3e38f, 0.0f, 1e-40f, -1e30f, 1e30f, 88.0f, -104.0f};
    const float nv[] = {0.0f, 3e38f, 1e-30f, 1.0f, 1e-45f};
    int ok = 0, refused = 0;
    for (int it = 0; it < 5000; it++) {
        float lg[40], kn[20];
        for (int i = 0; i < 40; i++)
            lg[i] = vals[(int)(urand() * 8.0f)];
        for (int i = 0; i < 20; i++)
            kn[i] = nv[(int)(urand() * 5.0f)];
        p.gamma = it % 3 == 0 ? 4.0f : 1.0f;
        sfi_selector_input in = {2, 2, 10, 1, 9, lg, kn};
        int32_t sel[6];
        int n;
        sfi_error e;
        if (sfi_selector_run(&p, &in, sel, &n, NULL, &e) == SFI_OK) {
            ok++;
            ck_assert_int_eq(n, 3);
            for (int i = 0; i < 6; i++)
                ck_assert(sel[i] >= 1 && sel[i] < 9);
        } else {
            refused++;
            ck_assert(e.msg[0] != '\0');
        }
    }
    ck_assert_int_gt(ok, 4000);
    /* Every key norm 3e38 with gamma 4: (3e38)^-4 underflows to 0 for all
     * positions, the prior has no mass: a range error naming it. */
    float lg[10] = {0}, kn[10];
    for (int i = 0; i < 10; i++)
        kn[i] = 3e38f;
    p.gamma = 4.0f;
    sfi_selector_input in = {1, 1, 10, 0, 10, lg, kn};
    int32_t sel[3];
    int n;
    sfi_error e;
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel, &n, NULL, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "prior"));
    (void)refused;
}
END_TEST

START_TEST(inputs_from_attention)
{
    /* Key norms: k = (3, 4) -> 5 exactly; layout out[kv][pos]. */
    const float k2[2 * 2 * 2] = {3, 4, 0, 1, 6, 8, 0, 0}; /* [pos 2][kv 2][d 2] */
    float kn[4];
    sfi_key_norms(k2, 2, 2, 2, kn);
    ck_assert(kn[0] == 5.0f && kn[1] == 10.0f && kn[2] == 1.0f && kn[3] == 0.0f);

    /* Window layout: tail [W=2][heads=4][n=3], 2 kv heads (G = 2): entry
     * value = 100 w + 10 h + j; out[kv][w*G + g][j]. */
    float tail[2 * 4 * 3], win[2 * 4 * 3];
    for (int w = 0; w < 2; w++)
        for (int h = 0; h < 4; h++)
            for (int j = 0; j < 3; j++)
                tail[(w * 4 + h) * 3 + j] = (float)(100 * w + 10 * h + j);
    sfi_selector_window_from_prefill(4, 2, 2, 3, tail, win);
    for (int kv = 0; kv < 2; kv++)
        for (int g = 0; g < 2; g++)
            for (int w = 0; w < 2; w++)
                for (int j = 0; j < 3; j++)
                    ck_assert(win[(kv * 4 + w * 2 + g) * 3 + j] ==
                              (float)(100 * w + 10 * (kv * 2 + g) + j));

    /* End to end: prefill of 40 tokens, tail W = 16, n_recent 8 (smaller
     * than W, so the early tail queries cannot see the end of J: masked
     * -inf entries inside J), then the Selector; and a decode step. */
    sfi_attn_shape sh = {4, 2, 16};
    const int T = 40, W = 16;
    float *q = malloc((size_t)T * 64 * sizeof *q), *k = malloc((size_t)T * 32 * sizeof *k),
          *v = malloc((size_t)T * 32 * sizeof *v), *out = malloc((size_t)T * 64 * sizeof *out);
    for (int i = 0; i < T * 64; i++)
        q[i] = urand() * 2.0f - 1.0f;
    for (int i = 0; i < T * 32; i++) {
        k[i] = urand() * 2.0f - 1.0f;
        v[i] = urand() * 2.0f - 1.0f;
    }
    float *tl = malloc((size_t)W * 4 * T * sizeof *tl),
          *wl = malloc((size_t)W * 4 * T * sizeof *wl);
    float norms[2 * 40];
    ck_assert_int_eq(sfi_attn_prefill(&sh, q, T, 0, k, v, out, W, tl, NULL), SFI_OK);
    sfi_selector_window_from_prefill(4, 2, W, T, tl, wl);
    sfi_key_norms(k, T, 2, 16, norms);
    sfi_params p = sfi_test_method_defaults();
    p.n_recent = 8;
    p.K = 6;
    /* J = [4, 32): tail query w sits at 24 + w and sees j <= 24 + w. */
    sfi_selector_input in = {2, 2 * W, T, 4, 32, wl, norms};
    int32_t sel[12], sel2[12];
    float f[2 * 28];
    sfi_selector_detail d = {0};
    d.f = f;
    int n;
    sfi_error e;
    ck_assert_msg(sfi_selector_run(&p, &in, sel, &n, &d, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(n, 6);
    ck_assert_int_eq(sfi_selector_run(&p, &in, sel2, &n, NULL, &e), SFI_OK);
    ck_assert(memcmp(sel, sel2, sizeof sel) == 0);
    for (int i = 0; i < 2 * 28; i++)
        ck_assert(f[i] > 0.0f); /* every j in J is seen by the last query */
    /* Decode: one query at position 40 over 41 keys; logits used as is. */
    float lg[4 * 40];
    ck_assert_int_eq(sfi_attn_dense_decode(&sh, q + 39 * 64, k, v, 40, out, lg, NULL), SFI_OK);
    sfi_selector_input dec = {2, 2, 40, 4, 32, lg, norms};
    ck_assert_int_eq(sfi_selector_run(&p, &dec, sel, &n, NULL, &e), SFI_OK);
    ck_assert_int_eq(n, 6);
    free(q);
    free(k);
    free(v);
    free(out);
    free(tl);
    free(wl);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("selector");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, hand_fusion_step5);
    tcase_add_test(tc, hand_soft_nms_step7);
    tcase_add_test(tc, hand_cross_head_step8);
    tcase_add_test(tc, hand_whole_selector);
    tcase_add_test(tc, hand_prior_step4);
    tcase_add_test(tc, hand_power_mean_steps2_3);
    tcase_add_test(tc, topk_ties_to_smaller_position);
    tcase_add_test(tc, properties_on_random_inputs);
    tcase_add_test(tc, matches_double_precision);
    tcase_add_test(tc, small_J_selects_everything);
    tcase_add_test(tc, bad_input);
    tcase_add_test(tc, inputs_from_attention);
    tcase_add_test(tc, extreme_finite_inputs_never_crash);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
