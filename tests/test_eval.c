/* sfi-ref eval (ref/sfi_eval.h) on the fixture checkpoints: a budget that
 * covers the whole context makes every policy full KV exactly (scalar and
 * BLAS); the oracle's KL is the lowest at every budget among the policies
 * that read no more than it; hand-made steps give the sets computed by
 * hand; budgets, SFI's split and the bootstrap; the command's output and
 * errors. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_eval.h"
#include "sfi_hf_fixture.h"
#include "sfi_qwen3.h"
#include "sfi_test_util.h"

static const char *models[3] = {"tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-moe-nonorm"};

/* A deterministic "text" of ids in [0, 512) with some repetition, so that
 * attention has something to find. */
static int32_t *text_ids(int n)
{
    int32_t *v = malloc(sizeof(int32_t) * (size_t)n);
    uint32_t s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        v[i] = (i >= 40 && (s >> 16) % 3 == 0) ? v[i - 37] : (int32_t)((s >> 16) % 512);
    }
    return v;
}

static void fixture_opts(sfi_eval_opts *o, sfi_backend be)
{
    sfi_eval_opts_default(o);
    o->backend = be;
    o->n_prefix = 150;
    o->n_tokens = 60;
    o->n_boot = 200;
    sfi_error e;
    ck_assert_int_eq(sfi_policy_config_set(&o->cfg, "n_recent=8", &e), SFI_OK);
    ck_assert_int_eq(sfi_policy_config_set(&o->cfg, "n_sink=2", &e), SFI_OK);
    ck_assert_int_eq(sfi_policy_config_set(&o->cfg, "T_max=16", &e), SFI_OK);
    ck_assert_int_eq(sfi_policy_config_set(&o->cfg, "fasa_tip=4", &e), SFI_OK);
    ck_assert_int_eq(sfi_policy_config_set(&o->cfg, "fasa_calib_k=16", &e), SFI_OK);
}

START_TEST(full_budget_is_full_kv)
{
    for (int be = 0; be < 2; be++) {
        if (be == 1 && !sfi_backend_available(SFI_BACKEND_BLAS)) {
            printf("note: no OpenBLAS backend built: scalar only\n");
            continue;
        }
        for (int mi = 0; mi < 3; mi++) {
            sfi_qwen3 *m;
            sfi_error e;
            ck_assert_msg(sfi_qwen3_load(hf_path(models[mi]), &m, &e) == SFI_OK, "%s", e.msg);
            sfi_eval_opts o;
            fixture_opts(&o, be ? SFI_BACKEND_BLAS : SFI_BACKEND_SCALAR);
            ck_assert_int_eq(sfi_eval_parse_shares("100%", &o, &e), SFI_OK);
            int32_t *ids = text_ids(211);
            sfi_eval_result r;
            ck_assert_msg(sfi_eval_run(m, &o, ids, 211, &r, &e) == SFI_OK, "%s", e.msg);
            /* every policy of the default list (the peers and SFI) */
            ck_assert_int_eq(r.n_rows, __builtin_popcount(SFI_EVAL_DEFAULT_POLICIES &
                                                          ~(1u << SFI_POLICY_FULL)));
            ck_assert(r.full_nll > 0.0);
            for (int i = 0; i < r.n_rows; i++) {
                const sfi_eval_row *w = &r.rows[i];
                ck_assert_msg(w->nll == r.full_nll && w->dnll == 0.0 && w->kl == 0.0 &&
                                  w->kl_max == 0.0 && w->top1 == 1.0 && w->retained == 1.0 &&
                                  w->dnll_lo == 0.0 && w->dnll_hi == 0.0,
                              "%s %s %s: NLL %.9g vs %.9g, KL %g, top-1 %g, retained %g",
                              models[mi], be ? "blas" : "scalar", sfi_policy_kind_name(w->kind),
                              w->nll, r.full_nll, w->kl, w->top1, w->retained);
                ck_assert_int_eq(w->budget, 210);
                /* every position read: all of the attention captured (SFI's
                 * sum of float probabilities within rounding) */
                ck_assert_msg(fabs(w->mass - 1.0) < 1e-5, "%s: mass %.9f at 100%%",
                              sfi_policy_kind_name(w->kind), w->mass);
            }
            /* the number of parallel runs changes nothing */
            sfi_eval_opts o1 = o;
            o1.n_threads = 1;
            ck_assert_int_eq(sfi_eval_parse_shares("7%,100%", &o1, &e), SFI_OK);
            o.n_threads = 3;
            ck_assert_int_eq(sfi_eval_parse_shares("7%,100%", &o, &e), SFI_OK);
            sfi_eval_result r1, r3;
            ck_assert_msg(sfi_eval_run(m, &o1, ids, 211, &r1, &e) == SFI_OK, "%s", e.msg);
            ck_assert_msg(sfi_eval_run(m, &o, ids, 211, &r3, &e) == SFI_OK, "%s", e.msg);
            ck_assert_int_eq(r1.n_threads, 1);
            ck_assert_int_eq(r3.n_threads, 3);
            ck_assert_int_eq(r1.n_rows, r3.n_rows);
            for (int i = 0; i < r1.n_rows; i++) {
                const sfi_eval_row *a = &r1.rows[i], *b = &r3.rows[i];
                ck_assert(a->kind == b->kind && a->nll == b->nll && a->kl == b->kl &&
                          a->top1 == b->top1 && a->retained == b->retained &&
                          a->dnll_lo == b->dnll_lo && a->dnll_hi == b->dnll_hi);
            }
            sfi_eval_result_free(&r1);
            sfi_eval_result_free(&r3);
            printf("%s (%s): every policy at 100%% == full KV (NLL %.6f); 1 or 3 threads "
                   "alike\n", models[mi], be ? "blas" : "scalar", r.full_nll);
            sfi_eval_result_free(&r);
            free(ids);
            sfi_qwen3_free(m);
        }
    }
}
END_TEST

/* Among the policies whose mean retained share is at most the oracle's
 * (equal budget in fact: Kascade's dense layer 0, SFI's dense slow steps
 * and LFPS's dense first step read more, and are reported, not compared),
 * the oracle's KL is the lowest at every budget, and it falls as the
 * budget grows. */
START_TEST(oracle_kl_lowest)
{
    for (int mi = 0; mi < 3; mi++) {
        sfi_qwen3 *m;
        sfi_error e;
        ck_assert_msg(sfi_qwen3_load(hf_path(models[mi]), &m, &e) == SFI_OK, "%s", e.msg);
        sfi_eval_opts o;
        fixture_opts(&o, SFI_BACKEND_SCALAR);
        o.n_tokens = 90;
        o.n_boot = 0;
        ck_assert_int_eq(sfi_eval_parse_shares("5%,10%,20%,40%", &o, &e), SFI_OK);
        int32_t *ids = text_ids(241);
        sfi_eval_result r;
        ck_assert_msg(sfi_eval_run(m, &o, ids, 241, &r, &e) == SFI_OK, "%s", e.msg);
        double prev = INFINITY, prev_mass = 0.0;
        for (int b = 0; b < o.n_shares; b++) {
            const sfi_eval_row *orc = NULL;
            for (int i = 0; i < r.n_rows; i++)
                if (r.rows[i].share == o.shares[b] && r.rows[i].kind == SFI_POLICY_ORACLE)
                    orc = &r.rows[i];
            ck_assert_ptr_nonnull(orc);
            ck_assert(orc->kl > 0.0 && orc->kl < prev);
            prev = orc->kl;
            /* the oracle's sets are the top-B of the pooled attention: more
             * positions capture more of it */
            ck_assert_msg(orc->mass > prev_mass && orc->mass < 1.0, "oracle mass %.6f after %.6f",
                          orc->mass, prev_mass);
            prev_mass = orc->mass;
            int compared = 0;
            for (int i = 0; i < r.n_rows; i++) {
                const sfi_eval_row *w = &r.rows[i];
                if (w->share != o.shares[b] || w->kind == SFI_POLICY_ORACLE)
                    continue;
                ck_assert(isnan(w->dnll_lo)); /* no bootstrap asked */
                if (w->retained > orc->retained + 1e-12) {
                    printf("  %s %4.0f%%: %-9s reads more (%.4f > %.4f), KL %.5f vs oracle "
                           "%.5f\n", models[mi], 100 * o.shares[b],
                           sfi_policy_kind_name(w->kind), w->retained, orc->retained, w->kl,
                           orc->kl);
                    continue;
                }
                compared++;
                /* no set of at most B positions per KV head captures more of
                 * the pooled attention than its top-B (mean over the group's
                 * query heads = the pooled mass) */
                ck_assert_msg(orc->mass >= w->mass - 1e-6,
                              "%s at %g: oracle mass %.6f < %s's %.6f", models[mi], o.shares[b],
                              orc->mass, sfi_policy_kind_name(w->kind), w->mass);
                ck_assert_msg(orc->kl < w->kl, "%s at %g: oracle KL %.6f >= %s's %.6f",
                              models[mi], o.shares[b], orc->kl, sfi_policy_kind_name(w->kind),
                              w->kl);
            }
            ck_assert_int_ge(compared, 4);
            printf("%s %4.0f%%: oracle KL %.5f lowest and mass %.4f highest of %d at its "
                   "budget\n", models[mi], 100 * o.shares[b], orc->kl, orc->mass, compared + 1);
        }
        sfi_eval_result_free(&r);
        free(ids);
        sfi_qwen3_free(m);
    }
}
END_TEST

/* One layer, G = 2 query heads on one KV head, head_dim 4, 10 or 20
 * positions: the sets computed by hand. */
static void policy_sets(sfi_policy_kind kind, const char *const *params, const float *q,
                        const float *k, int n_ctx, int budget, const int32_t *want, int n_want)
{
    sfi_policy_config cfg;
    sfi_policy_config_default(&cfg);
    sfi_error e;
    for (int i = 0; params[i]; i++)
        ck_assert_msg(sfi_policy_config_set(&cfg, params[i], &e) == SFI_OK, "%s", e.msg);
    sfi_eval_policy *p;
    ck_assert_msg(sfi_eval_policy_create(kind, &cfg, 1, 2, 1, 4, 32, NULL, &p, &e) == SFI_OK,
                  "%s", e.msg);
    sfi_eval_layer_step ls = {.layer = 0, .step = 0, .n_ctx = n_ctx, .budget = budget, .q = q,
                              .k = k};
    const int32_t *idx;
    const int *n_idx;
    ck_assert_msg(sfi_eval_policy_sets(p, &ls, &idx, &n_idx, &e) == SFI_OK, "%s", e.msg);
    char got[256] = "", exp[256] = "";
    for (int i = 0; i < n_idx[0]; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), " %d", (int)idx[i]);
    for (int i = 0; i < n_want; i++)
        snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %d", (int)want[i]);
    ck_assert_msg(!strcmp(got, exp), "%s: got {%s }, by hand {%s }", sfi_policy_kind_name(kind),
                  got, exp);
    /* a budget holding the whole context attends to all of it */
    ls.budget = n_ctx;
    ls.step = 1;
    ck_assert_msg(sfi_eval_policy_sets(p, &ls, &idx, &n_idx, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(n_idx[0], n_ctx);
    for (int i = 0; i < n_ctx; i++)
        ck_assert_int_eq(idx[i], i);
    printf("%s: {%s } as computed by hand\n", sfi_policy_kind_name(kind), got);
    sfi_eval_policy_free(p);
}

START_TEST(hand_made_sets)
{
    static const char *const none[] = {NULL};
    float q[8] = {0}, k[20 * 4] = {0};
    /* oracle: the policy computes the attention from q and K; head g's
     * query is 2 e_g (scale 1/2), so its logits are the keys' dim g, set
     * to ln of these probabilities. Pooled (mean of the two heads):
     *   pos   0    1     2     3     4    5     6    7     8    9
     *   h0   .30  .10   .10   .05   .05  .10   .10  .10   .05  .05
     *   h1   .10  .05   .05   .40   .05  .05   .10  .05   .05  .10
     *   mean .20  .075  .075  .225  .05  .075  .10  .075  .05  .075
     * top 3: 3 (.225), 0 (.20), 6 (.10) */
    static const float h0[10] = {.30f, .10f, .10f, .05f, .05f, .10f, .10f, .10f, .05f, .05f};
    static const float h1[10] = {.10f, .05f, .05f, .40f, .05f, .05f, .10f, .05f, .05f, .10f};
    q[0] = 2.0f;
    q[4 + 1] = 2.0f;
    for (int j = 0; j < 10; j++) {
        k[j * 4 + 0] = logf(h0[j]);
        k[j * 4 + 1] = logf(h1[j]);
    }
    static const int32_t want_oracle[] = {0, 3, 6};
    policy_sets(SFI_POLICY_ORACLE, none, q, k, 10, 3, want_oracle, 3);
    memset(q, 0, sizeof q);
    memset(k, 0, sizeof k);

    /* streaming, n_sink 2, B 5: sink {0, 1} + the last 3 */
    static const char *const sink2[] = {"n_sink=2", NULL};
    static const int32_t want_stream[] = {0, 1, 7, 8, 9};
    policy_sets(SFI_POLICY_STREAMING, sink2, q, k, 10, 5, want_stream, 5);

    /* Quest, pages of 4, B 8 = 2 pages, 20 positions = 5 pages. q: head 0
     * = e0, head 1 = e1, so page bound = max(max k0, max k1) over the page
     * (q >= 0: max(q min, q max) = q max). k0 = 5 at position 5 (page 1),
     * k1 = 3 at position 13 (page 3), everything else 0 or 1 (k0 = 1 at
     * position 18, page 4): pages 1 and 3. */
    q[0] = 1.0f;
    q[4 + 1] = 1.0f;
    k[5 * 4 + 0] = 5.0f;
    k[13 * 4 + 1] = 3.0f;
    k[18 * 4 + 0] = 1.0f;
    k[2 * 4 + 1] = -4.0f;
    /* (the paper's first two dense layers off: this model has one) */
    static const char *const page4[] = {"quest_page=4", "quest_dense_layers=0", NULL};
    static const int32_t want_quest[] = {4, 5, 6, 7, 12, 13, 14, 15};
    policy_sets(SFI_POLICY_QUEST, page4, q, k, 20, 8, want_quest, 8);

    /* FASA, head_dim 4: chunk 0 = dims (0, 2), chunk 1 = dims (1, 3). Both
     * query heads q = (1, 0.01, 1, 0.01); keys k0 = k2 = a_j (chunk 0
     * score 2 a_j), k1 = k3 = +-10 alternating (chunk 1 score +-0.2). The
     * full score 2 a_j +- 0.2 ranks as chunk 0 does (top 3 of a: positions
     * 6 (3.0), 2 (2.0), 4 (1.5)); chunk 1's top 3 are even positions
     * 0, 2, 4 (ties to the smaller), agreeing on 2 of 3. So tip = {0} and
     * the top 3 by chunk 0 are {2, 4, 6}. */
    static const float a[10] = {0.1f, 0.5f, 2.0f, 0.2f, 1.5f, 0.0f, 3.0f, 0.3f, 0.4f, 0.6f};
    memset(k, 0, sizeof k);
    for (int h = 0; h < 2; h++) {
        q[h * 4 + 0] = 1.0f;
        q[h * 4 + 1] = 0.01f;
        q[h * 4 + 2] = 1.0f;
        q[h * 4 + 3] = 0.01f;
    }
    for (int j = 0; j < 10; j++) {
        k[j * 4 + 0] = k[j * 4 + 2] = a[j];
        k[j * 4 + 1] = k[j * 4 + 3] = j % 2 ? -10.0f : 10.0f;
    }
    static const char *const fasa1[] = {"fasa_tip=1", "fasa_calib_k=3", NULL};
    static const int32_t want_fasa[] = {2, 4, 6};
    policy_sets(SFI_POLICY_FASA, fasa1, q, k, 10, 3, want_fasa, 3);

    /* SFI and full KV are run by the harness itself, not as peers */
    sfi_policy_config cfg;
    sfi_policy_config_default(&cfg);
    sfi_eval_policy *p;
    sfi_error e;
    ck_assert_int_eq(sfi_eval_policy_create(SFI_POLICY_SFI, &cfg, 1, 2, 1, 4, 32, NULL, &p, &e),
                     SFI_EINVAL);
    ck_assert_int_eq(sfi_eval_policy_create(SFI_POLICY_FULL, &cfg, 1, 2, 1, 4, 32, NULL, &p, &e),
                     SFI_EINVAL);
}
END_TEST

/* The oracle's and StreamingLLM's sets through the harness's interface on
 * random GQA steps (2 layers, 2 KV heads of 3 query heads each, head_dim
 * 8), checked against a brute force in double: per KV head, each set
 * holds min(B, n) distinct ascending positions in [0, n); every oracle
 * position has a pooled probability (mean of the group's softmaxes) at
 * least that of every position left out; so the oracle's captured pooled
 * mass is at least StreamingLLM's (sink + recent) at every budget, and
 * grows with it. Layers take their own keys (no stale set of the other
 * layer or KV head). A selection bug that mixes positions and indices,
 * KV heads and query heads, or layers fails here. */
static double pooled_prob(const float *q, const float *k, int n, int nkv, int G, int hd, int kvh,
                          int j)
{
    double p = 0.0;
    for (int g = 0; g < G; g++) {
        const float *qh = q + (size_t)(kvh * G + g) * hd;
        double lg[64], mx = -INFINITY, z = 0.0;
        for (int i = 0; i < n; i++) {
            double d = 0.0;
            for (int c = 0; c < hd; c++)
                d += (double)qh[c] * k[((size_t)i * nkv + kvh) * hd + c];
            lg[i] = d / sqrt((double)hd);
            if (lg[i] > mx)
                mx = lg[i];
        }
        for (int i = 0; i < n; i++)
            z += exp(lg[i] - mx);
        p += exp(lg[j] - mx) / z / G;
    }
    return p;
}

START_TEST(oracle_sets_top_mass)
{
    enum { NL = 2, NKV = 2, G = 3, HD = 8, N = 40 };
    sfi_policy_config cfg;
    sfi_policy_config_default(&cfg);
    sfi_error e;
    ck_assert_int_eq(sfi_policy_config_set(&cfg, "n_sink=2", &e), SFI_OK);
    sfi_eval_policy *orc, *str;
    ck_assert_int_eq(
        sfi_eval_policy_create(SFI_POLICY_ORACLE, &cfg, NL, NKV * G, NKV, HD, N, NULL, &orc, &e),
        SFI_OK);
    ck_assert_int_eq(sfi_eval_policy_create(SFI_POLICY_STREAMING, &cfg, NL, NKV * G, NKV, HD, N,
                                            NULL, &str, &e),
                     SFI_OK);
    static float q[NL][NKV * G * HD], k[NL][N * NKV * HD];
    uint32_t seed = 7;
    int checked = 0;
    for (int step = 1; step <= 3; step++) {
        int n = N - 3 + step;
        for (int l = 0; l < NL; l++) {
            /* sharper keys in layer 1, a few strong positions in each */
            for (int i = 0; i < NKV * G * HD; i++) {
                seed = seed * 1103515245u + 12345u;
                q[l][i] = (float)((seed >> 16) % 2001) / 1000.0f - 1.0f;
            }
            for (int i = 0; i < n * NKV * HD; i++) {
                seed = seed * 1103515245u + 12345u;
                k[l][i] = ((float)((seed >> 16) % 2001) / 1000.0f - 1.0f) * (l ? 3.0f : 1.0f);
            }
        }
        double prev[NL][NKV] = {{0}};
        for (int B = 1; B <= n; B++) {
            for (int l = 0; l < NL; l++) {
                const int32_t *io, *is;
                const int *no, *ns;
                sfi_eval_layer_step ls = {.layer = l, .step = step, .n_ctx = n, .budget = B,
                                          .q = q[l], .k = k[l]};
                ck_assert_msg(sfi_eval_policy_sets(orc, &ls, &io, &no, &e) == SFI_OK, "%s", e.msg);
                ck_assert_msg(sfi_eval_policy_sets(str, &ls, &is, &ns, &e) == SFI_OK, "%s", e.msg);
                for (int h = 0; h < NKV; h++) {
                    const int32_t *so = io + (size_t)h * N, *ss = is + (size_t)h * N;
                    ck_assert_int_eq(no[h], B);
                    ck_assert_int_eq(ns[h], B);
                    char in[N] = {0};
                    double mo = 0.0, ms = 0.0, min_in = INFINITY, max_out = -INFINITY;
                    for (int i = 0; i < B; i++) {
                        ck_assert(so[i] >= 0 && so[i] < n && (i == 0 || so[i] > so[i - 1]));
                        in[so[i]] = 1;
                        double p = pooled_prob(q[l], k[l], n, NKV, G, HD, h, so[i]);
                        mo += p;
                        if (p < min_in)
                            min_in = p;
                        /* streaming: sink {0, 1} then the most recent */
                        int want = i < (B < 2 ? B : 2) ? i : n - B + i;
                        ck_assert_msg(ss[i] == want, "streaming B %d: [%d] = %d, want %d", B, i,
                                      (int)ss[i], want);
                        ms += pooled_prob(q[l], k[l], n, NKV, G, HD, h, ss[i]);
                    }
                    for (int j = 0; j < n; j++)
                        if (!in[j]) {
                            double p = pooled_prob(q[l], k[l], n, NKV, G, HD, h, j);
                            if (p > max_out)
                                max_out = p;
                        }
                    ck_assert_msg(B == n || min_in >= max_out - 1e-6,
                                  "layer %d KV head %d B %d: a position left out has %.8f > "
                                  "%.8f in the set", l, h, B, max_out, min_in);
                    ck_assert_msg(mo >= ms - 1e-6, "layer %d KV head %d B %d: oracle mass %.6f "
                                  "< streaming's %.6f", l, h, B, mo, ms);
                    ck_assert_msg(mo >= prev[l][h] - 1e-9, "layer %d KV head %d: oracle mass "
                                  "%.6f at B %d < %.6f at B - 1", l, h, mo, B, prev[l][h]);
                    prev[l][h] = mo;
                    checked++;
                }
            }
        }
    }
    printf("oracle: top-B of the pooled attention, mass >= streaming's, on %d random GQA "
           "sets\n", checked);
    sfi_eval_policy_free(orc);
    sfi_eval_policy_free(str);
}
END_TEST

START_TEST(budgets_split_and_bootstrap)
{
    sfi_eval_opts o;
    sfi_eval_opts_default(&o);
    sfi_error e;
    ck_assert_int_eq(o.n_shares, 5);
    ck_assert(o.shares[0] == 0.02 && o.shares[4] == 0.27);
    ck_assert_int_eq(sfi_eval_parse_shares("2%,0.5,100%", &o, &e), SFI_OK);
    ck_assert_int_eq(o.n_shares, 3);
    ck_assert(o.shares[0] == 0.02 && o.shares[1] == 0.5 && o.shares[2] == 1.0);
    const char *bad[] = {"", "0", "1.5", "101%", "2%,", "x", "-3%", "2%%", ",2%"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(sfi_eval_parse_shares(bad[i], &o, &e) == SFI_EINVAL, "'%s' accepted",
                      bad[i]);
    ck_assert_int_eq(o.n_shares, 3); /* unchanged by a refused list */
    /* B = round(share * (L + N)) in [1, L + N] */
    ck_assert_int_eq(sfi_eval_budget(0.06, 8192, 512), 522);
    ck_assert_int_eq(sfi_eval_budget(0.27, 8192, 512), 2350);
    ck_assert_int_eq(sfi_eval_budget(1.0, 8192, 512), 8704);
    ck_assert_int_eq(sfi_eval_budget(1e-9, 100, 10), 1);
    /* SFI's split at the defaults of sfi(7) (n_sink 4, n_recent 256) */
    sfi_params prm = sfi_test_method_defaults();
    int r, K;
    sfi_eval_sfi_split(&prm, 174, 8704, &r, &K);
    ck_assert(r == 85 && K == 85);
    sfi_eval_sfi_split(&prm, 522, 8704, &r, &K);
    ck_assert(r == 256 && K == 262);
    sfi_eval_sfi_split(&prm, 2350, 8704, &r, &K);
    ck_assert(r == 256 && K == 2090);
    sfi_eval_sfi_split(&prm, 8704, 8704, &r, &K);
    ck_assert(r == 8700 && K == 1);
    sfi_eval_sfi_split(&prm, 5, 8704, &r, &K);
    ck_assert(r == 1 && K == 1);
}
END_TEST

/* The command: table, CSV and JSON agree; the PNG is a PNG; bad input
 * exits 1 or 2 with a message naming the problem. */
START_TEST(cli_eval)
{
    char sfi_ref[2048];
    snprintf(sfi_ref, sizeof sfi_ref, "%s", sfi_test_build("sfi-ref"));
    char model[2048];
    snprintf(model, sizeof model, "%s", hf_path("tiny-qwen3"));
    char *dir = sfi_test_tmpdir();
    char ids_path[4096], png[4096], cmd[16384];
    snprintf(ids_path, sizeof ids_path, "%s/ids.txt", dir);
    snprintf(png, sizeof png, "%s/q.png", dir);
    int32_t *ids = text_ids(200);
    FILE *f = fopen(ids_path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 200; i++)
        fprintf(f, "%d%c", (int)ids[i], i % 20 == 19 ? '\n' : ' ');
    fclose(f);
    const char *common = "-L 120 -n 40 --budgets 10%,50% --param n_recent=8 "
                         "--param fasa_tip=4 --policies oracle,streaming,sfi,quest "
                         "--backend scalar --bootstrap 100";
    char *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "%s eval -m %s --ids %s %s --format json --png %s", sfi_ref,
             model, ids_path, common, png);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    json_t *rows = json_object_get(j, "rows");
    ck_assert_int_eq(json_array_size(rows), 8);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "prefix")), 120);
    /* sfi has a slow fraction, the others null */
    int n_sfi = 0;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *w = json_array_get(rows, i);
        const char *pol = json_string_value(json_object_get(w, "policy"));
        json_t *sf = json_object_get(w, "slow_fraction");
        if (!strcmp(pol, "sfi")) {
            n_sfi++;
            ck_assert(json_is_real(sf));
        } else {
            ck_assert(json_is_null(sf));
        }
        double lo = json_real_value(json_object_get(w, "dnll_lo"));
        double hi = json_real_value(json_object_get(w, "dnll_hi"));
        double d = json_real_value(json_object_get(w, "dnll"));
        ck_assert(lo <= hi && lo <= d + 1e-9 && d <= hi + 1e-9);
    }
    ck_assert_int_eq(n_sfi, 2);
    ck_assert_ptr_nonnull(strstr(err, "eval: prefilling 120 tokens"));
    size_t plen = 0;
    char *pd = sfi_test_read_file(png, &plen);
    ck_assert_ptr_nonnull(pd);
    ck_assert(plen > 1000 && !memcmp(pd, "\x89PNG\r\n\x1a\n", 8));
    free(pd);
    free(out);
    free(err);
    /* the table and CSV carry the same numbers */
    snprintf(cmd, sizeof cmd, "%s eval -m %s --ids %s %s --format csv -q", sfi_ref, model,
             ids_path, common);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_str_eq(err, "");
    ck_assert_ptr_nonnull(strstr(out, "policy,share,budget,retained,mass,nll"));
    json_t *w0 = json_array_get(rows, 0);
    char line[256];
    snprintf(line, sizeof line, "\noracle,0.1,16,%.6f,%.6f,%.6f,",
             json_real_value(json_object_get(w0, "retained")),
             json_real_value(json_object_get(w0, "mass")),
             json_real_value(json_object_get(w0, "nll")));
    ck_assert_msg(strstr(out, line) != NULL, "%s not in\n%s", line, out);
    free(out);
    free(err);
    json_decref(j);
    snprintf(cmd, sizeof cmd, "%s eval -m %s --ids %s %s -q", sfi_ref, model, ids_path, common);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_ptr_nonnull(strstr(out, "full KV: NLL"));
    ck_assert_ptr_nonnull(strstr(out, "dNLL interval"));
    free(out);
    free(err);

    struct {
        const char *args;
        int rc;
        const char *msg;
    } bad[] = {
        {"--budgets 0%", 2, "budgets"},
        {"--budgets 2%,x", 2, "budgets"},
        {"--policies oracle,foo", 2, "unknown policy 'foo'"},
        {"--policies full", 2, "nothing to compare"},
        {"--format xml", 2, "--format"},
        {"--tokens 0", 2, "--tokens"},
        {"--param K=0", 2, "K"},
        {"--param nonsense=1", 2, "nonsense"},
        {"-L 180", 1, "need 221"},
        {"--offset 100", 1, "need 261"},
        {"--bootstrap -1", 2, "--bootstrap"},
        {"--seed -4", 2, "--seed"},
        {"--threads 0", 2, "--threads"},
        {"--threads 65", 2, "--threads"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s eval -m %s --ids %s -L 120 -n 40 -q %s", sfi_ref, model,
                 ids_path, bad[i].args);
        int rc = sfi_test_run(cmd, &out, &err);
        ck_assert_msg(rc == bad[i].rc && strstr(err, bad[i].msg),
                      "'%s': exit %d, stderr: %s", bad[i].args, rc, err);
        ck_assert_str_eq(out, "");
        free(out);
        free(err);
    }
    /* ids outside the vocabulary, no text source, text without a tokenizer */
    f = fopen(ids_path, "w");
    for (int i = 0; i < 200; i++)
        fprintf(f, "%d ", i == 150 ? 600 : 7);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s eval -m %s --ids %s -L 120 -n 40 -q", sfi_ref, model, ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "token 150 (id 600)"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s eval -m %s -q", sfi_ref, model);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 2);
    ck_assert_ptr_nonnull(strstr(err, "exactly one of --text, --ids, --trace"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s eval -m %s --text %s -q", sfi_ref, model, ids_path);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "no vocab.json + merges.txt"));
    free(out);
    free(err);
    /* a failing run leaves no PNG behind */
    snprintf(png, sizeof png, "%s/none.png", dir);
    snprintf(cmd, sizeof cmd, "%s eval -m %s --ids %s -L 120 -n 40 -q --png %s", sfi_ref, model,
             ids_path, png);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_null(sfi_test_read_file(png, NULL));
    free(out);
    free(err);
    free(ids);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("eval");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, full_budget_is_full_kv);
    tcase_add_test(tc, oracle_kl_lowest);
    tcase_add_test(tc, hand_made_sets);
    tcase_add_test(tc, oracle_sets_top_mass);
    tcase_add_test(tc, budgets_split_and_bootstrap);
    tcase_add_test(tc, cli_eval);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
