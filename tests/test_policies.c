/* Comparison policies on small hand-made steps whose right answer is known
 * (sfi(7) PEER METHODS), with a hand-worked case from each paper's rule:
 * LFPS's table seeding, kurtosis threshold, expansion and sink bypass;
 * Kascade's weighted dynamic program and head map; FASA's chunk ranking;
 * H2O's prompt accumulation; SnapKV's observation window. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_policies.h"

/* One head's obs from parallel arrays (positions sorted by probability by
 * the caller). */
static sfi_policy_obs mk_obs(int n_ctx, int n, const int32_t *pos, const float *prob)
{
    sfi_policy_obs o = {n_ctx, n, pos, prob, 0.0f};
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += prob[i];
    o.tail = s < 1.0f ? 1.0f - s : 0.0f;
    return o;
}

/* A one-layer (layers layers) policy over H KV heads with G query heads
 * each and head_dim d (0: trace-driven only). */
static sfi_policy *mk_shape(sfi_policy_kind k, const sfi_policy_config *c, int layers, int H,
                            int G, int d, int max_ctx, const sfi_policy_calib *cal)
{
    sfi_policy *p = NULL;
    sfi_error e;
    sfi_policy_shape sh = {layers, H * G, H, d};
    ck_assert_msg(sfi_policy_create(k, c, &sh, max_ctx, cal, &p, &e) == SFI_OK, "%s", e.msg);
    return p;
}

static sfi_policy *mk(sfi_policy_kind k, const sfi_policy_config *c, int H, int max_ctx)
{
    return mk_shape(k, c, 1, H, 1, 0, max_ctx, NULL);
}

static void run1(sfi_policy *p, int step, int n_ctx, int B, const sfi_policy_obs *obs,
                 sfi_policy_set *sets)
{
    sfi_policy_step st = {.step = step, .n_ctx = n_ctx, .budget = B, .obs = obs};
    int avail = 0;
    sfi_error e;
    ck_assert_msg(sfi_policy_run(p, 0, &st, sets, &avail, NULL, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(avail, 1);
}

/* One real-path step of layer `layer`. */
static void run_qk(sfi_policy *p, int layer, int step, int n_ctx, int B, const float *q,
                   const float *k, sfi_policy_set *sets)
{
    sfi_policy_step st = {.step = step, .n_ctx = n_ctx, .budget = B, .q = q, .k = k};
    int avail = 0;
    sfi_error e;
    ck_assert_msg(sfi_policy_run(p, layer, &st, sets, &avail, NULL, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(avail, 1);
}

static int count_members(const sfi_policy_set *s)
{
    int n = 0;
    for (int j = 0; j < s->n_ctx; j++)
        n += sfi_policy_set_contains(s, j);
    return n;
}

/* Keys of head_dim 2 whose logits for q = (sqrt 2, 0) are ln a_j: the
 * softmax over any subset is then a_j / sum a (scale 1/sqrt 2). */
static void keys_for_weights(const double *a, int n, float *k)
{
    for (int j = 0; j < n; j++) {
        k[2 * j] = (float)log(a[j]);
        k[2 * j + 1] = 0.0f;
    }
}

static const float Q_UNIT[2] = {1.41421356f, 0.0f};

START_TEST(names_lists_specs_and_budgets)
{
    unsigned m = 0;
    sfi_error e;
    ck_assert_int_eq(sfi_policy_parse_list("oracle,sfi,h2o", &m, &e), SFI_OK);
    ck_assert_uint_eq(m, (1u << SFI_POLICY_ORACLE) | (1u << SFI_POLICY_SFI) |
                             (1u << SFI_POLICY_H2O));
    ck_assert_int_eq(sfi_policy_parse_list("all", &m, &e), SFI_OK);
    ck_assert_uint_eq(m, SFI_POLICY_ALL);
    ck_assert_int_eq(sfi_policy_parse_list("oracle,bogus", &m, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "'bogus'"));
    ck_assert_int_eq(sfi_policy_parse_list("", &m, &e), SFI_EINVAL);
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        sfi_policy_kind kk;
        ck_assert_int_eq(sfi_policy_kind_parse(sfi_policy_kind_name((sfi_policy_kind)k), &kk, &e),
                         0);
        ck_assert_int_eq(kk, k);
    }
    /* The SFI kinds map to their trigger policies; the rest have none. */
    ck_assert_int_eq(sfi_policy_trigger_kind(SFI_POLICY_INTERVAL), SFI_TRIG_INTERVAL);
    ck_assert_int_eq(sfi_policy_trigger_kind(SFI_POLICY_BOUNDARY), SFI_TRIG_BOUNDARY);
    ck_assert(sfi_policy_has_slow_steps(SFI_POLICY_TMAX) &&
              !sfi_policy_has_slow_steps(SFI_POLICY_LFPS));
    /* One set of defaults, the papers' where they give one. */
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    ck_assert_int_eq(c.quest_page, 16);
    ck_assert_int_eq(c.snapkv_window, 32);
    ck_assert_int_eq(c.lfps_s, 32);
    ck_assert_int_eq(c.lfps_keep, 4);
    ck_assert_int_eq(c.kascade_calib_k, 64);
    ck_assert_int_eq(c.fasa_calib_k, 256);
    ck_assert_int_eq(sfi_policy_fasa_tip(&c, 128), 16); /* 16 of 64 chunks */
    ck_assert_int_eq(sfi_policy_fasa_tip(&c, 64), 8);   /* a quarter, not 16 */
    ck_assert_int_eq(sfi_policy_kascade_anchors(&c, 36), 5); /* Qwen3-8B: 5 */
    ck_assert_int_eq(sfi_policy_kascade_anchors(&c, 32), 5);
    ck_assert_int_eq(sfi_policy_kascade_anchors(&c, 10), 2);
    ck_assert_double_eq_tol(sfi_policy_lfps_cand_share(&c, 8192), 0.046, 1e-9);
    ck_assert_double_eq_tol(sfi_policy_lfps_cand_share(&c, 131072), 0.017, 1e-9);
    ck_assert_double_eq_tol(sfi_policy_lfps_cand_share(&c, 32768), 0.0315, 1e-3);
    ck_assert_int_eq(sfi_policy_config_set(&c, "quest_page=32", &e), SFI_OK);
    ck_assert_int_eq(c.quest_page, 32);
    ck_assert_int_eq(sfi_policy_config_set(&c, "lfps_r=2", &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_policy_config_set(&c, "nope", &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_policy_config_set(&c, "K=512", &e), SFI_OK);
    ck_assert_int_eq(c.prm.K, 512);
    /* Specs: the policy's prefix may be dropped. */
    sfi_policy_kind k;
    sfi_policy_config_default(&c);
    ck_assert_int_eq(sfi_policy_spec_parse("quest:page=32", &k, &c, &e), SFI_OK);
    ck_assert_int_eq(k, SFI_POLICY_QUEST);
    ck_assert_int_eq(c.quest_page, 32);
    ck_assert_int_eq(sfi_policy_spec_parse("lfps:cand=0.03,a=0.5", &k, &c, &e), SFI_OK);
    ck_assert_float_eq_tol(c.lfps_cand, 0.03f, 1e-7f);
    ck_assert_float_eq_tol(c.lfps_a, 0.5f, 1e-7f);
    ck_assert_int_eq(sfi_policy_spec_parse("interval:interval=8", &k, &c, &e), SFI_OK);
    ck_assert_int_eq(c.interval, 8);
    ck_assert_int_eq(sfi_policy_spec_parse("sfi:K=1024", &k, &c, &e), SFI_OK);
    ck_assert_int_eq(c.prm.K, 1024);
    ck_assert_int_eq(sfi_policy_spec_parse("quest:bogus=1", &k, &c, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_policy_spec_parse("quest:page=0", &k, &c, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_policy_spec_parse("nope", &k, &c, &e), SFI_ENOTFOUND);
    /* The one budget. */
    sfi_budget b;
    sfi_params prm;
    sfi_params_default(&prm);
    ck_assert_int_eq(sfi_budget_parse("6%", &b, &e), SFI_OK);
    ck_assert_int_eq(sfi_budget_positions(&b, &prm, 8000), 480);
    ck_assert_int_eq(sfi_budget_parse("0.06", &b, &e), SFI_OK);
    ck_assert_int_eq(sfi_budget_positions(&b, &prm, 8008), 480); /* round(480.48) */
    ck_assert_int_eq(sfi_budget_parse("2308", &b, &e), SFI_OK);
    ck_assert_int_eq(sfi_budget_positions(&b, &prm, 8000), 2308);
    ck_assert_int_eq(sfi_budget_positions(&b, &prm, 1000), 1000); /* clipped */
    ck_assert_int_eq(sfi_budget_parse("sfi", &b, &e), SFI_OK);
    ck_assert_int_eq(sfi_budget_positions(&b, &prm, 100000), 4 + 2048 + 256);
    int r, K;
    sfi_budget_sfi_split(&prm, 480, 8000, &r, &K);
    ck_assert(r == 238 && K == 238); /* recent halves below n_sink + 2 n_recent */
    sfi_budget_sfi_split(&prm, 2308, 100000, &r, &K);
    ck_assert(r == 256 && K == 2048);
    sfi_budget_sfi_split(&prm, 900, 900, &r, &K);
    ck_assert(r == 896 && K == 1); /* the budget covers the run */
    char buf[32];
    ck_assert_int_eq(sfi_budget_parse("6%", &b, &e), SFI_OK);
    sfi_budget_format(&b, buf, sizeof buf);
    ck_assert_str_eq(buf, "6%");
    ck_assert_int_eq(sfi_budget_parse("1.5", &b, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_budget_parse("0", &b, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_budget_parse("6%%", &b, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_budget_parse("", &b, &e), SFI_EINVAL);
}
END_TEST

START_TEST(recall_counts_entries_and_spreads_tail)
{
    /* 10 positions; entries 3 (0.5) and 7 (0.3), tail 0.2 over 8 others. */
    int32_t pos[] = {3, 7};
    float prob[] = {0.5f, 0.3f};
    sfi_policy_obs o = mk_obs(10, 2, pos, prob);
    sfi_policy_set s = {.n_ctx = 10, .sink_end = 2, .recent_begin = 7, .size = 5};
    /* members {0,1,7,8,9}: entry 7 inside, 4 non-entries -> 0.3 + 0.2*4/8 */
    double lo;
    int n_in, n_top;
    double r = sfi_policy_set_recall(&s, &o, 1, &lo, &n_in, &n_top);
    ck_assert_double_eq_tol(r, 0.4, 1e-6);
    ck_assert_double_eq_tol(lo, 0.3, 1e-6);
    ck_assert_int_eq(n_in, 1);
    ck_assert_int_eq(n_top, 0); /* the top-1 (position 3) is outside */
    sfi_policy_set d = {.n_ctx = 10, .dense = 1, .recent_begin = 10, .size = 10};
    ck_assert_double_eq_tol(sfi_policy_set_recall(&d, &o, 2, NULL, NULL, &n_top), 1.0, 1e-6);
    ck_assert_int_eq(n_top, 2);
    int32_t idx[10];
    int n;
    sfi_policy_set_indices(&s, idx, &n);
    ck_assert_int_eq(n, 5);
    ck_assert(idx[0] == 0 && idx[1] == 1 && idx[2] == 7 && idx[4] == 9);
}
END_TEST

START_TEST(streaming_keeps_exactly_sink_and_recent)
{
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    sfi_policy *p = mk(SFI_POLICY_STREAMING, &c, 2, 200);
    int32_t pos[] = {50};
    float prob[] = {0.9f};
    sfi_policy_obs o[2] = {mk_obs(100, 1, pos, prob), mk_obs(100, 1, pos, prob)};
    sfi_policy_set s[2];
    run1(p, 0, 100, 20, o, s);
    for (int h = 0; h < 2; h++) {
        ck_assert_int_eq(s[h].size, 20);
        ck_assert_int_eq(count_members(&s[h]), 20);
        for (int j = 0; j < 100; j++)
            ck_assert_int_eq(sfi_policy_set_contains(&s[h], j), j < 4 || j >= 84);
    }
    sfi_policy_free(p);
}
END_TEST

START_TEST(oracle_and_full)
{
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    sfi_policy *p = mk(SFI_POLICY_ORACLE, &c, 1, 100);
    int32_t pos[] = {9, 2, 40, 33};
    float prob[] = {0.4f, 0.3f, 0.2f, 0.05f};
    sfi_policy_obs o = mk_obs(50, 4, pos, prob);
    sfi_policy_set s;
    run1(p, 0, 50, 3, &o, &s);
    ck_assert_int_eq(s.size, 3);
    ck_assert_int_eq(count_members(&s), 3);
    ck_assert(sfi_policy_set_contains(&s, 9) && sfi_policy_set_contains(&s, 2) &&
              sfi_policy_set_contains(&s, 40) && !sfi_policy_set_contains(&s, 33));
    /* Budget past the entries: all entries plus 2 unnamed positions. */
    run1(p, 1, 50, 6, &o, &s);
    ck_assert_int_eq(s.size, 6);
    ck_assert_int_eq(s.n_virtual, 2);
    ck_assert_int_eq(count_members(&s), 4);
    sfi_policy_free(p);
    /* On q and K: the exact top-3 of a = {1, 5, 2, 8, 3, 1}: 3, 1, 4. */
    double a[6] = {1, 5, 2, 8, 3, 1};
    float k[12];
    keys_for_weights(a, 6, k);
    p = mk_shape(SFI_POLICY_ORACLE, &c, 1, 1, 1, 2, 10, NULL);
    run_qk(p, 0, 0, 6, 3, Q_UNIT, k, &s);
    for (int j = 0; j < 6; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), j == 1 || j == 3 || j == 4);
    ck_assert_int_eq(s.n_virtual, 0);
    sfi_policy_free(p);
    p = mk(SFI_POLICY_FULL, &c, 1, 100);
    run1(p, 0, 50, 3, &o, &s);
    ck_assert(s.dense);
    ck_assert_int_eq(count_members(&s), 50);
    sfi_policy_free(p);
}
END_TEST

START_TEST(h2o_known_answer_and_no_return)
{
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    sfi_policy *p = mk(SFI_POLICY_H2O, &c, 1, 100);
    sfi_policy_set s;
    /* B = 6: recent 3, heavy 3. Step 0 over 10 positions: heavy keeps the
     * three scored positions 1, 4, 6 of candidates 0..6. */
    int32_t p0[] = {1, 4, 6};
    float q0[] = {0.5f, 0.3f, 0.1f};
    sfi_policy_obs o = mk_obs(10, 3, p0, q0);
    run1(p, 0, 10, 6, &o, &s);
    ck_assert_int_eq(s.size, 6);
    for (int j = 0; j < 10; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), j == 1 || j == 4 || j >= 6);
    ck_assert_ptr_nonnull(sfi_policy_proxy_note(p)); /* no prompt: a proxy */
    /* Step 1: position 7 leaves the recent window with no mass and is the
     * lowest, so it is evicted; 2 (evicted at step 0) stays out. */
    int32_t p1[] = {2, 7, 1};
    float q1[] = {0.6f, 0.3f, 0.1f};
    o = mk_obs(11, 3, p1, q1);
    run1(p, 1, 11, 6, &o, &s);
    for (int j = 0; j < 11; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), j == 1 || j == 4 || j == 6 || j >= 8);
    o = mk_obs(12, 3, p1, q1);
    run1(p, 2, 12, 6, &o, &s);
    ck_assert(!sfi_policy_set_contains(&s, 2) && !sfi_policy_set_contains(&s, 7));
    ck_assert(sfi_policy_set_contains(&s, 6) && sfi_policy_set_contains(&s, 1));
    ck_assert_int_eq(count_members(&s), 6);
    sfi_policy_free(p);
}
END_TEST

START_TEST(h2o_heavy_hitters_from_the_prompt)
{
    /* H2O's scores are the prompt's accumulated attention (column sums
     * over every prompt query), pooled over the group: heads 0 and 1 of
     * KV head 0. 8 prompt positions, B = 4 at the first decode step
     * (n_ctx 9): recent 2 (7, 8), heavy 2 among 0..6 by the scores
     * (2 + 0, 0.1 + 3, 1 + 1, ...) -> positions 1 and 0 (ties... none). */
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    float colsum[2][8] = {{2.0f, 0.1f, 1.0f, 0.2f, 0.3f, 0.1f, 0.1f, 0.9f},
                          {0.0f, 3.0f, 1.0f, 0.1f, 0.1f, 0.1f, 0.1f, 0.9f}};
    double a[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    float k[18], q[4] = {1.41421356f, 0, 1.41421356f, 0};
    keys_for_weights(a, 9, k);
    sfi_policy *p = mk_shape(SFI_POLICY_H2O, &c, 1, 1, 2, 2, 20, NULL);
    sfi_policy_prompt pr = {.n_prompt = 8, .n_tail = 1, .q_tail = q, .k = k,
                            .colsum = &colsum[0][0]};
    sfi_error e;
    ck_assert_int_eq(sfi_policy_prompt_run(p, 0, &pr, &e), SFI_OK);
    sfi_policy_set s;
    run_qk(p, 0, 1, 9, 4, q, k, &s);
    /* pooled scores: 1.0, 1.55, 1.0, ...: heavy = 1 and then 0 vs 2 tie
     * at 1.0 -> the earlier position is evicted first, so 2 stays. */
    for (int j = 0; j < 9; j++)
        ck_assert_msg(sfi_policy_set_contains(&s, j) == (j == 1 || j == 2 || j >= 7),
                      "position %d", j);
    ck_assert_ptr_null(sfi_policy_proxy_note(p));
    sfi_policy_free(p);
}
END_TEST

START_TEST(snapkv_window_and_pooled_ranking)
{
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    c.snapkv_window = 8;
    sfi_policy *p = mk(SFI_POLICY_SNAPKV, &c, 1, 200);
    sfi_policy_set s;
    int32_t p0[] = {50, 20, 90};
    float q0[] = {0.4f, 0.3f, 0.2f};
    sfi_policy_obs o = mk_obs(100, 3, p0, q0);
    /* Without a prompt the first step is the observation. B = 13: the
     * window 92..99 + 5 from the ranking of 0..91; the pooled window of 50
     * (47..53) ties, later positions first: 49..53. */
    run1(p, 0, 100, 13, &o, &s);
    ck_assert_int_eq(s.size, 13);
    for (int j = 0; j < 100; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), (j >= 49 && j <= 53) || j >= 92);
    /* Never refreshed; the window and generated tokens all stay: 92..100
     * (9), then 11 from the ranking: 47..53, then 23..20 (0.3, later
     * first). */
    int32_t p1[] = {20};
    float q1[] = {0.9f};
    o = mk_obs(101, 1, p1, q1);
    run1(p, 1, 101, 20, &o, &s);
    ck_assert_int_eq(s.size, 20);
    for (int j = 0; j < 101; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j),
                         (j >= 47 && j <= 53) || (j >= 20 && j <= 23) || j >= 92);
    sfi_policy_free(p);
    /* With the prompt: the observation window is the last snapkv_window
     * prompt queries. Prompt of 6, window 2: queries at 4 and 5 with
     * uniform attention over what they see; scores for 0..3 are
     * 1/5 + 1/6 each, so the ranking ties and the later positions win;
     * max-pool radius 0. B = 4 at n_ctx 7: window 4,5 + generated 6 + 1
     * from the ranking: position 3. */
    c.snapkv_window = 2;
    c.snapkv_pool = 0;
    double a[7] = {1, 1, 1, 1, 1, 1, 1};
    float k[14], qt[4] = {1.41421356f, 0, 1.41421356f, 0};
    keys_for_weights(a, 7, k);
    p = mk_shape(SFI_POLICY_SNAPKV, &c, 1, 1, 1, 2, 20, NULL);
    sfi_policy_prompt pr = {.n_prompt = 6, .n_tail = 2, .q_tail = qt, .k = k};
    sfi_error e;
    ck_assert_int_eq(sfi_policy_prompt_run(p, 0, &pr, &e), SFI_OK);
    run_qk(p, 0, 1, 7, 4, Q_UNIT, k, &s);
    for (int j = 0; j < 7; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), j >= 3);
    ck_assert_ptr_null(sfi_policy_proxy_note(p));
    sfi_policy_free(p);
}
END_TEST

START_TEST(quest_picks_largest_minmax_bound)
{
    /* Keys of dim 2, page 4 (3 pages of 12 positions); all zero except
     * page 1 = {(1,0), (0,1)} (bound for q=(1,1): 1+1 = 2, best dot 1)
     * and page 2 = {(1.5, 0)} (bound and best dot 1.5). Quest takes the
     * page with the larger bound: page 1. */
    float k[12 * 2] = {0};
    k[4 * 2 + 0] = 1.0f;
    k[5 * 2 + 1] = 1.0f;
    k[8 * 2 + 0] = 1.5f;
    float q[2] = {1.0f, 1.0f};
    float sc[3];
    sfi_policy_quest_scores(q, k, 12, 1, 1, 2, 0, 4, sc);
    ck_assert_float_eq_tol(sc[0], 0.0f, 1e-6f);
    ck_assert_float_eq_tol(sc[1], 2.0f, 1e-6f);
    ck_assert_float_eq_tol(sc[2], 1.5f, 1e-6f);
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    c.quest_page = 4;
    c.quest_dense_layers = 1;
    sfi_policy *p = mk_shape(SFI_POLICY_QUEST, &c, 2, 1, 1, 2, 100, NULL);
    sfi_policy_set s;
    run_qk(p, 1, 0, 12, 4, q, k, &s);
    ck_assert_int_eq(s.size, 4);
    for (int j = 0; j < 12; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), j >= 4 && j < 8);
    /* The first quest_dense_layers layers attend densely. */
    run_qk(p, 0, 0, 12, 4, q, k, &s);
    ck_assert(s.dense);
    /* Without q and K Quest cannot act: no page bound stands in (the old
     * largest-recorded-probability proxy was an oracle). */
    int32_t pos[] = {8};
    float prob[] = {0.9f};
    sfi_policy_obs o = mk_obs(12, 1, pos, prob);
    sfi_policy_step st = {.n_ctx = 12, .budget = 4, .obs = &o};
    int avail = 1;
    sfi_error e;
    ck_assert_int_eq(sfi_policy_run(p, 1, &st, &s, &avail, NULL, &e), SFI_OK);
    ck_assert_int_eq(avail, 0);
    sfi_policy_free(p);
}
END_TEST

START_TEST(lfps_kurtosis_without_factor_n)
{
    /* Table {4, 0, 0, 0}: mean 1, d = {3, -1, -1, -1}, sum d^2 = 12,
     * sum d^4 = 84: kappa = 84 / 144 (the paper's; n * that = 2.33 was
     * the old code's). */
    double t[4] = {4, 0, 0, 0}, mean, kurt;
    sfi_policy_lfps_moments(t, 4, &mean, &kurt);
    ck_assert_double_eq_tol(mean, 1.0, 1e-12);
    ck_assert_double_eq_tol(kurt, 84.0 / 144.0, 1e-12);
    double flat[3] = {2, 2, 2};
    sfi_policy_lfps_moments(flat, 3, &mean, &kurt);
    ck_assert_double_eq_tol(kurt, 0.0, 1e-12);
}
END_TEST

START_TEST(lfps_tables_seeded_from_prompt_queries)
{
    /* Prompt of 4 positions, s = 2 seed queries (positions 2 and 3) with
     * attention a = {2, 1, 1, 4} over what each sees: query 2 {.5, .25,
     * .25}, query 3 {.25, .125, .125, .5}. Phi = sum w / (2 s (1 - r)),
     * factor 1 / (2 * 2 * 0.05) = 5, never negative. */
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    c.lfps_s = 2;
    double a[6] = {2, 1, 1, 4, 1, 1};
    float k[12], qt[4] = {1.41421356f, 0, 1.41421356f, 0};
    keys_for_weights(a, 6, k);
    sfi_policy *p = mk_shape(SFI_POLICY_LFPS, &c, 1, 1, 1, 2, 20, NULL);
    sfi_policy_prompt pr = {.n_prompt = 4, .n_tail = 2, .q_tail = qt, .k = k};
    sfi_error e;
    ck_assert_int_eq(sfi_policy_prompt_run(p, 0, &pr, &e), SFI_OK);
    double ver[4] = {3.75, 1.875, 1.875, 2.5}, sla[4] = {3.75, 1.875, 3.125, 1.25};
    for (int i = 0; i < 4; i++) {
        ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 0, i), ver[i], 1e-5);
        ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 1, i), sla[i], 1e-5);
    }
    ck_assert_ptr_null(sfi_policy_proxy_note(p));
    sfi_policy_free(p);
}
END_TEST

START_TEST(lfps_candidates_expansion_keep_and_update)
{
    /* Trace path. Step 0 (no prompt: dense, a proxy) seeds from its
     * attention {10: .6, 3: .3, 11: .1} as one query (s = 1): Phi = 10 w:
     * ver[10] = 6, ver[3] = 3, ver[11] = 1; slash by offset from 19:
     * sla[9] = 6, sla[16] = 3, sla[8] = 1. */
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    sfi_policy *p = mk(SFI_POLICY_LFPS, &c, 1, 100);
    sfi_policy_set s;
    int32_t p0[] = {10, 3, 11};
    float q0[] = {0.6f, 0.3f, 0.1f};
    sfi_policy_obs o = mk_obs(20, 3, p0, q0);
    run1(p, 0, 20, 100, &o, &s);
    ck_assert(s.dense);
    ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 0, 10), 6.0, 1e-5);
    ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 1, 16), 3.0, 1e-5);
    /* Step 1 (21 positions, current 20). Both tables hold {6, 3, 1} and
     * 18 zeros: mean 10/21, kappa 0.5725, threshold a * mean / kappa =
     * 0.166: vertical candidates 3, 10, 11; slash offsets 9, 8, 16 are
     * positions 11, 12, 4. Neighbours -1, +1, +2 join only where their
     * vertical or slash score exceeds the mean: none does beyond those.
     * The first 4 tokens always. So C = {0, 1, 2, 3, 4, 10, 11, 12}. */
    int32_t p1[] = {11, 0};
    float q1[] = {0.5f, 0.2f};
    o = mk_obs(21, 2, p1, q1);
    run1(p, 1, 21, 100, &o, &s);
    ck_assert_int_eq(sfi_policy_lfps_candidates(p, 0, 0), 5);
    for (int j = 0; j < 21; j++)
        ck_assert_msg(sfi_policy_set_contains(&s, j) ==
                          (j <= 4 || j == 10 || j == 11 || j == 12), "position %d", j);
    ck_assert_int_eq(s.size, 8);
    /* Updates with w over C (recall R = 0.7 + 0.3 * 6/19), base 1/16:
     * ver[11] = 0.95 * 1 + 0.5/R - 1/16; ver[10] = 0.95 * 6 + (0.3/19)/R -
     * 1/16; slash offset 9 (position 11) = 0.95 * 6 + 0.5/R - 1/16. */
    double R = 0.7 + 0.3 * 6.0 / 19.0;
    ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 0, 11), 0.95 + 0.5 / R - 0.0625,
                            1e-5);
    ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 0, 10),
                            5.7 + (0.3 / 19.0) / R - 0.0625, 1e-5);
    ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 1, 9), 5.7 + 0.5 / R - 0.0625, 1e-5);
    ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 0, 5), 0.0, 1e-12);
    /* A budget below the candidates keeps the first 4 and the exact
     * top-(B - 4) of the rest: 11 has the recorded mass. */
    int32_t p2[] = {11, 12};
    float q2[] = {0.6f, 0.1f};
    o = mk_obs(22, 2, p2, q2);
    run1(p, 2, 22, 5, &o, &s);
    ck_assert_int_eq(s.size, 5);
    for (int j = 0; j < 22; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), j < 4 || j == 11);
    sfi_policy_free(p);
}
END_TEST

START_TEST(lfps_sink_bypass_skips_the_update)
{
    /* Trace path: 0.9 of the recorded attention on the first tokens: the
     * set is the first 4 tokens and the tables stay as they were. */
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    sfi_policy *p = mk(SFI_POLICY_LFPS, &c, 1, 100);
    sfi_policy_set s;
    int32_t p0[] = {30, 0};
    float q0[] = {0.5f, 0.5f};
    sfi_policy_obs o = mk_obs(40, 2, p0, q0);
    run1(p, 0, 40, 100, &o, &s);
    double before = sfi_policy_lfps_table(p, 0, 0, 0, 30);
    int32_t p1[] = {0, 30};
    float q1[] = {0.9f, 0.1f};
    o = mk_obs(41, 2, p1, q1);
    run1(p, 1, 41, 100, &o, &s);
    ck_assert_int_eq(s.size, 4);
    for (int j = 0; j < 41; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), j < 4);
    ck_assert_double_eq_tol(sfi_policy_lfps_table(p, 0, 0, 0, 30), before, 1e-12);
    sfi_policy_free(p);
    /* Real path: the share is estimated before selecting. The 4 sink keys
     * have logit ln 10, the others identical with logit 0 (covariance 0,
     * so the log-normal prior is exact): share = 40 / (40 + n - 4). At
     * n = 14: 0.8, no bypass; at n = 10: 0.87, bypass. */
    double a[14];
    for (int j = 0; j < 14; j++)
        a[j] = j < 4 ? 10.0 : 1.0;
    float k[28];
    keys_for_weights(a, 14, k);
    c.lfps_s = 1;
    for (int n = 10; n <= 14; n += 4) {
        p = mk_shape(SFI_POLICY_LFPS, &c, 1, 1, 1, 2, 20, NULL);
        sfi_policy_prompt pr = {.n_prompt = n - 1, .n_tail = 1, .q_tail = Q_UNIT, .k = k};
        sfi_error e;
        ck_assert_int_eq(sfi_policy_prompt_run(p, 0, &pr, &e), SFI_OK);
        run_qk(p, 0, 1, n, 100, Q_UNIT, k, &s);
        if (n == 10)
            ck_assert_int_eq(s.size, 4);
        else
            ck_assert_int_gt(s.size, 4);
        sfi_policy_free(p);
    }
}
END_TEST

START_TEST(kascade_weighted_dp_on_a_tiny_similarity)
{
    /* 5 layers; layer 0 dense and outside the program; 2 anchors among
     * 1..4 with layer 1 first. sim (row anchor a, column reuse b):
     *   sim[1][2] = 0.9, sim[1][3] = 0.1, sim[1][4] = 0.1
     *   sim[2][3] = 0.2, sim[2][4] = 0.8, sim[3][4] = 0.6
     * weights w = {-, 1, 1, 0.1, 1}. Second anchor:
     *   a = 2: w1 + w2 (anchor) + w3 .2 + w4 .8 = 1 + 1 + 0.02 + 0.8 = 2.82
     *   a = 3: w1 + w2 .9 + w3 (anchor) + w4 .6 = 1 + 0.9 + 0.1 + 0.6 = 2.6
     *   a = 4: w1 + w2 .9 + w3 .1 + w4       = 1 + 0.9 + 0.01 + 1 = 2.91
     * -> anchors {1, 4}, 2.91. Without the weights a = 3 would score
     * 1 + .9 + 1 + .6 = 3.5 and win over a = 4 (1 + .9 + .1 + 1 = 3.0). */
    double sim[25] = {0};
    sim[1 * 5 + 2] = 0.9, sim[1 * 5 + 3] = 0.1, sim[1 * 5 + 4] = 0.1;
    sim[2 * 5 + 3] = 0.2, sim[2 * 5 + 4] = 0.8, sim[3 * 5 + 4] = 0.6;
    double w[5] = {1, 1, 1, 0.1, 1};
    int anchors[2];
    double best = sfi_policy_kascade_dp(sim, w, 5, 2, anchors);
    ck_assert_int_eq(anchors[0], 1);
    ck_assert_int_eq(anchors[1], 4);
    ck_assert_double_eq_tol(best, 2.91, 1e-9);
    best = sfi_policy_kascade_dp(sim, NULL, 5, 2, anchors);
    ck_assert_int_eq(anchors[1], 3);
    ck_assert_double_eq_tol(best, 3.5, 1e-9);
}
END_TEST

/* A Kascade calibration for 3 layers x 2 heads: layer 2 reuses anchor 1
 * with its heads swapped. */
static void kascade_calib(sfi_policy_calib *cal, double *sim, int *head, double *w)
{
    memset(cal, 0, sizeof *cal);
    cal->n_layers = 3;
    cal->n_kv_heads = 2;
    cal->has_kascade = 1;
    cal->kascade_k = 64;
    for (int i = 0; i < 9; i++)
        sim[i] = 0.5;
    for (int i = 0; i < 18; i++)
        head[i] = i % 2;
    head[(1 * 3 + 2) * 2 + 0] = 1;
    head[(1 * 3 + 2) * 2 + 1] = 0;
    for (int i = 0; i < 3; i++)
        w[i] = 1.0;
    cal->sim = sim;
    cal->head = head;
    cal->weight = w;
}

START_TEST(kascade_reuses_the_mapped_anchor_head)
{
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    c.kascade_anchors = 1;
    double sim[9], w[3];
    int head[18];
    sfi_policy_calib cal;
    kascade_calib(&cal, sim, head, w);
    /* Real path, layers in order within one object: layer 0 dense, layer
     * 1 exact top-2 per head, layer 2 head h takes layer 1's head 1 - h. */
    sfi_policy *p = mk_shape(SFI_POLICY_KASCADE, &c, 3, 2, 1, 2, 20, &cal);
    int an[4];
    ck_assert_int_eq(sfi_policy_kascade_anchor_list(p, an, 4), 1);
    ck_assert_int_eq(an[0], 1);
    double a0[8] = {1, 9, 8, 1, 1, 1, 1, 1}, a1[8] = {1, 1, 1, 1, 1, 7, 1, 6};
    float k[8 * 2 * 2], q[4] = {1.41421356f, 0, 1.41421356f, 0};
    for (int j = 0; j < 8; j++) {
        k[(j * 2 + 0) * 2] = (float)log(a0[j]), k[(j * 2 + 0) * 2 + 1] = 0;
        k[(j * 2 + 1) * 2] = (float)log(a1[j]), k[(j * 2 + 1) * 2 + 1] = 0;
    }
    sfi_policy_set s[2];
    run_qk(p, 0, 0, 8, 2, q, k, s);
    ck_assert(s[0].dense && s[1].dense);
    run_qk(p, 1, 0, 8, 2, q, k, s);
    ck_assert(sfi_policy_set_contains(&s[0], 1) && sfi_policy_set_contains(&s[0], 2));
    ck_assert(sfi_policy_set_contains(&s[1], 5) && sfi_policy_set_contains(&s[1], 7));
    /* Layer 2's own attention is irrelevant: uniform keys. */
    float k2[8 * 2 * 2] = {0};
    run_qk(p, 2, 0, 8, 2, q, k2, s);
    ck_assert_int_eq(count_members(&s[0]), 2);
    ck_assert(sfi_policy_set_contains(&s[0], 5) && sfi_policy_set_contains(&s[0], 7));
    ck_assert(sfi_policy_set_contains(&s[1], 1) && sfi_policy_set_contains(&s[1], 2));
    sfi_policy_free(p);
    /* Without a calibration Kascade refuses (no silent self-calibration). */
    sfi_policy *p2 = NULL;
    sfi_error e;
    sfi_policy_shape sh = {3, 2, 2, 2};
    ck_assert_int_eq(sfi_policy_create(SFI_POLICY_KASCADE, &c, &sh, 20, NULL, &p2, &e),
                     SFI_EINVAL);
    ck_assert_ptr_null(p2);
}
END_TEST

START_TEST(kascade_calibrator_similarity_and_head_map)
{
    /* 3 layers x 2 KV heads (1 query head each), head_dim 2, k = 2, one
     * prompt of 6 tokens. Layer 1 equals layer 0 with the heads swapped,
     * layer 2 attends elsewhere. */
    sfi_policy_calibrator *cb;
    sfi_error e;
    ck_assert_int_eq(sfi_policy_calibrator_create(2, 1, 1, 3, 2, 2, 2, 16, &cb, &e), SFI_OK);
    sfi_policy_calibrator_begin(cb);
    double h0[6] = {1, 9, 8, 1, 1, 1}, h1[6] = {1, 1, 1, 1, 7, 6}, h2[6] = {9, 1, 1, 8, 1, 1};
    float kl[3][6 * 4];
    for (int j = 0; j < 6; j++) {
        const double *A[3][2] = {{h0, h1}, {h1, h0}, {h2, h2}};
        for (int l = 0; l < 3; l++)
            for (int h = 0; h < 2; h++) {
                kl[l][(j * 2 + h) * 2] = (float)log(A[l][h][j]);
                kl[l][(j * 2 + h) * 2 + 1] = 0;
            }
    }
    float q[4] = {1.41421356f, 0, 1.41421356f, 0}, hin[4] = {1, 0, 0, 0}, hout[4] = {0, 1, 0, 0};
    for (int n = 1; n <= 6; n++)
        for (int l = 0; l < 3; l++) {
            ck_assert_int_eq(sfi_policy_calibrator_add(cb, l, q, kl[l], n, &e), SFI_OK);
            sfi_policy_calibrator_hidden(cb, l, hin, l == 1 ? hin : hout, 4);
        }
    sfi_policy_calib cal;
    ck_assert_int_eq(sfi_policy_calibrator_finish(cb, "test", &cal, &e), SFI_OK);
    /* (0 -> 1): head 0 of layer 1 is layer 0's head 1: similarity 1. */
    ck_assert_int_eq(cal.head[(0 * 3 + 1) * 2 + 0], 1);
    ck_assert_int_eq(cal.head[(0 * 3 + 1) * 2 + 1], 0);
    ck_assert_double_eq_tol(cal.sim[0 * 3 + 1], 1.0, 1e-6);
    ck_assert(cal.sim[1 * 3 + 2] < 0.5);
    /* Layer importance 1 - cos(in, out): 1 where the output is
     * orthogonal, 0 where it equals the input. */
    ck_assert_double_eq_tol(cal.weight[0], 1.0, 1e-9);
    ck_assert_double_eq_tol(cal.weight[1], 0.0, 1e-9);
    /* JSON round trip. */
    char *js = sfi_policy_calib_to_json(&cal);
    ck_assert_ptr_nonnull(js);
    sfi_policy_calib back;
    ck_assert_int_eq(sfi_policy_calib_from_json(js, "t", &back, &e), SFI_OK);
    ck_assert_int_eq(back.head[(0 * 3 + 1) * 2 + 0], 1);
    ck_assert_double_eq_tol(back.sim[0 * 3 + 1], cal.sim[0 * 3 + 1], 1e-7);
    ck_assert_int_eq(back.n_tip, cal.n_tip);
    free(js);
    sfi_policy_calib_free(&back);
    ck_assert_int_eq(sfi_policy_calib_from_json("{\"format\": 1}", "t", &back, &e), SFI_EFORMAT);
    ck_assert_int_eq(sfi_policy_calib_from_json("[", "t", &back, &e), SFI_EFORMAT);
    sfi_policy_calib_free(&cal);
    sfi_policy_calibrator_free(cb);
}
END_TEST

static float lcg(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f) - 0.5f;
}

START_TEST(fasa_ranks_by_the_dominant_chunks)
{
    /* head_dim 4 = chunks 0 (dims 0, 2) and 1 (dims 1, 3); tip = {1}.
     * q = (1, 1, 0, 0). Keys: k0 = (5, 0, 0, 0) (full 5, chunk-1 score 0),
     * k1 = (0, 2, 0, 0) (2, 2), k2 = (0, 3, 0, 0) (3, 3), k3 = (1, 1, 0,
     * 0) (2, 1). FASA's top-2 by chunk 1: {2, 1}; the full score's top-2
     * would be {0, 2}. */
    float k[16] = {5, 0, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 1, 1, 0, 0};
    float q[4] = {1, 1, 0, 0};
    int tip[1] = {1};
    float sc[4];
    sfi_policy_fasa_scores(q, k, 4, 1, 1, 4, 0, tip, 1, sc);
    ck_assert_float_eq_tol(sc[0], 0.0f, 1e-6f);
    ck_assert_float_eq_tol(sc[2], 3.0f, 1e-6f);
    sfi_policy_calib cal = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .has_fasa = 1,
                            .fasa_k = 2, .n_tip = 1, .tip = tip};
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    sfi_policy *p = mk_shape(SFI_POLICY_FASA, &c, 1, 1, 1, 4, 10, &cal);
    sfi_policy_set s;
    run_qk(p, 0, 0, 4, 2, q, k, &s);
    for (int j = 0; j < 4; j++)
        ck_assert_int_eq(sfi_policy_set_contains(&s, j), j == 1 || j == 2);
    ck_assert_ptr_null(sfi_policy_proxy_note(p));
    /* Without q/K FASA cannot act. */
    int32_t pos[] = {0};
    float prob[] = {0.5f};
    sfi_policy_obs o = mk_obs(4, 1, pos, prob);
    sfi_policy_step st = {.n_ctx = 4, .budget = 2, .obs = &o};
    int avail = 1;
    sfi_error e;
    ck_assert_int_eq(sfi_policy_run(p, 0, &st, &s, &avail, NULL, &e), SFI_OK);
    ck_assert_int_eq(avail, 0);
    sfi_policy_free(p);
}
END_TEST

START_TEST(fasa_calibration_finds_planted_chunks)
{
    /* head_dim 16 = 8 chunks (c, c+8). Chunks 2 and 5 carry large,
     * position-dependent products; the rest small noise. Averaged over
     * 20 tokens, the 2 dominant chunks are found. */
    enum { D = 16, N = 80, TIP = 2 };
    static float k[N * D];
    unsigned seed = 7;
    for (int j = 0; j < N; j++)
        for (int x = 0; x < D; x++) {
            int c = x % 8;
            k[j * D + x] = (c == 2 || c == 5) ? 3.0f * lcg(&seed) : 0.1f * lcg(&seed);
        }
    sfi_policy_calibrator *cb;
    sfi_error e;
    ck_assert_int_eq(sfi_policy_calibrator_create(4, 8, TIP, 1, 1, 1, D, N, &cb, &e), SFI_OK);
    sfi_policy_calibrator_begin(cb);
    for (int n = 1; n <= N; n++) {
        float q[D];
        for (int x = 0; x < D; x++)
            q[x] = 0.05f * lcg(&seed);
        q[2] = q[10] = 1.0f + lcg(&seed);
        q[5] = q[13] = 1.0f + lcg(&seed);
        ck_assert_int_eq(sfi_policy_calibrator_add(cb, 0, q, k, n, &e), SFI_OK);
    }
    sfi_policy_calib cal;
    ck_assert_int_eq(sfi_policy_calibrator_finish(cb, "planted", &cal, &e), SFI_OK);
    ck_assert_int_eq(cal.n_tip, TIP);
    ck_assert_int_eq(cal.tip[0], 2);
    ck_assert_int_eq(cal.tip[1], 5);
    sfi_policy_calib_free(&cal);
    sfi_policy_calibrator_free(cb);
}
END_TEST

START_TEST(sfi_set_is_sink_recent_selected)
{
    /* n_sink 4, n_recent 8, B = 15: the split gives recent min(8, 11 / 2)
     * = 5 and K = 6 selected by the reference Selector at slow steps;
     * T_max 3. Attention: 30 (0.4), 60 (0.3), 45 (0.1), 2 (sink, 0.1). */
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    c.prm.n_recent = 8;
    c.prm.T_max = 3;
    sfi_policy *p = mk(SFI_POLICY_SFI, &c, 1, 200);
    int32_t pos[] = {30, 60, 45, 2};
    float prob[] = {0.4f, 0.3f, 0.1f, 0.1f};
    sfi_policy_set s;
    int kinds[8];
    for (int t = 0; t < 8; t++) {
        sfi_policy_obs o = mk_obs(100 + t, 4, pos, prob);
        sfi_policy_step st = {.step = t, .n_ctx = 100 + t, .budget = 15, .obs = &o,
                              .prev_trigger = t == 5};
        int avail, slow;
        sfi_error e;
        ck_assert_msg(sfi_policy_run(p, 0, &st, &s, &avail, &slow, &e) == SFI_OK, "%s", e.msg);
        kinds[t] = slow;
        if (slow) {
            ck_assert(s.dense);
            continue;
        }
        ck_assert_int_eq(s.size, 15);
        ck_assert_int_eq(count_members(&s), 15);
        for (int j = 0; j < 4; j++)
            ck_assert(sfi_policy_set_contains(&s, j));
        for (int j = 100 + t - 5; j < 100 + t; j++)
            ck_assert(sfi_policy_set_contains(&s, j));
        /* the three heavy positions of J */
        ck_assert(sfi_policy_set_contains(&s, 30) && sfi_policy_set_contains(&s, 60) &&
                  sfi_policy_set_contains(&s, 45));
    }
    /* slow: step 0, T_max at 3, trigger at 5 (x_4 ends a sentence) */
    int want[8] = {1, 0, 0, 1, 0, 1, 0, 0};
    for (int t = 0; t < 8; t++)
        ck_assert_msg(kinds[t] == want[t], "step %d slow %d", t, kinds[t]);
    sfi_policy_free(p);
    /* The interval variant: slow every `interval` steps, triggers ignored. */
    c.interval = 2;
    p = mk(SFI_POLICY_INTERVAL, &c, 1, 200);
    int want_i[6] = {1, 0, 1, 0, 1, 0};
    for (int t = 0; t < 6; t++) {
        sfi_policy_obs o = mk_obs(100 + t, 4, pos, prob);
        sfi_policy_step st = {.step = t, .n_ctx = 100 + t, .budget = 15, .obs = &o,
                              .prev_trigger = 1};
        int avail, slow;
        sfi_error e;
        ck_assert_int_eq(sfi_policy_run(p, 0, &st, &s, &avail, &slow, &e), SFI_OK);
        ck_assert_msg(slow == want_i[t], "interval step %d slow %d", t, slow);
    }
    sfi_policy_free(p);
}
END_TEST

START_TEST(bad_inputs_are_errors)
{
    sfi_policy_config c;
    sfi_policy_config_default(&c);
    sfi_policy *p = NULL;
    sfi_error e;
    sfi_policy_shape bad = {1, 0, 0, 0};
    ck_assert_int_eq(sfi_policy_create(SFI_POLICY_ORACLE, &c, &bad, 10, NULL, &p, &e),
                     SFI_EINVAL);
    ck_assert_ptr_null(p);
    p = mk(SFI_POLICY_ORACLE, &c, 1, 10);
    int32_t pos[] = {0};
    float prob[] = {1.0f};
    sfi_policy_obs o = mk_obs(20, 1, pos, prob);
    sfi_policy_step st = {.n_ctx = 20, .budget = 2, .obs = &o};
    sfi_policy_set s;
    int avail;
    ck_assert_int_eq(sfi_policy_run(p, 0, &st, &s, &avail, NULL, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "context 20"));
    st.n_ctx = 5;
    st.budget = 0;
    ck_assert_int_eq(sfi_policy_run(p, 0, &st, &s, &avail, NULL, &e), SFI_EINVAL);
    st.budget = 2;
    ck_assert_int_eq(sfi_policy_run(p, 3, &st, &s, &avail, NULL, &e), SFI_EINVAL);
    st.obs = NULL;
    ck_assert_int_eq(sfi_policy_run(p, 0, &st, &s, &avail, NULL, &e), SFI_EINVAL);
    sfi_policy_free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("policies");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, names_lists_specs_and_budgets);
    tcase_add_test(tc, recall_counts_entries_and_spreads_tail);
    tcase_add_test(tc, streaming_keeps_exactly_sink_and_recent);
    tcase_add_test(tc, oracle_and_full);
    tcase_add_test(tc, h2o_known_answer_and_no_return);
    tcase_add_test(tc, h2o_heavy_hitters_from_the_prompt);
    tcase_add_test(tc, snapkv_window_and_pooled_ranking);
    tcase_add_test(tc, quest_picks_largest_minmax_bound);
    tcase_add_test(tc, lfps_kurtosis_without_factor_n);
    tcase_add_test(tc, lfps_tables_seeded_from_prompt_queries);
    tcase_add_test(tc, lfps_candidates_expansion_keep_and_update);
    tcase_add_test(tc, lfps_sink_bypass_skips_the_update);
    tcase_add_test(tc, kascade_weighted_dp_on_a_tiny_similarity);
    tcase_add_test(tc, kascade_reuses_the_mapped_anchor_head);
    tcase_add_test(tc, kascade_calibrator_similarity_and_head_map);
    tcase_add_test(tc, fasa_ranks_by_the_dominant_chunks);
    tcase_add_test(tc, fasa_calibration_finds_planted_chunks);
    tcase_add_test(tc, sfi_set_is_sink_recent_selected);
    tcase_add_test(tc, bad_inputs_are_errors);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
