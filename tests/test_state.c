/* ref/sfi_state: trigger policies on a scripted token stream (sfi(7),
 * TRIGGERS), the candidate set J and the fast-step set (MANAGED STATE), the
 * slow-step update, and bad input. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_state.h"
#include "sfi_test_util.h"


/* Vocabulary of 10 ids; 3 and 7 end a sentence. The stream x_0..x_12; step
 * t sees x_{t-1}. One letter per step: F fast, else the reason's initial
 * (first, Trigger, Max, Interval, Always). */
static const uint8_t trig[10] = {0, 0, 0, 1, 0, 0, 0, 1, 0, 0};
static const int32_t stream[13] = {1, 2, 3, 5, 5, 5, 5, 5, 7, 7, 1, -1, 99};

static void run_policy(sfi_trigger_kind kind, int T_max, int interval, char *out)
{
    sfi_params p = sfi_test_method_defaults();
    p.T_max = T_max;
    sfi_trigger_policy tp;
    sfi_trigger_policy_init(&tp, kind, &p, trig, 10, interval);
    int32_t prev = -5; /* ignored at step 0 */
    for (int t = 0; t < 14; t++) {
        sfi_step_reason why;
        sfi_step_kind k = sfi_trigger_next(&tp, prev, &why);
        static const char letter[] = {'F', 'f', 'T', 'M', 'I', 'A', 'P'};
        ck_assert_int_eq(k, why == SFI_REASON_NONE ? SFI_STEP_FAST : SFI_STEP_SLOW);
        out[t] = letter[why];
        if (t < 13)
            prev = stream[t];
    }
    out[14] = '\0';
}

START_TEST(trigger_policies_on_scripted_stream)
{
    char got[15];
    /* sfi, T_max 4. step: prev -> decision
     *  0: -        first
     *  1: 1  d=1   fast        2: 2  d=2 fast
     *  3: 3        trigger (3 ends a sentence)
     *  4-6: 5      d=1..3 fast
     *  7: 5  d=4   T_max reached: slow
     *  8: 5  d=1   fast
     *  9: 7        trigger    10: 7  trigger again (consecutive boundaries)
     * 11: 1  d=1   fast       12: -1 out of range: not a trigger, d=2 fast
     * 13: 99 out of range, d=3 fast */
    run_policy(SFI_TRIG_SFI, 4, 0, got);
    ck_assert_str_eq(got, "fFFTFFFMFTTFFF");
    /* tmax only: slow at 0, 4, 8, 12. */
    run_policy(SFI_TRIG_TMAX, 4, 0, got);
    ck_assert_str_eq(got, "fFFFMFFFMFFFMF");
    /* boundary only: never T_max. */
    run_policy(SFI_TRIG_BOUNDARY, 4, 0, got);
    ck_assert_str_eq(got, "fFFTFFFFFTTFFF");
    /* interval 3: 0, 3, 6, 9, 12. */
    run_policy(SFI_TRIG_INTERVAL, 4, 3, got);
    ck_assert_str_eq(got, "fFFIFFIFFIFFIF");
    run_policy(SFI_TRIG_ALWAYS, 4, 0, got);
    ck_assert_str_eq(got, "fAAAAAAAAAAAAA");
    run_policy(SFI_TRIG_NEVER, 4, 0, got);
    ck_assert_str_eq(got, "fFFFFFFFFFFFFF");
    /* Default T_max = 64 with the same stream: only first and triggers. */
    run_policy(SFI_TRIG_SFI, 64, 0, got);
    ck_assert_str_eq(got, "fFFTFFFFFTTFFF");
    /* T_max = 1: every step slow (trigger reason wins when both apply). */
    run_policy(SFI_TRIG_SFI, 1, 0, got);
    ck_assert_str_eq(got, "fMMTMMMMMTTMMM");
    /* T_max < 1 disables the rule instead of firing every step. */
    run_policy(SFI_TRIG_TMAX, 0, 0, got);
    ck_assert_str_eq(got, "fFFFFFFFFFFFFF");
}
END_TEST

/* A plugged-in policy: slow every 5th step since the last slow one, or
 * when the previous token is 5 (reasons reused: TMAX / TRIGGER). */
static sfi_step_reason every5(const sfi_trigger_policy *tp, int32_t prev, void *ctx)
{
    int *calls = ctx;
    (*calls)++;
    if (prev == 5)
        return SFI_REASON_TRIGGER;
    return tp->since_slow + 1 >= 5 ? SFI_REASON_TMAX : SFI_REASON_NONE;
}

START_TEST(custom_policy)
{
    int calls = 0;
    sfi_trigger_policy tp;
    sfi_trigger_policy_init_custom(&tp, every5, &calls);
    const int32_t toks[12] = {0, 1, 2, 3, 4, 0, 1, 5, 0, 0, 0, 0};
    char got[13];
    static const char letter[] = {'F', 'f', 'T', 'M', 'I', 'A', 'P'};
    for (int t = 0; t < 12; t++) {
        sfi_step_reason why;
        sfi_trigger_next(&tp, t ? toks[t - 1] : 0, &why);
        got[t] = letter[why];
    }
    got[12] = '\0';
    /* 0 first; 1-4 fast (since_slow+1 = 1..4); 5 slow (d = 5); 6, 7 fast;
     * 8: prev x7 = 5 -> trigger; 9-12 fast. */
    ck_assert_str_eq(got, "fFFFFMFFTFFF");
    ck_assert_int_eq(calls, 11); /* not consulted at step 0 */
    ck_assert_str_eq(sfi_trigger_kind_name(SFI_TRIG_CUSTOM), "custom");
}
END_TEST

START_TEST(trigger_no_table_and_names)
{
    sfi_params p = sfi_test_method_defaults();
    sfi_trigger_policy tp;
    sfi_trigger_policy_init(&tp, SFI_TRIG_SFI, &p, NULL, 0, 0);
    sfi_step_reason why;
    ck_assert_int_eq(sfi_trigger_next(&tp, 3, &why), SFI_STEP_SLOW);
    ck_assert_int_eq(why, SFI_REASON_FIRST);
    ck_assert_int_eq(sfi_trigger_next(&tp, 3, &why), SFI_STEP_FAST);
    ck_assert_int_eq(tp.step, 2);
    ck_assert_int_eq(tp.since_slow, 1);
    sfi_trigger_kind k;
    const char *names[] = {"sfi", "tmax", "boundary", "interval", "always", "never"};
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(sfi_trigger_policy_parse(names[i], &k, NULL), SFI_OK);
        ck_assert_int_eq(k, i);
        ck_assert_str_eq(sfi_trigger_kind_name(k), names[i]);
    }
    sfi_error e;
    ck_assert_int_eq(sfi_trigger_policy_parse("sometimes", &k, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "sometimes"));
    ck_assert_int_eq(sfi_trigger_policy_parse("custom", &k, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "custom"));
    ck_assert_int_eq(sfi_trigger_policy_parse(NULL, &k, &e), SFI_EINVAL);
    ck_assert_str_eq(sfi_step_kind_name(SFI_STEP_SLOW), "slow");
    ck_assert_str_eq(sfi_step_reason_name(SFI_REASON_TMAX), "tmax");
    ck_assert_str_eq(sfi_step_reason_name((sfi_step_reason)99), "unknown");
}
END_TEST

START_TEST(candidates_J)
{
    sfi_params p = sfi_test_method_defaults(); /* sink 4, recent 256 */
    int b, e;
    /* J = [n_sink, n_ctx - n_recent) */
    sfi_state_candidates(&p, 1000, &b, &e);
    ck_assert(b == 4 && e == 744);
    sfi_state_candidates(&p, 261, &b, &e);
    ck_assert(b == 4 && e == 5);
    /* Short contexts: empty, never inverted. */
    sfi_state_candidates(&p, 260, &b, &e);
    ck_assert(b == 4 && e == 4);
    sfi_state_candidates(&p, 100, &b, &e);
    ck_assert(b == 4 && e == 4);
    sfi_state_candidates(&p, 2, &b, &e);
    ck_assert(b == 2 && e == 2);
    sfi_state_candidates(&p, 0, &b, &e);
    ck_assert(b == 0 && e == 0);
}
END_TEST

START_TEST(fast_set)
{
    sfi_params p = sfi_test_method_defaults();
    p.n_sink = 2;
    p.n_recent = 3;
    p.K = 4;
    sfi_state st;
    ck_assert_int_eq(sfi_state_init(&st, 2, 2, 4, NULL), SFI_OK);
    ck_assert_int_eq(st.n_selected[3], 0);
    int32_t *s = sfi_state_selected(&st, 1, 1);
    s[0] = 5;
    s[1] = 9;
    s[2] = 17;
    s[3] = 18;
    st.n_selected[1 * 2 + 1] = 4;
    int32_t idx[16];
    int n;
    /* n_ctx 20: sink {0,1}, recent {17,18,19}; selected 17, 18 fell into
     * the recent window and count once: {0,1,5,9,17,18,19}. */
    sfi_state_fast_set(&st, &p, 1, 1, 20, idx, &n);
    const int32_t want[] = {0, 1, 5, 9, 17, 18, 19};
    ck_assert_int_eq(n, 7);
    ck_assert(memcmp(idx, want, sizeof want) == 0);
    /* Another (layer, head) with nothing selected yet: sink + recent. */
    sfi_state_fast_set(&st, &p, 0, 1, 20, idx, &n);
    const int32_t want2[] = {0, 1, 17, 18, 19};
    ck_assert_int_eq(n, 5);
    ck_assert(memcmp(idx, want2, sizeof want2) == 0);
    /* n_ctx 4: sink {0,1}, recent {2,3} (would start at 1, inside the
     * sink): every position once. */
    sfi_state_fast_set(&st, &p, 0, 1, 4, idx, &n);
    ck_assert_int_eq(n, 4);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(idx[i], i);
    /* n_ctx 1. */
    sfi_state_fast_set(&st, &p, 0, 1, 1, idx, &n);
    ck_assert(n == 1 && idx[0] == 0);
    /* The bound n_sink + K + n_recent holds at n_ctx 100. */
    sfi_state_fast_set(&st, &p, 1, 1, 100, idx, &n);
    ck_assert_int_le(n, 2 + 4 + 3);
    ck_assert_int_eq(n, 9);
    sfi_state_free(&st);
    sfi_state_free(&st); /* idempotent */
}
END_TEST

START_TEST(slow_update_stores_selector_result)
{
    sfi_params p = sfi_test_method_defaults();
    p.K = 3;
    sfi_state st;
    ck_assert_int_eq(sfi_state_init(&st, 3, 2, 8, NULL), SFI_OK);
    /* Two heads, J = [1, 9): head 0 prefers 2, 5, 7; head 1 prefers 1, 3, 8. */
    float logits[2 * 10], norms[2 * 10];
    for (int i = 0; i < 20; i++) {
        logits[i] = 0.0f;
        norms[i] = 1.0f;
    }
    logits[2] = logits[5] = logits[7] = 6.0f;
    logits[10 + 1] = logits[10 + 3] = logits[10 + 8] = 6.0f;
    sfi_selector_input in = {2, 1, 10, 1, 9, logits, norms};
    sfi_error e;
    ck_assert_msg(sfi_state_slow_update(&st, &p, 2, &in, NULL, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(st.n_selected[2 * 2 + 0], 3);
    ck_assert_int_eq(st.n_selected[2 * 2 + 1], 3);
    const int32_t *a = sfi_state_selected(&st, 2, 0), *b = sfi_state_selected(&st, 2, 1);
    ck_assert(a[0] == 2 && a[1] == 5 && a[2] == 7);
    ck_assert(b[0] == 1 && b[1] == 3 && b[2] == 8);
    /* A failed update (NaN logit in J) keeps the previous sets. */
    logits[4] = NAN;
    ck_assert_int_eq(sfi_state_slow_update(&st, &p, 2, &in, NULL, &e), SFI_EINVAL);
    ck_assert(a[0] == 2 && a[1] == 5 && a[2] == 7);
    ck_assert_int_eq(st.n_selected[4], 3);
    logits[4] = 0.0f;
    /* Wrong layer, head count, K beyond capacity. */
    ck_assert_int_eq(sfi_state_slow_update(&st, &p, 3, &in, NULL, &e), SFI_EINVAL);
    in.n_kv_heads = 1;
    ck_assert_int_eq(sfi_state_slow_update(&st, &p, 0, &in, NULL, &e), SFI_EINVAL);
    in.n_kv_heads = 2;
    p.K = 9;
    ck_assert_int_eq(sfi_state_slow_update(&st, &p, 0, &in, NULL, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "capacity"));
    /* Empty J (a short context) is an error, not a crash. */
    p.K = 3;
    in.j_end = in.j_begin;
    ck_assert_int_eq(sfi_state_slow_update(&st, &p, 0, &in, NULL, &e), SFI_EINVAL);
    sfi_state_free(&st);
}
END_TEST

START_TEST(bad_init)
{
    sfi_state st;
    sfi_error e;
    ck_assert_int_eq(sfi_state_init(&st, 1, 1, 0, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "K=0"));
    ck_assert_ptr_null(st.selected);
    sfi_state_free(&st);
    ck_assert_int_eq(sfi_state_init(&st, 0, 1, 4, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_state_init(&st, 1000000, 1000, 1000000, &e), SFI_ERANGE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("state");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, trigger_policies_on_scripted_stream);
    tcase_add_test(tc, trigger_no_table_and_names);
    tcase_add_test(tc, custom_policy);
    tcase_add_test(tc, candidates_J);
    tcase_add_test(tc, fast_set);
    tcase_add_test(tc, slow_update_stores_selector_result);
    tcase_add_test(tc, bad_init);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
