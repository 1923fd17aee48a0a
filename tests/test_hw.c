/* sim/sfi_hw: GPU presets, GPU files, calibration profiles. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_hw.h"
#include "sfi_test_util.h"

START_TEST(presets_have_vendor_figures)
{
    sfi_gpu g;
    sfi_error e;
    ck_assert_int_eq(sfi_gpu_preset_count(), 3);
    ck_assert_int_eq(sfi_gpu_preset("b200", &g, &e), SFI_OK);
    ck_assert_str_eq(g.name, "B200");
    ck_assert(g.hbm_bandwidth == 8.0e12 && g.hbm_capacity == 180e9);
    ck_assert_int_eq(sfi_gpu_preset("H100", &g, &e), SFI_OK);
    ck_assert_str_eq(g.name, "H100-SXM");
    ck_assert(g.hbm_bandwidth == 3.35e12 && g.hbm_capacity == 80e9 && g.sm_count == 132);
    ck_assert_int_eq(sfi_gpu_preset("h200", &g, &e), SFI_OK);
    ck_assert(g.hbm_bandwidth == 4.8e12 && g.hbm_capacity == 141e9);
    for (size_t i = 0; i < sfi_gpu_preset_count(); i++)
        ck_assert_int_eq(sfi_gpu_validate(sfi_gpu_preset_at(i), "preset", &e), SFI_OK);
    ck_assert_int_eq(sfi_gpu_resolve("A100", &g, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "unknown GPU 'A100'"));
}
END_TEST

static const char *good_gpu =
    "{\"sfi_gpu\":1,\"name\":\"X1\",\"hbm_capacity_GB\":96,\"hbm_bandwidth_TBps\":4,"
    "\"bf16_dense_TFLOPS\":500,\"fp8_dense_TFLOPS\":1000,\"sm_count\":100,\"l2_MB\":60,"
    "\"nvlink_GBps\":0}";

START_TEST(gpu_file_parses_and_rejects)
{
    sfi_gpu g;
    sfi_error e;
    ck_assert_int_eq(sfi_gpu_parse(good_gpu, strlen(good_gpu), "x.json", &g, &e), SFI_OK);
    ck_assert_str_eq(g.name, "X1");
    ck_assert(g.hbm_capacity == 96e9 && g.hbm_bandwidth == 4e12 && g.bf16_flops == 500e12);
    struct {
        const char *json, *want;
    } bad[] = {
        {"[1]", "not a JSON object"},
        {"{\"sfi_gpu\":1", "invalid JSON"},
        {"{\"name\":\"a\"}", "sfi_gpu: missing"},
        {"{\"sfi_gpu\":2,\"name\":\"a\"}", "version 2 not supported"},
        {"{\"sfi_gpu\":1,\"name\":\"a\",\"hbm_capacity_GB\":1}", "missing"},
        {"{\"sfi_gpu\":1,\"colour\":\"red\"}", "colour: unknown key"},
        {"{\"sfi_gpu\":1,\"name\":\"X\",\"hbm_capacity_GB\":\"96\"}",
         "hbm_capacity_GB: not a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_ne(sfi_gpu_parse(bad[i].json, strlen(bad[i].json), "x.json", &g, &e), SFI_OK);
        ck_assert_msg(strstr(e.msg, bad[i].want) && strstr(e.msg, "x.json"), "%s -> %s",
                      bad[i].json, e.msg);
    }
    /* Negative bandwidth: range error naming the key. */
    const char *buf =
        "{\"sfi_gpu\":1,\"name\":\"X1\",\"hbm_capacity_GB\":96,\"hbm_bandwidth_TBps\":-4,"
        "\"bf16_dense_TFLOPS\":500,\"fp8_dense_TFLOPS\":1000,\"sm_count\":100,\"l2_MB\":60,"
        "\"nvlink_GBps\":0}";
    ck_assert_int_eq(sfi_gpu_parse(buf, strlen(buf), "x.json", &g, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "hbm_bandwidth_TBps"));
}
END_TEST

START_TEST(files_are_capped_and_missing_files_named)
{
    char *dir = sfi_test_tmpdir();
    char path[4096];
    sfi_gpu g;
    sfi_error e;
    snprintf(path, sizeof path, "%s/gpu.json", dir);
    ck_assert_int_eq(sfi_test_write_file(path, good_gpu, strlen(good_gpu)), 0);
    ck_assert_int_eq(sfi_gpu_resolve(path, &g, &e), SFI_OK);
    ck_assert_str_eq(g.name, "X1");
    /* Over the cap: refused by size, before parsing. */
    size_t big = SFI_HW_FILE_MAX + 10;
    char *junk = malloc(big);
    memset(junk, ' ', big);
    snprintf(path, sizeof path, "%s/big.json", dir);
    ck_assert_int_eq(sfi_test_write_file(path, junk, big), 0);
    free(junk);
    ck_assert_int_eq(sfi_gpu_load(path, &g, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "is too large for a GPU description"));
    snprintf(path, sizeof path, "%s/none.json", dir);
    ck_assert_int_eq(sfi_gpu_load(path, &g, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "none.json"));
    sfi_hw_profile pr;
    ck_assert_int_eq(sfi_hw_profile_load(dir, &pr, NULL, NULL, &e), SFI_EIO);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(default_profile_file_matches_builtin)
{
    sfi_hw_profile def, file;
    sfi_error e;
    sfi_hw_profile_default(&def);
    sfi_hw_measurement *m = NULL;
    size_t nm = 7;
    char path[4096];
    snprintf(path, sizeof path, "%s", sfi_test_src("sim/profiles/default.json"));
    ck_assert_msg(sfi_hw_profile_load(path, &file, &m, &nm, &e) == SFI_OK, "%s", e.msg);
    ck_assert_uint_eq(nm, 0);
    ck_assert_ptr_null(m);
    for (int c = 0; c < SFI_KC_COUNT; c++) {
        ck_assert_msg(def.efficiency[c] == file.efficiency[c], "efficiency.%s differs",
                      sfi_kernel_class_name((sfi_kernel_class)c));
        ck_assert_msg(fabs(def.fixed_s[c] - file.fixed_s[c]) < 1e-15, "fixed_us.%s differs",
                      sfi_kernel_class_name((sfi_kernel_class)c));
    }
    /* The file says microseconds: equal up to the rounding of * 1e-6. */
    ck_assert(fabs(def.launch_s - file.launch_s) < 1e-15);
    ck_assert(fabs(def.step_overhead_s - file.step_overhead_s) < 1e-15);
    ck_assert(fabs(def.allreduce_latency_s - file.allreduce_latency_s) < 1e-15);
    ck_assert(def.overlap_contention == file.overlap_contention);
}
END_TEST

/* The engine's whole-step measurements (gpu/profiles/h100-e2e.json) load,
 * are counted, and a malformed entry is refused with its index. */
START_TEST(step_measurements_load_and_are_checked)
{
    sfi_hw_profile pr;
    sfi_error e;
    char path[4096];
    snprintf(path, sizeof path, "%s", sfi_test_src("gpu/profiles/h100-e2e.json"));
    ck_assert_msg(sfi_hw_profile_load(path, &pr, NULL, NULL, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_ge(pr.n_step_measurements, 20);
    char *dir = sfi_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    FILE *f = fopen(bad, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"sfi_profile\": 1, \"step_measurements\": [{\"model\": \"Qwen3-0.6B\", "
          "\"mode\": \"sfi\", \"context\": 8192, \"batch\": 16, \"decode_tokens_per_s\": "
          "4000}, {\"model\": \"Qwen3-0.6B\", \"mode\": \"sfi\", \"context\": 8192, "
          "\"batch\": 16, \"decode_tokens_per_s\": 4000, \"steps\": {\"fast\": "
          "{\"mean_ms\": -3}}}]}",
          f);
    fclose(f);
    ck_assert_int_eq(sfi_hw_profile_load(bad, &pr, NULL, NULL, &e), SFI_EFORMAT);
    ck_assert_msg(strstr(e.msg, "step_measurements[1]") && strstr(e.msg, "mean_ms"), "%s", e.msg);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(profile_parse_partial_measurements_and_errors)
{
    const char *j =
        "{\"sfi_profile\":1,\"name\":\"h100\",\"gpu\":\"H100-SXM\","
        "\"efficiency\":{\"attn_dense\":0.9},\"launch_us\":2.5,"
        "\"measurements\":[{\"kernel\":\"attn_dense\",\"batch\":16,\"context\":32768,"
        "\"q_heads\":32,\"kv_heads\":8,\"head_dim\":128,\"time_us\":800,\"note\":\"x\"}]}";
    sfi_hw_profile p, def;
    sfi_hw_measurement *m;
    size_t n;
    sfi_error e;
    sfi_hw_profile_default(&def);
    ck_assert_msg(sfi_hw_profile_parse(j, strlen(j), "p.json", &p, &m, &n, &e) == SFI_OK, "%s",
                  e.msg);
    ck_assert_str_eq(p.name, "h100");
    ck_assert(p.efficiency[SFI_KC_ATTN_DENSE] == 0.9);
    ck_assert(p.efficiency[SFI_KC_GEMM] == def.efficiency[SFI_KC_GEMM]);
    ck_assert(fabs(p.launch_s - 2.5e-6) < 1e-15);
    /* attn_sparse keeps its default fixed cost; a class given only an
     * efficiency has none. */
    ck_assert(p.fixed_s[SFI_KC_ATTN_SPARSE] == def.fixed_s[SFI_KC_ATTN_SPARSE]);
    const char *j2 = "{\"sfi_profile\":1,\"efficiency\":{\"attn_sparse\":0.6}}";
    sfi_hw_profile p2;
    ck_assert_int_eq(sfi_hw_profile_parse(j2, strlen(j2), "p2.json", &p2, NULL, NULL, &e), SFI_OK);
    ck_assert(p2.fixed_s[SFI_KC_ATTN_SPARSE] == 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(m[0].kernel, "attn_dense");
    ck_assert_int_eq(m[0].context, 32768);
    ck_assert_int_eq(m[0].layers, 1);
    ck_assert(fabs(m[0].time_s - 800e-6) < 1e-15);
    free(m);
    /* Engine terms. */
    const char *j3 = "{\"sfi_profile\":1,\"attn_dense_by_context\":[[8192,0.3],[131072,0.15]],"
                     "\"request_overhead_us\":25,\"reserved_GB\":1.5,"
                     "\"efficiency\":{\"attn_prefill\":0.4}}";
    sfi_hw_profile p3;
    ck_assert_msg(sfi_hw_profile_parse(j3, strlen(j3), "p3.json", &p3, NULL, NULL, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert_int_eq(p3.n_attn_curve, 2);
    ck_assert(p3.attn_curve_ctx[1] == 131072 && p3.attn_curve_eff[1] == 0.15);
    ck_assert(fabs(p3.request_overhead_s - 25e-6) < 1e-15);
    ck_assert(p3.reserved_bytes == 1.5e9);
    ck_assert(p3.efficiency[SFI_KC_ATTN_PREFILL] == 0.4);
    ck_assert_int_eq(def.n_attn_curve, 0);
    ck_assert(def.request_overhead_s == 0 && def.reserved_bytes == 0);
    /* A collective (sfi-gpu bench-allreduce): GPUs and bytes, beyond 2^31. */
    const char *j4 = "{\"sfi_profile\":1,\"measurements\":[{\"kernel\":\"allreduce\","
                     "\"gpus\":8,\"bytes\":4294967296,\"message\":\"sweep\",\"time_us\":9000}]}";
    ck_assert_msg(sfi_hw_profile_parse(j4, strlen(j4), "p4.json", &p3, &m, &n, &e) == SFI_OK, "%s",
                  e.msg);
    ck_assert(n == 1 && m[0].gpus == 8 && m[0].bytes == 4294967296.0);
    free(m);
    /* collectives of 4 GPUs at their own latency and efficiency */
    const char *j5 = "{\"sfi_profile\":1,\"allreduce_by_gpus\":{\"4\":[10.02,0.634]}}";
    ck_assert_msg(sfi_hw_profile_parse(j5, strlen(j5), "p5.json", &p3, NULL, NULL, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert(fabs(p3.ar_by_gpus_lat[4] - 10.02e-6) < 1e-15 && p3.ar_by_gpus_eff[4] == 0.634);
    ck_assert(p3.ar_by_gpus_eff[2] == 0 && p3.ar_by_gpus_eff[8] == 0);
    ck_assert(p3.ag_by_gpus_eff[4] == 0); /* all-gathers: only where given */
    /* all-gathers of 2 GPUs at theirs (sfi-gpu bench-allreduce --op allgather) */
    const char *j6 = "{\"sfi_profile\":1,\"allreduce_by_gpus\":{\"2\":[6.7,0.509]},"
                     "\"allgather_by_gpus\":{\"2\":[9.5,0.41]}}";
    ck_assert_msg(sfi_hw_profile_parse(j6, strlen(j6), "p6.json", &p3, NULL, NULL, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert(fabs(p3.ag_by_gpus_lat[2] - 9.5e-6) < 1e-15 && p3.ag_by_gpus_eff[2] == 0.41);
    ck_assert(p3.ar_by_gpus_eff[2] == 0.509 && p3.ag_by_gpus_eff[4] == 0);
    ck_assert(p3.allreduce_step_s == 0); /* an all-reduce in a step: alone's, unless given */
    const char *j7 = "{\"sfi_profile\":1,\"allreduce_step_us\":2.8}";
    ck_assert_msg(sfi_hw_profile_parse(j7, strlen(j7), "p7.json", &p3, NULL, NULL, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert(fabs(p3.allreduce_step_s - 2.8e-6) < 1e-15);
    ck_assert(p3.sel_pre_s == 0); /* steps 1-7 beside the MLP, unless given */
    const char *j8 = "{\"sfi_profile\":1,\"sel_pre_us\":6.74}";
    ck_assert_msg(sfi_hw_profile_parse(j8, strlen(j8), "p8.json", &p3, NULL, NULL, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert(fabs(p3.sel_pre_s - 6.74e-6) < 1e-15);
    const char *bad[][2] = {
        {"{\"sfi_profile\":1,\"measurements\":[{\"kernel\":\"allreduce\",\"bytes\":-1,"
         "\"time_us\":5}]}",
         "measurements[0].bytes: not a byte count"},
        {"{\"sfi_profile\":1,\"measurements\":[{\"kernel\":\"allreduce\",\"gpus\":1.5,"
         "\"time_us\":5}]}",
         "measurements[0].gpus"},
        {"{\"sfi_profile\":1,\"efficiency\":{\"gemm\":1.5}}", "efficiency.gemm: must be in (0, 1]"},
        {"{\"sfi_profile\":1,\"efficiency\":{\"warp\":0.5}}", "unknown kernel class"},
        {"{\"sfi_profile\":1,\"launch_us\":-1}", "launch_us"},
        {"{\"sfi_profile\":1,\"measurements\":[{\"kernel\":\"x\"}]}", "measurements[0]"},
        {"{\"sfi_profile\":1,\"bogus\":1}", "bogus: unknown key"},
        {"{\"sfi_profile\":1,\"fixed_us\":{\"topk\":-1}}", "fixed_us.topk"},
        {"{\"sfi_gpu\":1}", "sfi_profile: missing"},
        {"{\"sfi_profile\":1,\"attn_dense_by_context\":[[8192,0.3]]}", "needs 2..16 points"},
        {"{\"sfi_profile\":1,\"attn_dense_by_context\":[[8192,0.3],[4096,0.2]]}",
         "attn_dense_by_context[1]: contexts must increase"},
        {"{\"sfi_profile\":1,\"attn_dense_by_context\":[[8192,0.3],[16384,1.2]]}",
         "efficiency must be in (0, 1]"},
        {"{\"sfi_profile\":1,\"attn_dense_by_context\":[[8192,0.3],[16384]]}", "pair"},
        {"{\"sfi_profile\":1,\"attn_dense_by_context\":{}}", "not an array"},
        {"{\"sfi_profile\":1,\"reserved_GB\":-1}", "reserved_GB"},
        {"{\"sfi_profile\":1,\"allreduce_by_gpus\":{\"1\":[5,0.5]}}", "not a GPU count in 2..8"},
        {"{\"sfi_profile\":1,\"allreduce_by_gpus\":{\"4\":[5,1.5]}}", "efficiency in (0, 1]"},
        {"{\"sfi_profile\":1,\"allreduce_by_gpus\":[]}", "allreduce_by_gpus: not an object"},
        {"{\"sfi_profile\":1,\"allgather_by_gpus\":{\"9\":[5,0.5]}}",
         "allgather_by_gpus: '9' is not a GPU count in 2..8"},
        {"{\"sfi_profile\":1,\"allgather_by_gpus\":{\"2\":[-1,0.5]}}",
         "allgather_by_gpus: \"2\" needs [latency_us in 0..1e6"},
        {"{\"sfi_profile\":1,\"allgather_by_gpus\":{\"2\":[5]}}", "allgather_by_gpus"},
        {"{\"sfi_profile\":1,\"allgather_by_gpus\":7}", "allgather_by_gpus: not an object"},
        {"{\"sfi_profile\":1,\"allreduce_step_us\":-1}", "allreduce_step_us"},
        {"{\"sfi_profile\":1,\"allreduce_step_us\":\"2\"}", "allreduce_step_us"},
        {"{\"sfi_profile\":1,\"sel_pre_us\":-1}", "sel_pre_us"},
        {"{\"sfi_profile\":1,\"request_overhead_us\":\"x\"}", "request_overhead_us: not a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_ne(
            sfi_hw_profile_parse(bad[i][0], strlen(bad[i][0]), "p.json", &p, &m, &n, &e), SFI_OK);
        ck_assert_msg(strstr(e.msg, bad[i][1]) && strstr(e.msg, "p.json"), "%s -> %s", bad[i][0],
                      e.msg);
        ck_assert_ptr_null(m);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hw");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, presets_have_vendor_figures);
    tcase_add_test(tc, gpu_file_parses_and_rejects);
    tcase_add_test(tc, files_are_capped_and_missing_files_named);
    tcase_add_test(tc, default_profile_file_matches_builtin);
    tcase_add_test(tc, profile_parse_partial_measurements_and_errors);
    tcase_add_test(tc, step_measurements_load_and_are_checked);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
