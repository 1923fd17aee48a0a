/* traces/tokenize_corpus: the trace holds the document's tokens exactly
 * (prompt + step tokens decode back to the text), step kinds follow the
 * trigger rule of sfi(7) TRIGGERS, windows and skips work, and a
 * failed run leaves no output. Uses the Qwen3 tokenizer fixture. */
#include <config.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sfi_params.h"
#include "sfi_test_util.h"
#include "sfi_tokenizer.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

static const char *text_a =
    "The quick brown fox jumps over the lazy dog. It was not amused; the dog rarely is!\n"
    "Why would a fox do that? Nobody knows. Foxes are like that, and dogs are like this, "
    "and the story goes on and on without any boundary for quite a long while, long enough "
    "that the T_max rule has to fire at least once because no sentence ends in here at all "
    "and the words just keep coming one after the other like beads on a string that never "
    "ends and never stops and never reaches a period or any other mark that would end it "
    "until finally it does.\nThe end.\n";

static int run_tc(const char *args, char **err)
{
    /* Sized for the worst case of its parts so the command is never cut. */
    char tok[4096];
    char cmd[3 * 4096 + 16384 + 64];
    snprintf(tok, sizeof tok, "%s", sfi_test_src("tests/fixtures/qwen3-tokenizer"));
    snprintf(cmd, sizeof cmd, "'%s' --tokenizer '%s' %s", sfi_test_build("traces/tokenize_corpus"),
             tok, args);
    return sfi_test_run(cmd, NULL, err);
}

START_TEST(tokens_and_kinds_match_the_text)
{
    char a[4200], b[4200], out[4200], args[16000];
    snprintf(a, sizeof a, "%s/a.txt", sfi_test_dir);
    snprintf(b, sizeof b, "%s/b.txt", sfi_test_dir);
    snprintf(out, sizeof out, "%s/o.db", sfi_test_dir);
    ck_assert_int_eq(sfi_test_write_file(a, text_a, strlen(text_a)), 0);
    ck_assert_int_eq(sfi_test_write_file(b, "Too short.", 10), 0);
    snprintf(args, sizeof args, "--out '%s' --prompt 12 --param T_max=16 '%s' '%s'", out, a, b);
    char *err;
    ck_assert_int_eq(run_tc(args, &err), 0);
    ck_assert_msg(strstr(err, "skipped"), "%s", err);
    free(err);

    sfi_tokenizer *tok;
    sfi_error e;
    ck_assert_int_eq(sfi_tokenizer_load(sfi_test_src("tests/fixtures/qwen3-tokenizer"), &tok, &e),
                     SFI_OK);
    sfi_trace *t;
    ck_assert_msg(sfi_trace_open(out, &t, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(sfi_trace_check(t, &e), SFI_OK);
    ck_assert_int_eq(sfi_trace_n_requests(t), 1);
    ck_assert_int_eq(sfi_trace_complete(t), 1);
    ck_assert_str_eq(sfi_trace_get_meta(t)->policy, "sfi");
    ck_assert_ptr_nonnull(strstr(sfi_trace_get_meta(t)->tokenizer, "sha256:"));
    sfi_trace_request rq;
    sfi_trace_steps s;
    ck_assert_int_eq(sfi_trace_read_request(t, 0, &rq, &e), SFI_OK);
    ck_assert_int_eq(sfi_trace_read_steps(t, 0, &s, &e), SFI_OK);
    ck_assert_int_eq(rq.n_prompt, 12);
    int32_t *all = malloc((size_t)(rq.n_prompt + s.n) * 4);
    memcpy(all, rq.prompt, (size_t)rq.n_prompt * 4);
    memcpy(all + rq.n_prompt, s.token, (size_t)s.n * 4);
    char *dec;
    size_t dlen;
    ck_assert_int_eq(sfi_tokenizer_decode(tok, all, (size_t)(rq.n_prompt + s.n), &dec, &dlen, &e),
                     SFI_OK);
    ck_assert_uint_eq(dlen, strlen(text_a));
    ck_assert_int_eq(memcmp(dec, text_a, dlen), 0);
    free(dec);

    /* The trigger rule, recomputed from the vocabulary. */
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_trigger_set ts;
    ck_assert_int_eq(sfi_trigger_set_build(sfi_tokenizer_vocab(tok), prm.trigger_chars, &ts, &e),
                     SFI_OK);
    int since = 0, n_trig = 0, n_tmax = 0;
    for (int64_t i = 0; i < s.n; i++) {
        int32_t prev = all[rq.n_prompt - 1 + i];
        int slow, reason;
        if (i == 0) {
            slow = 1;
            reason = SFI_REASON_FIRST;
        } else if (prev < ts.n_vocab && ts.is_trigger[prev]) {
            slow = 1;
            reason = SFI_REASON_TRIGGER;
        } else if (since + 1 >= 16) {
            slow = 1;
            reason = SFI_REASON_TMAX;
        } else {
            slow = 0;
            reason = SFI_REASON_NONE;
        }
        since = slow ? 0 : since + 1;
        n_trig += reason == SFI_REASON_TRIGGER;
        n_tmax += reason == SFI_REASON_TMAX;
        ck_assert_int_eq(s.kind[i], slow ? SFI_STEP_SLOW : SFI_STEP_FAST);
        ck_assert_int_eq(s.reason[i], reason);
        ck_assert_int_eq(s.ctx_len[i], 12 + i);
    }
    ck_assert_int_ge(n_trig, 4);
    ck_assert_int_ge(n_tmax, 1);
    free(all);
    sfi_trigger_set_free(&ts);
    sfi_trace_steps_free(&s);
    sfi_trace_request_free(&rq);
    sfi_trace_close(t);
    sfi_tokenizer_free(tok);
}
END_TEST

START_TEST(windows_and_failures)
{
    char a[4200], out[4200], args[16000];
    snprintf(a, sizeof a, "%s/a.txt", sfi_test_dir);
    snprintf(out, sizeof out, "%s/w.db", sfi_test_dir);
    ck_assert_int_eq(sfi_test_write_file(a, text_a, strlen(text_a)), 0);
    snprintf(args, sizeof args,
             "--out '%s' --prompt 10 --steps 10 --windows --policy tmax '%s' '%s'", out, a, a);
    ck_assert_int_eq(run_tc(args, NULL), 0);
    sfi_trace *t;
    sfi_error e;
    ck_assert_msg(sfi_trace_open(out, &t, &e) == SFI_OK, "%s", e.msg);
    int64_t nreq = sfi_trace_n_requests(t);
    ck_assert_int_ge(nreq, 8);
    ck_assert_int_eq(nreq % 2, 0);
    ck_assert_int_eq(sfi_trace_n_steps(t), nreq * 10);
    ck_assert_str_eq(sfi_trace_get_meta(t)->policy, "tmax");
    sfi_trace_close(t);

    /* Nothing long enough, a missing file, a bad option: exit non-zero,
     * and no output (nor temporary) is left behind. */
    char out2[4200];
    snprintf(out2, sizeof out2, "%s/none.db", sfi_test_dir);
    char *err;
    snprintf(args, sizeof args, "--out '%s' --prompt 100000 '%s'", out2, a);
    ck_assert_int_eq(run_tc(args, &err), 1);
    ck_assert_msg(strstr(err, "no document"), "%s", err);
    free(err);
    snprintf(args, sizeof args, "--out '%s' '%s/missing.txt'", out2, sfi_test_dir);
    ck_assert_int_eq(run_tc(args, &err), 1);
    ck_assert_msg(strstr(err, "missing.txt"), "%s", err);
    free(err);
    snprintf(args, sizeof args, "--out '%s' --param K=zero '%s'", out2, a);
    ck_assert_int_eq(run_tc(args, NULL), 2);
    snprintf(args, sizeof args, "--out '%s' --windows '%s'", out2, a);
    ck_assert_int_eq(run_tc(args, NULL), 2);
    /* --out on a file that is not an sfi trace (here the input text):
     * refused before any work, the file unchanged (issue 20.3's rule). */
    snprintf(args, sizeof args, "--out '%s' --prompt 10 '%s'", a, a);
    ck_assert_int_eq(run_tc(args, &err), 1);
    ck_assert_msg(strstr(err, "a.txt: exists and is not an sfi trace; not replacing it"), "%s",
                  err);
    free(err);
    char *back = sfi_test_read_file(a, NULL);
    ck_assert_str_eq(back, text_a);
    free(back);
    /* An existing trace (the one just written) is replaced. */
    snprintf(args, sizeof args, "--out '%s' --prompt 10 --steps 10 --windows '%s'", out, a);
    ck_assert_int_eq(run_tc(args, NULL), 0);
    char cmd[8400], *lsout;
    snprintf(cmd, sizeof cmd, "ls '%s'", sfi_test_dir);
    ck_assert_int_eq(sfi_test_run(cmd, &lsout, NULL), 0);
    ck_assert_msg(!strstr(lsout, "none.db"), "left: %s", lsout);
    free(lsout);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace_corpus");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, sfi_test_dir_setup, sfi_test_dir_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, tokens_and_kinds_match_the_text);
    tcase_add_test(tc, windows_and_failures);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
