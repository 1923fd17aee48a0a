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
            ck_assert_msg(res.ids[t] == greedy[t], "prompt %zu token %d: %d, transformers %d", i,
                          t, (int)res.ids[t], (int)greedy[t]);
        printf("real model prompt %zu (%d tokens): %d greedy tokens identical to transformers\n",
               i, n, ng);
        sfi_decode_result_free(&res);
        free(ids);
        free(greedy);
    }
    sfi_qwen3_free(m);
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
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
