/* The real trained model ../shared/models/sfi-small-qwen3, loaded unchanged:
 * dense greedy tokens equal transformers' (recorded by
 * tests/make_hf_fixtures.py) on every recorded prompt. Skips (77) when
 * $SFI_SHARED has no such model. */
#include <config.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_decode.h"
#include "sfi_hf_fixture.h"
#include "sfi_qwen3.h"
#include "sfi_test_util.h"

static const char *model_dir;

START_TEST(real_model_greedy_matches_transformers)
{
    json_t *r = hf_expected();
    json_t *R = json_object_get(r, "real_model");
    ck_assert_ptr_nonnull(R);
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_msg(sfi_qwen3_load(model_dir, &m, &e) == SFI_OK, "%s", e.msg);
    json_t *ps = json_object_get(R, "prompts");
    ck_assert_uint_ge(json_array_size(ps), 3);
    for (size_t i = 0; i < json_array_size(ps); i++) {
        json_t *P = json_array_get(ps, i);
        int n, ng;
        int32_t *ids = hf_ids(json_object_get(P, "ids"), &n);
        int32_t *greedy = hf_ids(json_object_get(P, "greedy"), &ng);
        sfi_decode_opts o;
        sfi_decode_opts_default(&o);
        o.mode = SFI_DECODE_DENSE;
        o.max_new = ng;
        sfi_decode_result res;
        ck_assert_msg(sfi_decode_run(m, &o, ids, n, NULL, &res, &e) == SFI_OK, "%s", e.msg);
        ck_assert_int_eq(res.n_generated, ng);
        for (int t = 0; t < ng; t++)
            ck_assert_msg(res.ids[t] == greedy[t], "prompt %zu token %d: %d, transformers %d", i, t,
                          (int)res.ids[t], (int)greedy[t]);
        printf("real model prompt %zu (%d tokens): %d greedy tokens identical to transformers\n", i,
               n, ng);
        sfi_decode_result_free(&res);
        free(ids);
        free(greedy);
    }
    sfi_qwen3_free(m);
    json_decref(r);
}
END_TEST

/* End to end from text: sfi-ref run --prompt TEXT encodes with the model's
 * own tokenizer files and must give transformers' greedy tokens. */
START_TEST(real_model_cli_text_prompt)
{
    json_t *r = hf_expected();
    json_t *P = json_array_get(json_object_get(json_object_get(r, "real_model"), "prompts"), 0);
    const char *text = json_string_value(json_object_get(P, "text"));
    int ng;
    int32_t *greedy = hf_ids(json_object_get(P, "greedy"), &ng);
    char *dir = sfi_test_tmpdir();
    char pf[2048], cmd[8192];
    snprintf(pf, sizeof pf, "%s/prompt.txt", dir);
    ck_assert_int_eq(sfi_test_write_file(pf, text, strlen(text)), 0);
    snprintf(cmd, sizeof cmd, "%s run --model %s --prompt-file %s --max-new %d --mode dense --json",
             sfi_test_build("sfi-ref"), model_dir, pf, ng);
    char *out = NULL, *err = NULL;
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_ptr_nonnull(j);
    json_t *g = json_object_get(j, "generated_ids");
    ck_assert_uint_eq(json_array_size(g), (size_t)ng);
    for (int t = 0; t < ng; t++)
        ck_assert_int_eq(json_integer_value(json_array_get(g, (size_t)t)), greedy[t]);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "prompt_tokens")),
                     (json_int_t)json_array_size(json_object_get(P, "ids")));
    ck_assert_ptr_nonnull(json_string_value(json_object_get(j, "text")));
    printf("sfi-ref run --prompt-file: %d greedy tokens identical to transformers\n", ng);
    json_decref(j);
    free(out);
    free(err);
    free(greedy);
    sfi_test_rmtree(dir);
    free(dir);
    json_decref(r);
}
END_TEST

int main(void)
{
    const char *p = sfi_test_shared("models/sfi-small-qwen3/model.safetensors");
    if (!p) {
        printf("SKIP: $SFI_SHARED/models/sfi-small-qwen3 is absent\n");
        return 77;
    }
    static char dir[2048];
    snprintf(dir, sizeof dir, "%s", p);
    *strrchr(dir, '/') = 0;
    model_dir = dir;
    Suite *s = suite_create("qwen3_real");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, real_model_greedy_matches_transformers);
    tcase_add_test(tc, real_model_cli_text_prompt);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
