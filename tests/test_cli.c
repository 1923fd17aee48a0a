/* Check suite of the refused-option message (src/sfi_cli.c) as the sfi-ref
 * commands print it: the exact first line, the usage after it, exit 2. */
#include <config.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_test_util.h"

/* sfi-ref with args: exit code 2, nothing on stdout, want as the first
 * line of stderr and the command's usage after it. */
static void refused(const char *args, const char *want)
{
    char cmd[8192], *out, *err;
    snprintf(cmd, sizeof cmd, "'%s' %s", sfi_test_build("sfi-ref"), args);
    ck_assert_int_eq(sfi_test_run(cmd, &out, &err), 2);
    ck_assert_str_eq(out, "");
    const size_t n = strlen(want);
    ck_assert_msg(!strncmp(err, want, n) && err[n] == '\n', "%s: stderr was: %s", args, err);
    ck_assert_msg(!strncmp(err + n + 1, "usage: ", 7), "%s: no usage after: %s", args, err);
    free(out);
    free(err);
}

START_TEST(short_options_named_by_letter)
{
    refused("run -m", "sfi-ref run: option -m: needs a value");
    refused("run -Z", "sfi-ref run: option -Z: unknown");
    refused("eval -L", "sfi-ref eval: option -L: needs a value");
    refused("eval -Z", "sfi-ref eval: option -Z: unknown");
}
END_TEST

START_TEST(long_options_named_as_given)
{
    refused("run --frobnicate", "sfi-ref run: --frobnicate: unknown option or missing value");
    refused("eval --text", "sfi-ref eval: --text: unknown option or missing value");
}
END_TEST

/* The commands that name every refused option as given, short ones too. */
START_TEST(commands_naming_the_argument)
{
    refused("calibrate -m", "sfi-ref calibrate: -m: unknown option or missing value");
    refused("calibrate --bogus", "sfi-ref calibrate: --bogus: unknown option or missing value");
    refused("make-checkpoint -Z", "sfi-ref make-checkpoint: -Z: unknown option or missing value");
    refused("make-checkpoint --out",
            "sfi-ref make-checkpoint: --out: unknown option or missing value");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, short_options_named_by_letter);
    tcase_add_test(tc, long_options_named_as_given);
    tcase_add_test(tc, commands_naming_the_argument);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
