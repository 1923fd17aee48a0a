/* The OpenBLAS backend against transformers and against the scalar
 * backend: not bit-exact; stated tolerance 1e-4 * max|logit| per position
 * (the same bound as the scalar backend's conformance) and identical greedy
 * tokens. Skips (77) in builds without OpenBLAS. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_hf_fixture.h"
#include "sfi_decode.h"
#include "sfi_qwen3.h"
#include "sfi_test_util.h"

START_TEST(blas_close_to_scalar)
{
    json_t *r = hf_expected();
    json_t *models = json_object_get(r, "models");
    double worst = 0.0;
    for (size_t mi = 0; mi < json_array_size(models); mi++) {
        json_t *M = json_array_get(models, mi);
        const char *dir = json_string_value(json_object_get(M, "dir"));
        sfi_qwen3 *m;
        sfi_error e;
        ck_assert_msg(sfi_qwen3_load(hf_path(dir), &m, &e) == SFI_OK, "%s", e.msg);
        const sfi_model_config *c = sfi_qwen3_config(m);
        int V = c->vocab_size;
        json_t *P = json_array_get(json_object_get(M, "prompts"), 0);
        int n;
        int32_t *ids = hf_ids(json_object_get(P, "ids"), &n);
        int n_new = 24;
        sfi_kv_cache ks, kb;
        ck_assert_int_eq(sfi_kv_cache_init(&ks, c, n + n_new, &e), SFI_OK);
        ck_assert_int_eq(sfi_kv_cache_init(&kb, c, n + n_new, &e), SFI_OK);
        float *ls = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
        int32_t ts = 0, tb = 0;
        for (int t = 0; t < n + n_new; t++) {
            int32_t in_s = t < n ? ids[t] : ts, in_b = t < n ? ids[t] : tb;
            ck_assert_int_eq(in_s, in_b); /* same greedy path */
            ck_assert_int_eq(sfi_qwen3_step(m, SFI_BACKEND_SCALAR, &ks, in_s, NULL, NULL, ls, &e),
                             SFI_OK);
            ck_assert_int_eq(sfi_qwen3_step(m, SFI_BACKEND_BLAS, &kb, in_b, NULL, NULL, lb, &e),
                             SFI_OK);
            double mx = 0, md = 0;
            for (int i = 0; i < V; i++) {
                if (fabs(ls[i]) > mx)
                    mx = fabs(ls[i]);
                if (fabs(ls[i] - lb[i]) > md)
                    md = fabs(ls[i] - lb[i]);
            }
            ck_assert_msg(md <= 1e-4 * mx, "%s position %d: blas vs scalar %g > 1e-4 * %g", dir, t,
                          md, mx);
            if (md / mx > worst)
                worst = md / mx;
            ts = sfi_argmax(ls, V);
            tb = sfi_argmax(lb, V);
        }
        free(ls);
        free(lb);
        free(ids);
        sfi_kv_cache_free(&ks);
        sfi_kv_cache_free(&kb);
        sfi_qwen3_free(m);
    }
    printf("blas vs scalar: largest max|diff|/max|logit| = %.3g (bound 1e-4), greedy identical\n",
           worst);
    json_decref(r);
}
END_TEST

/* The whole decode loop in SFI mode (small K: fast steps really sparse)
 * gives the same tokens and step kinds with either backend. */
START_TEST(blas_sfi_decode_same_tokens)
{
    static const char *models[3] = {"tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-moe-nonorm"};
    json_t *r = hf_expected();
    json_t *ms = json_object_get(r, "models");
    for (int mi = 0; mi < 3; mi++) {
        sfi_qwen3 *m;
        sfi_error e;
        ck_assert_int_eq(sfi_qwen3_load(hf_path(models[mi]), &m, &e), SFI_OK);
        json_t *P = json_array_get(json_object_get(json_array_get(ms, (size_t)mi), "prompts"), 0);
        int n;
        int32_t *ids = hf_ids(json_object_get(P, "ids"), &n);
        sfi_decode_result res[2];
        for (int b = 0; b < 2; b++) {
            sfi_decode_opts o;
            sfi_decode_opts_default(&o);
            o.max_new = 24;
            o.backend = b ? SFI_BACKEND_BLAS : SFI_BACKEND_SCALAR;
            ck_assert_int_eq(sfi_params_set(&o.params, "K=12", "t", &e), SFI_OK);
            ck_assert_int_eq(sfi_params_set(&o.params, "n_recent=8", "t", &e), SFI_OK);
            ck_assert_int_eq(sfi_params_set(&o.params, "T_max=6", "t", &e), SFI_OK);
            ck_assert_msg(sfi_decode_run(m, &o, ids, n, NULL, &res[b], &e) == SFI_OK, "%s", e.msg);
        }
        ck_assert_int_eq(res[0].n_generated, res[1].n_generated);
        for (int t = 0; t < res[0].n_generated; t++) {
            ck_assert_int_eq(res[0].ids[t], res[1].ids[t]);
            ck_assert_int_eq(res[0].kinds[t], res[1].kinds[t]);
        }
        printf("%s: SFI decode, blas and scalar: same %d tokens and step kinds\n", models[mi],
               res[0].n_generated);
        sfi_decode_result_free(&res[0]);
        sfi_decode_result_free(&res[1]);
        free(ids);
        sfi_qwen3_free(m);
    }
    json_decref(r);
}
END_TEST

int main(void)
{
    if (!sfi_backend_available(SFI_BACKEND_BLAS)) {
        printf("SKIP: built without OpenBLAS (configure --with-openblas)\n");
        return 77;
    }
    Suite *s = suite_create("qwen3_blas");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, blas_close_to_scalar);
    tcase_add_test(tc, blas_sfi_decode_same_tokens);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
