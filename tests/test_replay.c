/* sim/sfi_replay: slow-step counts on hand-made streams, batch offsets,
 * the synthetic stream, bad arguments. */
#include <config.h>

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_replay.h"
#include "sfi_test_util.h"

static const uint8_t trig2[2] = {0, 1};

START_TEST(tmax_only_stream)
{
    /* No trigger tokens: SFI is slow at step 0 and every T_max = 64. */
    int32_t tok[1000] = {0};
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_replay_stream in = {tok, 1000, trig2, 2};
    sfi_replay_result r;
    sfi_error e;
    ck_assert_int_eq(sfi_replay_run(&in, SFI_TRIG_SFI, &prm, 0, 1, 0, 200, 200, &r, &e), SFI_OK);
    ck_assert_int_eq(r.slow, 4); /* steps 0, 64, 128, 192 */
    ck_assert_int_eq(r.hist[1], 4);
    ck_assert_int_eq(r.hist[0], 196);
    ck_assert_int_eq(r.reasons[SFI_REASON_FIRST], 1);
    ck_assert_int_eq(r.reasons[SFI_REASON_TMAX], 3);
    ck_assert_int_eq(r.timeline[0], 1);
    ck_assert_int_eq(r.timeline[1], 0);
    ck_assert_int_eq(r.timeline[64], 1);
    ck_assert_int_eq(r.timeline[63], 0);
    sfi_replay_result_free(&r);
}
END_TEST

START_TEST(boundary_token_triggers_next_step)
{
    /* x_9 is a boundary: step 10 is slow, and T_max restarts there. */
    int32_t tok[1000] = {0};
    tok[9] = 1;
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_replay_stream in = {tok, 1000, trig2, 2};
    sfi_replay_result r;
    sfi_error e;
    ck_assert_int_eq(sfi_replay_run(&in, SFI_TRIG_SFI, &prm, 0, 1, 0, 100, 100, &r, &e), SFI_OK);
    ck_assert_int_eq(r.timeline[10], 1);
    ck_assert_int_eq(r.timeline[64], 0);
    ck_assert_int_eq(r.timeline[74], 1);
    ck_assert_int_eq(r.slow, 3); /* 0, 10, 74 */
    ck_assert_int_eq(r.reasons[SFI_REASON_TRIGGER], 1);
    sfi_replay_result_free(&r);
    /* Boundary-only: never T_max. */
    ck_assert_int_eq(sfi_replay_run(&in, SFI_TRIG_BOUNDARY, &prm, 0, 1, 0, 100, 0, &r, &e), SFI_OK);
    ck_assert_int_eq(r.slow, 2);
    ck_assert_ptr_null(r.timeline);
    sfi_replay_result_free(&r);
    /* Interval 16 over 100 steps: 0, 16, ..., 96. */
    ck_assert_int_eq(sfi_replay_run(&in, SFI_TRIG_INTERVAL, &prm, 16, 1, 0, 100, 0, &r, &e),
                     SFI_OK);
    ck_assert_int_eq(r.slow, 7);
    sfi_replay_result_free(&r);
}
END_TEST

START_TEST(batch_requests_start_at_spread_offsets)
{
    /* One boundary at x_0 of a ring of 100 tokens: request r starts at
     * offset 25 r, so it sees the boundary as its token (100 - 25 r) % 100. */
    int32_t tok[100] = {0};
    tok[0] = 1;
    sfi_params prm;
    sfi_params_default(&prm);
    prm.T_max = 1000;
    sfi_replay_stream in = {tok, 100, trig2, 2};
    sfi_replay_result r;
    sfi_error e;
    ck_assert_int_eq(sfi_replay_run(&in, SFI_TRIG_BOUNDARY, &prm, 0, 4, 0, 60, 60, &r, &e), SFI_OK);
    ck_assert_int_eq(r.timeline[0], 4);  /* all start slow */
    ck_assert_int_eq(r.timeline[1], 1);  /* request 0 produced x_0 = boundary */
    ck_assert_int_eq(r.timeline[26], 1); /* request 3 (offset 75) at token 100 */
    ck_assert_int_eq(r.timeline[51], 1); /* request 2 (offset 50) */
    ck_assert_int_eq(r.slow, 4 + 3);
    ck_assert_int_eq(r.hist[4], 1);
    ck_assert_int_eq(r.hist[1], 3);
    ck_assert_int_eq(r.hist[0], 56);
    int64_t sum = 0;
    for (int n = 0; n <= 4; n++)
        sum += r.hist[n];
    ck_assert_int_eq(sum, 60);
    sfi_replay_result_free(&r);
}
END_TEST

START_TEST(synthetic_stream)
{
    int32_t *a, *b;
    uint8_t *ta, *tb;
    sfi_error e;
    ck_assert_int_eq(sfi_replay_synthetic(65536, 24, 1, &a, &ta, &e), SFI_OK);
    ck_assert_int_eq(sfi_replay_synthetic(65536, 24, 1, &b, &tb, &e), SFI_OK);
    ck_assert(memcmp(a, b, 65536 * sizeof *a) == 0); /* deterministic */
    int n1 = 0;
    for (int i = 0; i < 65536; i++) {
        ck_assert(a[i] == 0 || a[i] == 1);
        n1 += a[i];
    }
    /* 1/24 of 65536 = 2731; binomial sd ~51. */
    ck_assert_int_gt(n1, 2731 - 300);
    ck_assert_int_lt(n1, 2731 + 300);
    ck_assert(ta[0] == 0 && ta[1] == 1);
    free(a);
    free(b);
    free(ta);
    free(tb);
    ck_assert_int_ne(sfi_replay_synthetic(0, 24, 1, &a, &ta, &e), SFI_OK);
    ck_assert_int_ne(sfi_replay_synthetic(10, 0.5, 1, &a, &ta, &e), SFI_OK);
}
END_TEST

START_TEST(bad_arguments)
{
    int32_t tok[4] = {0};
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_replay_stream in = {tok, 4, trig2, 2}, empty = {tok, 0, trig2, 2};
    sfi_replay_result r;
    sfi_error e;
    ck_assert_int_ne(sfi_replay_run(&empty, SFI_TRIG_SFI, &prm, 0, 1, 0, 10, 0, &r, &e), SFI_OK);
    ck_assert_int_ne(sfi_replay_run(&in, SFI_TRIG_SFI, &prm, 0, 0, 0, 10, 0, &r, &e), SFI_OK);
    ck_assert_ptr_nonnull(strstr(e.msg, "batch 0"));
    ck_assert_int_ne(sfi_replay_run(&in, SFI_TRIG_SFI, &prm, 0, 1, 0, 0, 0, &r, &e), SFI_OK);
    /* Tokens outside the trigger table are simply not triggers. */
    int32_t odd[3] = {5, -1, 1};
    sfi_replay_stream o = {odd, 3, trig2, 2};
    ck_assert_int_eq(sfi_replay_run(&o, SFI_TRIG_BOUNDARY, &prm, 0, 1, 0, 4, 4, &r, &e), SFI_OK);
    ck_assert_int_eq(r.slow, 2); /* step 0 and the step after token 1 */
    sfi_replay_result_free(&r);
}
END_TEST

START_TEST(stagger_spreads_tmax_phases)
{
    /* No boundaries, T_max 64, 4 requests staggered by 64 steps: they have
     * decoded 0, 16, 32, 48 steps, so T_max slow steps never coincide
     * (after request 0's step 0). */
    int32_t tok[1000] = {0};
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_replay_stream in = {tok, 1000, trig2, 2};
    sfi_replay_result r;
    sfi_error e;
    ck_assert_int_eq(sfi_replay_run(&in, SFI_TRIG_TMAX, &prm, 0, 4, 64, 640, 640, &r, &e), SFI_OK);
    ck_assert_int_eq(r.hist[2] + r.hist[3] + r.hist[4], 0);
    ck_assert_int_eq(r.slow, 40); /* 10 periods x 4 requests */
    ck_assert_int_eq(r.reasons[SFI_REASON_FIRST], 1);
    ck_assert_int_eq(r.timeline[16], 1); /* request 3: 48 + 16 = 64 */
    sfi_replay_result_free(&r);
    /* Without stagger they all spike together. */
    ck_assert_int_eq(sfi_replay_run(&in, SFI_TRIG_TMAX, &prm, 0, 4, 0, 640, 0, &r, &e), SFI_OK);
    ck_assert_int_eq(r.hist[4], 10);
    sfi_replay_result_free(&r);
    ck_assert_int_ne(sfi_replay_run(&in, SFI_TRIG_TMAX, &prm, 0, 4, -1, 640, 0, &r, &e), SFI_OK);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, tmax_only_stream);
    tcase_add_test(tc, boundary_token_triggers_next_step);
    tcase_add_test(tc, batch_requests_start_at_spread_offsets);
    tcase_add_test(tc, synthetic_stream);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, stagger_spreads_tmax_phases);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
