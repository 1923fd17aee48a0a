/* Qwen3 forward pass against Hugging Face transformers (fixtures from
 * tests/make_hf_fixtures.py), and checkpoints that do not match their
 * config refused with the tensor named. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_hf_fixture.h"
#include "sfi_qwen3.h"
#include "sfi_test_util.h"

/* Runs every prompt of every fixture model through the backend, position
 * by position, and checks each position's logits against transformers'
 * (max |diff| <= 1e-4 * max |logit| of that position), then the greedy
 * continuation. Returns the largest relative difference seen. */
static double conformance(sfi_backend be)
{
    json_t *r = hf_expected();
    json_t *models = json_object_get(r, "models");
    double worst_all = 0.0;
    ck_assert_uint_ge(json_array_size(models), 3);
    for (size_t mi = 0; mi < json_array_size(models); mi++) {
        json_t *M = json_array_get(models, mi);
        const char *dir = json_string_value(json_object_get(M, "dir"));
        sfi_qwen3 *m;
        sfi_error e;
        ck_assert_msg(sfi_qwen3_load(hf_path(dir), &m, &e) == SFI_OK, "%s", e.msg);
        const sfi_model_config *c = sfi_qwen3_config(m);
        json_t *ps = json_object_get(M, "prompts");
        for (size_t pi = 0; pi < json_array_size(ps); pi++) {
            json_t *P = json_array_get(ps, pi);
            int n, n_greedy;
            int32_t *ids = hf_ids(json_object_get(P, "ids"), &n);
            int32_t *greedy = hf_ids(json_object_get(P, "greedy"), &n_greedy);
            int V = c->vocab_size;
            ck_assert_int_eq(V, (int)json_integer_value(json_object_get(P, "vocab")));
            float *ref = hf_logits(json_string_value(json_object_get(P, "logits")), (size_t)n * V);
            sfi_kv_cache kv;
            ck_assert_int_eq(sfi_kv_cache_init(&kv, c, n + n_greedy, &e), SFI_OK);
            float *lg = malloc((size_t)V * sizeof(float));
            double worst = 0.0;
            for (int t = 0; t < n; t++) {
                ck_assert_msg(sfi_qwen3_step(m, be, &kv, ids[t], NULL, NULL, lg, &e) == SFI_OK,
                              "%s", e.msg);
                double mx = 0.0, md = 0.0;
                for (int i = 0; i < V; i++) {
                    double a = fabs(ref[(size_t)t * V + i]);
                    double d = fabs((double)lg[i] - ref[(size_t)t * V + i]);
                    if (a > mx)
                        mx = a;
                    if (d > md)
                        md = d;
                }
                ck_assert_msg(md <= 1e-4 * mx,
                              "%s prompt %zu position %d: max|diff| %g > 1e-4 * %g", dir, pi, t, md,
                              mx);
                if (md / mx > worst)
                    worst = md / mx;
            }
            for (int g = 0; g < n_greedy; g++) {
                int32_t tok = sfi_argmax(lg, V);
                ck_assert_msg(tok == greedy[g],
                              "%s prompt %zu: greedy token %d is %d, "
                              "transformers %d",
                              dir, pi, g, (int)tok, (int)greedy[g]);
                if (g + 1 < n_greedy)
                    ck_assert_int_eq(sfi_qwen3_step(m, be, &kv, tok, NULL, NULL, lg, &e), SFI_OK);
            }
            printf("%s backend %s prompt %zu: %d positions, max|diff|/max|logit| = %.3g, "
                   "%d greedy tokens identical\n",
                   dir, sfi_backend_name(be), pi, n, worst, n_greedy);
            if (worst > worst_all)
                worst_all = worst;
            free(lg);
            free(ref);
            free(ids);
            free(greedy);
            sfi_kv_cache_free(&kv);
        }
        sfi_qwen3_free(m);
    }
    json_decref(r);
    return worst_all;
}

START_TEST(scalar_matches_transformers)
{
    double w = conformance(SFI_BACKEND_SCALAR);
    printf("scalar: largest max|diff|/max|logit| over all positions: %.3g\n", w);
}
END_TEST

/* Same inputs twice: same bits (the scalar backend is deterministic). */
START_TEST(scalar_is_deterministic)
{
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_int_eq(sfi_qwen3_load(hf_path("tiny-qwen3-moe"), &m, &e), SFI_OK);
    const sfi_model_config *c = sfi_qwen3_config(m);
    float *a = malloc((size_t)c->vocab_size * 4), *b = malloc((size_t)c->vocab_size * 4);
    for (int rep = 0; rep < 2; rep++) {
        sfi_kv_cache kv;
        ck_assert_int_eq(sfi_kv_cache_init(&kv, c, 8, &e), SFI_OK);
        for (int t = 0; t < 8; t++)
            ck_assert_int_eq(
                sfi_qwen3_step(m, SFI_BACKEND_SCALAR, &kv, 7 * t + 3, NULL, NULL, rep ? b : a, &e),
                SFI_OK);
        ck_assert_int_eq(sfi_qwen3_step(m, SFI_BACKEND_SCALAR, &kv, 1, NULL, NULL, NULL, &e),
                         SFI_ERANGE); /* cache full */
        sfi_kv_cache_free(&kv);
    }
    ck_assert(memcmp(a, b, (size_t)c->vocab_size * 4) == 0);
    free(a);
    free(b);
    sfi_qwen3_free(m);
}
END_TEST

START_TEST(argmax_ties_to_smaller_id)
{
    float v[5] = {1, 3, 2, 3, -1};
    ck_assert_int_eq(sfi_argmax(v, 5), 1);
    float w[3] = {-INFINITY, -INFINITY, -INFINITY};
    ck_assert_int_eq(sfi_argmax(w, 3), 0);
}
END_TEST

/* Copies a fixture model into a temp dir, applies a sed expression to its
 * config.json, and returns the load error. */
static sfi_status load_edited(const char *model, const char *sed, sfi_error *e, char **dirp)
{
    char *dir = sfi_test_tmpdir();
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cp '%s'/config.json '%s'/model.safetensors '%s'/ && sed -i '%s' '%s'/config.json",
             hf_path(model), hf_path(model), dir, sed, dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    sfi_qwen3 *m = NULL;
    sfi_status rc = sfi_qwen3_load(dir, &m, e);
    sfi_qwen3_free(m);
    if (dirp)
        *dirp = dir;
    else {
        sfi_test_rmtree(dir);
        free(dir);
    }
    return rc;
}

/* layer_types must list num_hidden_layers entries; an unknown key is
 * ignored, so renaming it lets a test change the layer count alone. */
#define LAYER_TYPES_OFF "s/\"layer_types\"/\"layer_types_off\"/"

START_TEST(config_checkpoint_mismatch_refused)
{
    sfi_error e;
    /* fewer layers than the checkpoint holds */
    ck_assert_int_eq(
        load_edited("tiny-qwen3",
                    "s/\"num_hidden_layers\": 3/\"num_hidden_layers\": 2/;" LAYER_TYPES_OFF, &e,
                    NULL),
        SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "model.layers.2."));
    ck_assert_ptr_nonnull(strstr(e.msg, "mismatch"));
    /* more layers: a missing tensor */
    ck_assert_int_eq(
        load_edited("tiny-qwen3",
                    "s/\"num_hidden_layers\": 3/\"num_hidden_layers\": 4/;" LAYER_TYPES_OFF, &e,
                    NULL),
        SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "tensor model.layers.3.input_layernorm.weight is missing"));
    /* wrong width: shape mismatch naming the tensor */
    ck_assert_int_eq(load_edited("tiny-qwen3",
                                 "s/\"intermediate_size\": 96/\"intermediate_size\": 95/", &e,
                                 NULL),
                     SFI_EFORMAT);
    ck_assert_ptr_nonnull(
        strstr(e.msg, "mlp.gate_proj.weight has shape [96, 64], the config needs [95, 64]"));
    /* untied config over a tied checkpoint: lm_head missing */
    ck_assert_int_eq(load_edited("tiny-qwen3-moe",
                                 "s/\"tie_word_embeddings\": true/\"tie_word_embeddings\": false/",
                                 &e, NULL),
                     SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "lm_head.weight"));
    /* truncated checkpoint */
    char *dir;
    ck_assert_int_eq(load_edited("tiny-qwen3", "s/x/x/", &e, &dir), SFI_OK);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "truncate -s 100000 '%s'/model.safetensors", dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    sfi_qwen3 *m = NULL;
    ck_assert_int_eq(sfi_qwen3_load(dir, &m, &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "model.safetensors"));
    ck_assert_ptr_nonnull(strstr(e.msg, "truncated"));
    /* no checkpoint at all */
    snprintf(cmd, sizeof cmd, "rm '%s'/model.safetensors", dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    ck_assert_int_eq(sfi_qwen3_load(dir, &m, &e), SFI_ENOTFOUND);
    sfi_test_rmtree(dir);
    free(dir);
    /* no config */
    ck_assert_int_ne(sfi_qwen3_load("/nonexistent-model-dir", &m, &e), SFI_OK);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(step_rejects_bad_tokens)
{
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_int_eq(sfi_qwen3_load(hf_path("tiny-qwen3"), &m, &e), SFI_OK);
    sfi_kv_cache kv;
    ck_assert_int_eq(sfi_kv_cache_init(&kv, sfi_qwen3_config(m), 4, &e), SFI_OK);
    ck_assert_int_eq(sfi_qwen3_step(m, SFI_BACKEND_SCALAR, &kv, 512, NULL, NULL, NULL, &e),
                     SFI_ERANGE);
    ck_assert_int_eq(sfi_qwen3_step(m, SFI_BACKEND_SCALAR, &kv, -1, NULL, NULL, NULL, &e),
                     SFI_ERANGE);
    ck_assert_int_eq(kv.n, 0);
    sfi_kv_cache_free(&kv);
    sfi_qwen3_free(m);
    sfi_backend b;
    ck_assert_int_eq(sfi_backend_parse("gpu", &b, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_backend_parse("scalar", &b, &e), SFI_OK);
    ck_assert_int_eq(b, SFI_BACKEND_SCALAR);
}
END_TEST

/* sfi-ref make-checkpoint: same seed same bytes, loadable, runnable;
 * failures leave nothing behind. */
START_TEST(make_checkpoint_cli)
{
    char sfi_ref[2048], cfg[2048], cmd[8192];
    snprintf(sfi_ref, sizeof sfi_ref, "%s", sfi_test_build("sfi-ref"));
    snprintf(cfg, sizeof cfg, "%s", hf_path("tiny-qwen3-moe/config.json"));
    char *dir = sfi_test_tmpdir();
    char *out = NULL, *err = NULL;
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s make-checkpoint --preset %s --out %s/c%d --seed 9 --layers 2",
                 sfi_ref, cfg, dir, i);
        ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
        ck_assert_ptr_nonnull(strstr(out, "2 layers"));
        free(out);
        free(err);
    }
    snprintf(cmd, sizeof cmd,
             "cmp %s/c0/model.safetensors %s/c1/model.safetensors && "
             "cmp %s/c0/config.json %s/c1/config.json",
             dir, dir, dir, dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    char path[4096];
    snprintf(path, sizeof path, "%s/c0", dir);
    sfi_qwen3 *m;
    sfi_error e;
    ck_assert_msg(sfi_qwen3_load(path, &m, &e) == SFI_OK, "%s", e.msg);
    const sfi_model_config *c = sfi_qwen3_config(m);
    ck_assert_int_eq(c->num_hidden_layers, 2);
    ck_assert_int_eq(c->arch, SFI_ARCH_QWEN3_MOE);
    ck_assert_int_eq(c->n_mlp_only_layers, 1);
    sfi_kv_cache kv;
    ck_assert_int_eq(sfi_kv_cache_init(&kv, c, 2, &e), SFI_OK);
    float *lg = malloc((size_t)c->vocab_size * 4);
    ck_assert_int_eq(sfi_qwen3_step(m, SFI_BACKEND_SCALAR, &kv, 5, NULL, NULL, lg, &e), SFI_OK);
    for (int i = 0; i < c->vocab_size; i++)
        ck_assert(isfinite(lg[i]));
    free(lg);
    sfi_kv_cache_free(&kv);
    sfi_qwen3_free(m);
    /* different seed, different weights */
    snprintf(cmd, sizeof cmd,
             "%s make-checkpoint --preset %s --out %s/c2 --seed 10 --layers 2 "
             "&& ! cmp -s %s/c0/model.safetensors %s/c2/model.safetensors",
             sfi_ref, cfg, dir, dir, dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    /* errors */
    snprintf(cmd, sizeof cmd, "%s make-checkpoint --preset NoSuchModel --out %s/c3", sfi_ref, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "NoSuchModel"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s make-checkpoint --preset %s --out /proc/no/such/dir", sfi_ref,
             cfg);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "/proc/no/such/dir"));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s make-checkpoint --preset %s --out %s/c4 --layers 9", sfi_ref, cfg,
             dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 2);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd,
             "test ! -e %s/c3 && test ! -e %s/c4 && ls -A %s/c0 | wc -l | grep -qx 2", dir, dir,
             dir);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    /* A checkpoint make-checkpoint did not write is never replaced by
     * random weights (issue 20: a trained model was); its own is. */
    snprintf(cmd, sizeof cmd, "cp -r '%s' %s/real && %s make-checkpoint --preset %s --out %s/real",
             hf_path("tiny-qwen3"), dir, sfi_ref, cfg, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_msg(strstr(err, "holds a checkpoint that sfi-ref make-checkpoint did not write"),
                  "%s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd,
             "cmp %s/real/model.safetensors '%s/model.safetensors' && "
             "cmp %s/real/config.json '%s/config.json'",
             dir, hf_path("tiny-qwen3"), dir, hf_path("tiny-qwen3"));
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    snprintf(cmd, sizeof cmd,
             "rm %s/real/config.json && %s make-checkpoint --preset %s --out "
             "%s/real",
             dir, sfi_ref, cfg, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_msg(strstr(err, "model.safetensors without config.json"), "%s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd,
             "%s make-checkpoint --preset %s --out %s/c1 --seed 9 --layers 2 "
             "&& cmp %s/c0/model.safetensors %s/c1/model.safetensors",
             sfi_ref, cfg, dir, dir, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    free(out);
    free(err);
    /* sfi-ref info shows the checkpoint's tensors; a corrupt one is an error */
    snprintf(cmd, sizeof cmd, "%s info --model %s/c0", sfi_ref, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 0);
    ck_assert_ptr_nonnull(strstr(out, "checkpoint_tensors       34\n"));
    ck_assert_ptr_nonnull(strstr(out, "checkpoint_bytes "));
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "truncate -s 1000 %s/c0/model.safetensors && %s info --model %s/c0",
             dir, sfi_ref, dir);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "model.safetensors"));
    free(out);
    free(err);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* Block prefill (several blocks of 64) equals token-by-token steps: bit for
 * bit with the scalar backend (logits and cache), closely with blas. */
START_TEST(prefill_blocks_equal_steps)
{
    static const char *models[2] = {"tiny-qwen3", "tiny-qwen3-moe"};
    for (int mi = 0; mi < 2; mi++)
        for (int be = 0; be < 2; be++) {
            if (be == 1 && !sfi_backend_available(SFI_BACKEND_BLAS))
                continue;
            sfi_qwen3 *m;
            sfi_error e;
            ck_assert_int_eq(sfi_qwen3_load(hf_path(models[mi]), &m, &e), SFI_OK);
            const sfi_model_config *c = sfi_qwen3_config(m);
            int n = 150, V = c->vocab_size;
            int32_t ids[150];
            for (int i = 0; i < n; i++)
                ids[i] = (int32_t)((i * 37 + 11) % V);
            sfi_kv_cache a, b;
            ck_assert_int_eq(sfi_kv_cache_init(&a, c, n, &e), SFI_OK);
            ck_assert_int_eq(sfi_kv_cache_init(&b, c, n, &e), SFI_OK);
            float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
            ck_assert_int_eq(sfi_qwen3_prefill(m, (sfi_backend)be, &a, ids, n, NULL, NULL, la, &e),
                             SFI_OK);
            for (int i = 0; i < n; i++)
                ck_assert_int_eq(sfi_qwen3_step(m, (sfi_backend)be, &b, ids[i], NULL, NULL, lb, &e),
                                 SFI_OK);
            ck_assert_int_eq(a.n, n);
            if (be == 0) {
                ck_assert(memcmp(la, lb, (size_t)V * 4) == 0);
                size_t kvn =
                    (size_t)c->num_hidden_layers * n * c->num_key_value_heads * c->head_dim;
                ck_assert(memcmp(a.k, b.k, kvn * 4) == 0);
                ck_assert(memcmp(a.v, b.v, kvn * 4) == 0);
            } else {
                double mx = 0, md = 0;
                for (int i = 0; i < V; i++) {
                    mx = fmax(mx, fabs(lb[i]));
                    md = fmax(md, fabs(la[i] - lb[i]));
                }
                ck_assert_msg(md <= 1e-4 * mx, "blas block prefill: %g vs %g", md, mx);
            }
            /* a full cache is refused */
            ck_assert_int_eq(
                sfi_qwen3_prefill(m, (sfi_backend)be, &a, ids, 1, NULL, NULL, NULL, &e),
                SFI_ERANGE);
            free(la);
            free(lb);
            sfi_kv_cache_free(&a);
            sfi_kv_cache_free(&b);
            sfi_qwen3_free(m);
        }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("qwen3");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, scalar_matches_transformers);
    tcase_add_test(tc, scalar_is_deterministic);
    tcase_add_test(tc, argmax_ties_to_smaller_id);
    tcase_add_test(tc, config_checkpoint_mismatch_refused);
    tcase_add_test(tc, step_rejects_bad_tokens);
    tcase_add_test(tc, make_checkpoint_cli);
    tcase_add_test(tc, prefill_blocks_equal_steps);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
