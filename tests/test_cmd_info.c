/* Check suite of `sfi-ref info` (ref/cmd_info.c) and its man page. */
#include <config.h>

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_test_util.h"

static int run_info(const char *args, char **out, char **err)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' info %s", sfi_test_build("sfi-ref"), args);
    return sfi_test_run(cmd, out, err);
}

START_TEST(text_output_of_a_preset)
{
    char *out, *err;
    ck_assert_int_eq(run_info("--model qwen3-0.6B", &out, &err), 0);
    ck_assert_str_eq(err, "");
    ck_assert_ptr_nonnull(strstr(out, "model                    Qwen3-0.6B\n"));
    ck_assert_ptr_nonnull(strstr(out, "arch                     qwen3\n"));
    ck_assert_ptr_nonnull(strstr(out, "layers                   28\n"));
    ck_assert_ptr_nonnull(strstr(out, "attention_heads          16\n"));
    ck_assert_ptr_nonnull(strstr(out, "kv_heads                 8\n"));
    ck_assert_ptr_nonnull(strstr(out, "head_dim                 128\n"));
    ck_assert_ptr_nonnull(strstr(out, "params                   596049920 (0.596 B)\n"));
    ck_assert_ptr_nonnull(strstr(out, "weight_bytes             1192099840 (1.2 GB, 2 bytes"));
    ck_assert_ptr_nonnull(strstr(out, "kv_bytes_per_token_bf16  114688 (114.7 kB)\n"));
    ck_assert_ptr_null(strstr(out, "experts"));
    free(out);
    free(err);
}
END_TEST

START_TEST(json_output_of_a_moe_preset)
{
    char *out, *err;
    ck_assert_int_eq(run_info("-m Qwen3-30B-A3B --json", &out, &err), 0);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    ck_assert_msg(o != NULL, "%s", je.text);
    ck_assert_str_eq(json_string_value(json_object_get(o, "arch")), "qwen3_moe");
    ck_assert_int_eq(json_integer_value(json_object_get(o, "layers")), 48);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "attention_heads")), 32);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "kv_heads")), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "experts")), 128);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "moe_layers")), 48);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "kv_bytes_per_token_bf16")),
                     48 * 2 * 4 * 128 * 2);
    /* Model card: 30.5B total, 3.3B activated. */
    json_int_t params = json_integer_value(json_object_get(o, "params"));
    json_int_t active = json_integer_value(json_object_get(o, "active_params"));
    ck_assert(params > 30450000000LL && params < 30550000000LL);
    ck_assert(active > 3250000000LL && active < 3400000000LL);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "weight_bytes")), 2 * params);
    json_decref(o);
    free(out);
    free(err);
}
END_TEST

START_TEST(list_and_config_file)
{
    char *out, *err;
    ck_assert_int_eq(run_info("--list", &out, &err), 0);
    ck_assert_str_eq(out, "Qwen3-0.6B\nQwen3-1.7B\nQwen3-4B\nQwen3-4B-Instruct-2507\n"
                          "Qwen3-8B\nQwen3-14B\nQwen3-32B\nQwen3-30B-A3B\nQwen3-235B-A22B\n");
    free(out);
    free(err);
    char args[4200];
    snprintf(args, sizeof args, "--model '%s'", sfi_test_src("src/presets/Qwen3-8B.json"));
    ck_assert_int_eq(run_info(args, &out, &err), 0);
    ck_assert_ptr_nonnull(strstr(out, "layers                   36\n"));
    free(out);
    free(err);
}
END_TEST

START_TEST(bad_input_and_usage)
{
    char *out, *err;
    ck_assert_int_eq(run_info("", &out, &err), 2);
    ck_assert_ptr_nonnull(strstr(err, "--model is required"));
    ck_assert_str_eq(out, "");
    free(out);
    free(err);
    ck_assert_int_eq(run_info("--frobnicate", &out, &err), 2);
    ck_assert_ptr_nonnull(strstr(err, "unknown option '--frobnicate'"));
    free(out);
    free(err);
    ck_assert_int_eq(run_info("--model", &out, &err), 2);
    ck_assert_ptr_nonnull(strstr(err, "missing argument for option '--model'"));
    free(out);
    free(err);
    ck_assert_int_eq(run_info("--model Qwen9-1T", &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "Qwen9-1T: neither a model preset"));
    ck_assert_str_eq(out, "");
    free(out);
    free(err);
    char *dir = sfi_test_tmpdir();
    char path[4096], args[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    const char *bad = "{\"model_type\": \"qwen3\", \"vocab_size\": 10, \"hidden_size\": 8,\n"
                      " \"intermediate_size\": 8, \"num_hidden_layers\": 2,\n"
                      " \"num_attention_heads\": 4, \"num_key_value_heads\": 3, \"head_dim\": 2}";
    ck_assert_int_eq(sfi_test_write_file(path, bad, strlen(bad)), 0);
    snprintf(args, sizeof args, "--model '%s'", dir);
    ck_assert_int_eq(run_info(args, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "config.json: num_attention_heads: 4 is not divisible by "
                                      "num_key_value_heads (3)"));
    ck_assert_str_eq(out, "");
    free(out);
    free(err);
    ck_assert_int_eq(sfi_test_write_file(path, "{\"model_type\": ", 15), 0);
    ck_assert_int_eq(run_info(args, &out, &err), 1);
    ck_assert_ptr_nonnull(strstr(err, "config.json:1:"));
    free(out);
    free(err);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* Every option --help names is documented in the man page. */
START_TEST(help_matches_man_page)
{
    char *out, *err;
    ck_assert_int_eq(run_info("--help", &out, &err), 0);
    char *man = sfi_test_read_file(sfi_test_src("man/sfi-ref-info.1"), NULL);
    ck_assert_ptr_nonnull(man);
    /* roff writes '-' as "\-"; drop the backslashes to compare. */
    char *w = man;
    for (char *r = man; *r; r++)
        if (!(r[0] == '\\' && r[1] == '-'))
            *w++ = *r;
    *w = '\0';
    static const char *opts[] = {"--model", "--json", "--list", "--help", "-m", "-l", "-h"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        ck_assert_msg(strstr(out, opts[i]) != NULL, "--help lacks %s", opts[i]);
        ck_assert_msg(strstr(man, opts[i]) != NULL, "man page lacks %s", opts[i]);
    }
    /* And the help names the man page. */
    ck_assert_ptr_nonnull(strstr(out, "sfi-ref-info(1)"));
    free(man);
    free(out);
    free(err);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cmd_info");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, text_output_of_a_preset);
    tcase_add_test(tc, json_output_of_a_moe_preset);
    tcase_add_test(tc, list_and_config_file);
    tcase_add_test(tc, bad_input_and_usage);
    tcase_add_test(tc, help_matches_man_page);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
