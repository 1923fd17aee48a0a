/* Comparison policies on small hand-made steps whose right answer is known
 * (sfi(7) PEER METHODS). */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_policies.h"

/* One head's obs from parallel arrays (positions sorted by probability by
 * the caller). */
static sfi_peer_obs mk_obs(int n_ctx, int n, const int32_t *pos, const float *prob)
{
    sfi_peer_obs o = {n_ctx, n, pos, prob, 0.0f};
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += prob[i];
    o.tail = s < 1.0f ? 1.0f - s : 0.0f;
    return o;
}

static sfi_peer *mk(sfi_peer_kind k, const sfi_peer_config *c, int H, int max_ctx)
{
    sfi_peer *p = NULL;
    sfi_error e;
    ck_assert_msg(sfi_peer_create(k, c, 0, 1, H, 0, 0, max_ctx, NULL, &p, &e) == SFI_OK, "%s",
                  e.msg);
    return p;
}

static void run1(sfi_peer *p, int step, int n_ctx, int B, const sfi_peer_obs *obs,
                 sfi_peer_set *sets)
{
    sfi_peer_step st = {.step = step, .n_ctx = n_ctx, .budget = B, .obs = obs};
    int avail = 0;
    sfi_error e;
    ck_assert_msg(sfi_peer_step_run(p, &st, sets, &avail, NULL, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(avail, 1);
}

static int count_members(const sfi_peer_set *s)
{
    int n = 0;
    for (int j = 0; j < s->n_ctx; j++)
        n += sfi_peer_set_contains(s, j);
    return n;
}

START_TEST(names_and_lists)
{
    unsigned m = 0;
    sfi_error e;
    ck_assert_int_eq(sfi_peer_set_parse_list("oracle,sfi,h2o", &m, &e), SFI_OK);
    ck_assert_uint_eq(m, (1u << SFI_PEER_ORACLE) | (1u << SFI_PEER_SFI) | (1u << SFI_PEER_H2O));
    ck_assert_int_eq(sfi_peer_set_parse_list("all", &m, &e), SFI_OK);
    ck_assert_uint_eq(m, (1u << SFI_PEER_N_KINDS) - 1);
    ck_assert_int_eq(sfi_peer_set_parse_list("oracle,bogus", &m, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "'bogus'"));
    ck_assert_int_eq(sfi_peer_set_parse_list("", &m, &e), SFI_EINVAL);
    for (int k = 0; k < SFI_PEER_N_KINDS; k++) {
        sfi_peer_kind kk;
        ck_assert_int_eq(sfi_peer_kind_parse(sfi_peer_kind_name((sfi_peer_kind)k), &kk, &e), 0);
        ck_assert_int_eq(kk, k);
    }
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    ck_assert_int_eq(sfi_peer_config_set(&c, "quest_page=32", &e), SFI_OK);
    ck_assert_int_eq(c.quest_page, 32);
    ck_assert_int_eq(sfi_peer_config_set(&c, "lfps_r=2", &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_peer_config_set(&c, "nope", &e), SFI_EINVAL);
}
END_TEST

START_TEST(recall_counts_entries_and_spreads_tail)
{
    /* 10 positions; entries 3 (0.5) and 7 (0.3), tail 0.2 over 8 others. */
    int32_t pos[] = {3, 7};
    float prob[] = {0.5f, 0.3f};
    sfi_peer_obs o = mk_obs(10, 2, pos, prob);
    sfi_peer_set s = {.n_ctx = 10, .sink_end = 2, .recent_begin = 7, .size = 5};
    /* members {0,1,7,8,9}: entry 7 inside, 4 non-entries -> 0.3 + 0.2*4/8 */
    double lo;
    int n_in, n_top;
    double r = sfi_peer_set_recall(&s, &o, 1, &lo, &n_in, &n_top);
    ck_assert_double_eq_tol(r, 0.4, 1e-6);
    ck_assert_double_eq_tol(lo, 0.3, 1e-6);
    ck_assert_int_eq(n_in, 1);
    ck_assert_int_eq(n_top, 0); /* the top-1 (position 3) is outside */
    sfi_peer_set d = {.n_ctx = 10, .dense = 1, .recent_begin = 10, .size = 10};
    ck_assert_double_eq_tol(sfi_peer_set_recall(&d, &o, 2, NULL, NULL, &n_top), 1.0, 1e-6);
    ck_assert_int_eq(n_top, 2);
}
END_TEST

START_TEST(streaming_keeps_exactly_sink_and_recent)
{
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    sfi_peer *p = mk(SFI_PEER_STREAMING, &c, 2, 200);
    int32_t pos[] = {50};
    float prob[] = {0.9f};
    sfi_peer_obs o[2] = {mk_obs(100, 1, pos, prob), mk_obs(100, 1, pos, prob)};
    sfi_peer_set s[2];
    run1(p, 0, 100, 20, o, s);
    for (int h = 0; h < 2; h++) {
        ck_assert_int_eq(s[h].size, 20);
        ck_assert_int_eq(count_members(&s[h]), 20);
        for (int j = 0; j < 100; j++)
            ck_assert_int_eq(sfi_peer_set_contains(&s[h], j), j < 4 || j >= 84);
    }
    sfi_peer_free(p);
}
END_TEST

START_TEST(oracle_and_full)
{
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    sfi_peer *p = mk(SFI_PEER_ORACLE, &c, 1, 100);
    int32_t pos[] = {9, 2, 40, 33};
    float prob[] = {0.4f, 0.3f, 0.2f, 0.05f};
    sfi_peer_obs o = mk_obs(50, 4, pos, prob);
    sfi_peer_set s;
    run1(p, 0, 50, 3, &o, &s);
    ck_assert_int_eq(s.size, 3);
    ck_assert_int_eq(count_members(&s), 3);
    ck_assert(sfi_peer_set_contains(&s, 9) && sfi_peer_set_contains(&s, 2) &&
              sfi_peer_set_contains(&s, 40) && !sfi_peer_set_contains(&s, 33));
    /* Budget past the entries: all entries plus 2 unnamed positions. */
    run1(p, 1, 50, 6, &o, &s);
    ck_assert_int_eq(s.size, 6);
    ck_assert_int_eq(s.n_virtual, 2);
    ck_assert_int_eq(count_members(&s), 4);
    sfi_peer_free(p);
    p = mk(SFI_PEER_FULL, &c, 1, 100);
    run1(p, 0, 50, 3, &o, &s);
    ck_assert(s.dense);
    ck_assert_int_eq(count_members(&s), 50);
    sfi_peer_free(p);
}
END_TEST

START_TEST(h2o_known_answer_and_no_return)
{
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    sfi_peer *p = mk(SFI_PEER_H2O, &c, 1, 100);
    sfi_peer_set s;
    /* B = 6: recent 3, heavy 3. Step 0 over 10 positions: heavy keeps the
     * three scored positions 1, 4, 6 of candidates 0..6. */
    int32_t p0[] = {1, 4, 6};
    float q0[] = {0.5f, 0.3f, 0.1f};
    sfi_peer_obs o = mk_obs(10, 3, p0, q0);
    run1(p, 0, 10, 6, &o, &s);
    ck_assert_int_eq(s.size, 6);
    for (int j = 0; j < 10; j++)
        ck_assert_int_eq(sfi_peer_set_contains(&s, j), j == 1 || j == 4 || j >= 6);
    /* Step 1: position 7 leaves the recent window with no mass and is the
     * lowest, so it is evicted; 2 (evicted at step 0) stays out. */
    int32_t p1[] = {2, 7, 1};
    float q1[] = {0.6f, 0.3f, 0.1f};
    o = mk_obs(11, 3, p1, q1);
    run1(p, 1, 11, 6, &o, &s);
    for (int j = 0; j < 11; j++)
        ck_assert_int_eq(sfi_peer_set_contains(&s, j), j == 1 || j == 4 || j == 6 || j >= 8);
    /* Step 2: 8 leaves the window with the step-1 mass it got (none here
     * either, since the recorded entries were 2, 7, 1): position 6 has
     * 0.1 + 0.1/R0 > 0, so 8 goes. */
    o = mk_obs(12, 3, p1, q1);
    run1(p, 2, 12, 6, &o, &s);
    ck_assert(!sfi_peer_set_contains(&s, 2) && !sfi_peer_set_contains(&s, 7));
    ck_assert(sfi_peer_set_contains(&s, 6) && sfi_peer_set_contains(&s, 1));
    ck_assert_int_eq(count_members(&s), 6);
    sfi_peer_free(p);
}
END_TEST

START_TEST(snapkv_fixed_pooled_ranking)
{
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    c.prm.n_recent = 8;
    sfi_peer *p = mk(SFI_PEER_SNAPKV, &c, 1, 200);
    sfi_peer_set s;
    int32_t p0[] = {50, 20, 90};
    float q0[] = {0.4f, 0.3f, 0.2f};
    sfi_peer_obs o = mk_obs(100, 3, p0, q0);
    /* B = 13: recent 8 + 5 from the ranking; the pooled window of 50
     * (47..53) ties, later positions first: 49..53. */
    run1(p, 0, 100, 13, &o, &s);
    ck_assert_int_eq(s.size, 13);
    for (int j = 0; j < 100; j++)
        ck_assert_int_eq(sfi_peer_set_contains(&s, j), (j >= 49 && j <= 53) || j >= 92);
    /* Later steps never refresh: new attention at 20 does not matter. */
    int32_t p1[] = {20};
    float q1[] = {0.9f};
    o = mk_obs(101, 1, p1, q1);
    run1(p, 1, 101, 20, &o, &s);
    /* 12 from the ranking now: 47..53 then 23..19 (pooled 0.3, later
     * first); recent 93..100. */
    ck_assert_int_eq(s.size, 20);
    for (int j = 0; j < 101; j++)
        ck_assert_int_eq(sfi_peer_set_contains(&s, j),
                         (j >= 47 && j <= 53) || (j >= 19 && j <= 23) || j >= 93);
    sfi_peer_free(p);
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
    sfi_peer_quest_scores(q, k, 12, 1, 1, 2, 0, 4, sc);
    ck_assert_float_eq_tol(sc[0], 0.0f, 1e-6f);
    ck_assert_float_eq_tol(sc[1], 2.0f, 1e-6f);
    ck_assert_float_eq_tol(sc[2], 1.5f, 1e-6f);
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    c.quest_page = 4;
    sfi_peer *p = NULL;
    sfi_error e;
    ck_assert_int_eq(sfi_peer_create(SFI_PEER_QUEST, &c, 0, 1, 1, 1, 2, 100, NULL, &p, &e), 0);
    int32_t pos[] = {8};
    float prob[] = {0.9f};
    sfi_peer_obs o = mk_obs(12, 1, pos, prob);
    sfi_peer_step st = {.n_ctx = 12, .budget = 4, .obs = &o, .q = q, .k = k};
    sfi_peer_set s;
    int avail;
    ck_assert_int_eq(sfi_peer_step_run(p, &st, &s, &avail, NULL, &e), 0);
    ck_assert_int_eq(s.size, 4);
    for (int j = 0; j < 12; j++)
        ck_assert_int_eq(sfi_peer_set_contains(&s, j), j >= 4 && j < 8);
    /* Without snapshots the recorded probabilities bound the pages: 8's
     * page wins. */
    st.q = st.k = NULL;
    ck_assert_int_eq(sfi_peer_step_run(p, &st, &s, &avail, NULL, &e), 0);
    for (int j = 0; j < 12; j++)
        ck_assert_int_eq(sfi_peer_set_contains(&s, j), j >= 8);
    sfi_peer_free(p);
}
END_TEST

START_TEST(lfps_tables_after_scripted_sequence)
{
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    sfi_peer *p = mk(SFI_PEER_LFPS, &c, 1, 100);
    sfi_peer_set s;
    int32_t p0[] = {2, 5, 9};
    float q0[] = {0.5f, 0.3f, 0.2f};
    sfi_peer_obs o = mk_obs(10, 3, p0, q0);
    run1(p, 0, 10, 100, &o, &s);
    /* Step 0 initializes: w - 1/(2|C|) with C the 3 entries. */
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 0, 2), 0.5 - 1.0 / 6, 1e-6);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 0, 9), 0.2 - 1.0 / 6, 1e-6);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 1, 7), 0.5 - 1.0 / 6, 1e-6);
    /* Step 1 (11 positions): candidates 1..10 from both tables (values
     * above a*mean/kurtosis, expanded by -1,+1,+2 where above the mean);
     * all of the attention on 3. Expected values computed by hand from
     * sfi(7)'s updates (decay 0.95, base 1/20). */
    int32_t p1[] = {3};
    float q1[] = {1.0f};
    o = mk_obs(11, 1, p1, q1);
    run1(p, 1, 11, 100, &o, &s);
    ck_assert_int_eq(s.size, 10);
    for (int j = 0; j < 11; j++)
        ck_assert_int_eq(sfi_peer_set_contains(&s, j), j >= 1);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 0, 3), 0.95, 1e-6);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 0, 2), 0.266667, 1e-6);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 0, 9), -0.018333, 1e-6);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 0, 1), -0.05, 1e-6);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 0, 0), 0.0, 1e-12);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 1, 7), 1.266667, 1e-6);
    ck_assert_double_eq_tol(sfi_peer_lfps_table(p, 0, 1, 4), 0.076667, 1e-6);
    /* Budget 2 keeps the exact top-2 inside the candidates: 3 has the mass,
     * then the latest candidate. */
    int32_t p2[] = {4, 3};
    float q2[] = {0.7f, 0.2f};
    o = mk_obs(12, 2, p2, q2);
    run1(p, 2, 12, 2, &o, &s);
    ck_assert_int_eq(s.size, 2);
    ck_assert(sfi_peer_set_contains(&s, 4) && sfi_peer_set_contains(&s, 3));
    ck_assert(!s.mean_v);
    sfi_peer_free(p);
}
END_TEST

START_TEST(lfps_sink_heads_return_mean_v)
{
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    sfi_peer *p = mk(SFI_PEER_LFPS, &c, 1, 100);
    sfi_peer_set s;
    int32_t p0[] = {0, 30};
    float q0[] = {0.9f, 0.1f};
    sfi_peer_obs o = mk_obs(40, 2, p0, q0);
    run1(p, 0, 40, 100, &o, &s);
    ck_assert(s.mean_v);
    sfi_peer_free(p);
}
END_TEST

START_TEST(kascade_dp_picks_best_anchors)
{
    /* 6 layers in pairs {0,1} {2,3} {4,5}: a layer predicts its pair
     * partner well (0.9) and any other layer badly (0.2). */
    double sim[36];
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            sim[a * 6 + b] = (a / 2 == b / 2) ? 0.9 : 0.2;
    int anchors[3];
    double best = sfi_peer_kascade_dp(sim, 6, 3, anchors);
    ck_assert_int_eq(anchors[0], 0);
    ck_assert_int_eq(anchors[1], 2);
    ck_assert_int_eq(anchors[2], 4);
    ck_assert_double_eq_tol(best, 3 * 1.9, 1e-9);
    /* One anchor: layer 0 serves all. */
    best = sfi_peer_kascade_dp(sim, 6, 1, anchors);
    ck_assert_int_eq(anchors[0], 0);
    ck_assert_double_eq_tol(best, 1.0 + 0.9 + 4 * 0.2, 1e-9);
}
END_TEST

START_TEST(kascade_plan_maps_heads)
{
    /* 3 layers x 2 heads, 2 calibration steps over 64 positions. Layer 1
     * copies layer 0 with heads swapped; layer 2 is unrelated to both. */
    enum { L = 3, H = 2, S = 2, N = 64 };
    static int32_t pos[S][L][H][4];
    static float prob[S][L][H][4] = {{{{0}}}};
    sfi_peer_obs cal[S * L * H];
    for (int s = 0; s < S; s++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                int src_h = l == 1 ? 1 - h : h;
                int base = l == 2 ? 40 + 4 * h : 8 * src_h + s;
                for (int i = 0; i < 4; i++)
                    pos[s][l][h][i] = base + i, prob[s][l][h][i] = 0.2f - 0.01f * i;
                cal[(s * L + l) * H + h] = mk_obs(N, 4, pos[s][l][h], prob[s][l][h]);
            }
    sfi_peer_kascade_plan plan;
    sfi_error e;
    ck_assert_int_eq(sfi_peer_kascade_plan_build(cal, S, L, H, 4, 2, &plan, &e), SFI_OK);
    /* Two anchors: 0 and 2 (layer 1 is predicted perfectly by 0, layer 2
     * by nothing). */
    ck_assert(plan.is_anchor[0] && !plan.is_anchor[1] && plan.is_anchor[2]);
    ck_assert_int_eq(plan.src_layer[1], 0);
    ck_assert_int_eq(plan.src_head[1 * H + 0], 1);
    ck_assert_int_eq(plan.src_head[1 * H + 1], 0);
    ck_assert_int_eq(plan.src_layer[2], 2);
    sfi_peer_kascade_plan_free(&plan);
}
END_TEST

static float lcg(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f) - 0.5f;
}

START_TEST(fasa_calibration_finds_planted_chunks)
{
    /* head_dim 16 = 8 chunks (c, c+8). Chunks 2 and 5 carry large,
     * position-dependent products; the rest small noise. */
    enum { D = 16, N = 200, TIP = 2 };
    static float k[N * D];
    float q[D];
    unsigned seed = 7;
    for (int x = 0; x < D; x++)
        q[x] = 0.05f * lcg(&seed);
    int planted[2] = {2, 5};
    for (int t = 0; t < 2; t++) {
        q[planted[t]] = 1.0f;
        q[planted[t] + 8] = 1.0f;
    }
    for (int j = 0; j < N; j++)
        for (int x = 0; x < D; x++) {
            int c = x % 8;
            k[j * D + x] = (c == 2 || c == 5) ? 3.0f * lcg(&seed) : 0.1f * lcg(&seed);
        }
    int tip[TIP];
    sfi_error e;
    ck_assert_int_eq(sfi_peer_fasa_calibrate(q, k, N, 1, 1, D, 0, 20, TIP, tip, &e), SFI_OK);
    ck_assert_int_eq(tip[0], 2);
    ck_assert_int_eq(tip[1], 5);
    /* Online: the top tokens by the two chunks. */
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    c.fasa_tip = 2;
    c.fasa_calib_k = 20;
    sfi_peer *p = NULL;
    ck_assert_int_eq(sfi_peer_create(SFI_PEER_FASA, &c, 0, 1, 1, 1, D, N, NULL, &p, &e), 0);
    int32_t pos[] = {0};
    float prob[] = {0.5f};
    sfi_peer_obs o = mk_obs(N, 1, pos, prob);
    sfi_peer_step st = {.n_ctx = N, .budget = 10, .obs = &o};
    sfi_peer_set s;
    int avail = 1;
    ck_assert_int_eq(sfi_peer_step_run(p, &st, &s, &avail, NULL, &e), 0);
    ck_assert_int_eq(avail, 0); /* no snapshot: FASA cannot act */
    st.q = q;
    st.k = k;
    ck_assert_int_eq(sfi_peer_step_run(p, &st, &s, &avail, NULL, &e), 0);
    ck_assert_int_eq(avail, 1);
    ck_assert_int_eq(count_members(&s), 10);
    /* The best token by the full dot product is among them. */
    int best = 0;
    float bv = -1e30f;
    for (int j = 0; j < N; j++) {
        float d = 0;
        for (int x = 0; x < D; x++)
            d += q[x] * k[j * D + x];
        if (d > bv)
            bv = d, best = j;
    }
    ck_assert(sfi_peer_set_contains(&s, best));
    sfi_peer_free(p);
    /* Bad shapes are errors, not crashes. */
    ck_assert_int_eq(sfi_peer_fasa_calibrate(q, k, N, 1, 1, 3, 0, 20, 1, tip, &e), SFI_EINVAL);
}
END_TEST

START_TEST(sfi_set_is_sink_recent_selected)
{
    /* n_sink 4, n_recent 8, B = 15 -> K = 3 selected by the reference
     * Selector at slow steps; T_max 3. Attention: 30 (0.4), 60 (0.3),
     * 45 (0.1), 2 (sink, 0.1). */
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    c.prm.n_recent = 8;
    c.prm.T_max = 3;
    sfi_peer *p = mk(SFI_PEER_SFI, &c, 1, 200);
    int32_t pos[] = {30, 60, 45, 2};
    float prob[] = {0.4f, 0.3f, 0.1f, 0.1f};
    sfi_peer_set s;
    int kinds[8];
    for (int t = 0; t < 8; t++) {
        sfi_peer_obs o = mk_obs(100 + t, 4, pos, prob);
        sfi_peer_step st = {.step = t, .n_ctx = 100 + t, .budget = 15, .obs = &o,
                            .prev_trigger = t == 5};
        int avail, slow;
        sfi_error e;
        ck_assert_msg(sfi_peer_step_run(p, &st, &s, &avail, &slow, &e) == SFI_OK, "%s", e.msg);
        kinds[t] = slow;
        if (slow) {
            ck_assert(s.dense);
            continue;
        }
        ck_assert_int_eq(s.size, 15);
        ck_assert_int_eq(count_members(&s), 15);
        for (int j = 0; j < 4; j++)
            ck_assert(sfi_peer_set_contains(&s, j));
        for (int j = 100 + t - 8; j < 100 + t; j++)
            ck_assert(sfi_peer_set_contains(&s, j));
        /* the three heavy positions of J */
        ck_assert(sfi_peer_set_contains(&s, 30) && sfi_peer_set_contains(&s, 60) &&
                  sfi_peer_set_contains(&s, 45));
    }
    /* slow: step 0, T_max at 3, trigger at 5 (x_4 ends a sentence) */
    int want[8] = {1, 0, 0, 1, 0, 1, 0, 0};
    for (int t = 0; t < 8; t++)
        ck_assert_msg(kinds[t] == want[t], "step %d slow %d", t, kinds[t]);
    sfi_peer_free(p);
}
END_TEST

START_TEST(bad_inputs_are_errors)
{
    sfi_peer_config c;
    sfi_peer_config_default(&c);
    sfi_peer *p = NULL;
    sfi_error e;
    ck_assert_int_eq(sfi_peer_create(SFI_PEER_KASCADE, &c, 0, 2, 1, 0, 0, 10, NULL, &p, &e),
                     SFI_EINVAL);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(sfi_peer_create(SFI_PEER_ORACLE, &c, 0, 1, 0, 0, 0, 10, NULL, &p, &e),
                     SFI_EINVAL);
    p = mk(SFI_PEER_ORACLE, &c, 1, 10);
    int32_t pos[] = {0};
    float prob[] = {1.0f};
    sfi_peer_obs o = mk_obs(20, 1, pos, prob);
    sfi_peer_step st = {.n_ctx = 20, .budget = 2, .obs = &o};
    sfi_peer_set s;
    int avail;
    ck_assert_int_eq(sfi_peer_step_run(p, &st, &s, &avail, NULL, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "context 20"));
    st.n_ctx = 5;
    st.budget = 0;
    ck_assert_int_eq(sfi_peer_step_run(p, &st, &s, &avail, NULL, &e), SFI_EINVAL);
    sfi_peer_free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("policies");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, names_and_lists);
    tcase_add_test(tc, recall_counts_entries_and_spreads_tail);
    tcase_add_test(tc, streaming_keeps_exactly_sink_and_recent);
    tcase_add_test(tc, oracle_and_full);
    tcase_add_test(tc, h2o_known_answer_and_no_return);
    tcase_add_test(tc, snapkv_fixed_pooled_ranking);
    tcase_add_test(tc, quest_picks_largest_minmax_bound);
    tcase_add_test(tc, lfps_tables_after_scripted_sequence);
    tcase_add_test(tc, lfps_sink_heads_return_mean_v);
    tcase_add_test(tc, kascade_dp_picks_best_anchors);
    tcase_add_test(tc, kascade_plan_maps_heads);
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
