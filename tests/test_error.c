#include <config.h>

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_error.h"
#include "sfi_test_util.h"

START_TEST(set_returns_code_and_formats)
{
    sfi_error e;
    sfi_error_clear(&e);
    ck_assert_int_eq(e.code, SFI_OK);
    sfi_status s =
        sfi_error_set(&e, SFI_EFORMAT, "%s: %s: expected %d", "config.json", "hidden_size", 3);
    ck_assert_int_eq(s, SFI_EFORMAT);
    ck_assert_str_eq(e.msg, "config.json: hidden_size: expected 3");
    sfi_error_prefix(&e, "%s", "/m");
    ck_assert_str_eq(e.msg, "/m: config.json: hidden_size: expected 3");
    ck_assert_str_eq(sfi_status_name(SFI_EFORMAT), "format");
}
END_TEST

START_TEST(null_error_is_allowed_and_long_messages_truncate)
{
    ck_assert_int_eq(sfi_error_set(NULL, SFI_EIO, "x"), SFI_EIO);
    sfi_error e;
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    sfi_error_set(&e, SFI_EINVAL, "%s", big);
    ck_assert_uint_eq(strlen(e.msg), SFI_ERROR_MSG_MAX - 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("error");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, set_returns_code_and_formats);
    tcase_add_test(tc, null_error_is_allowed_and_long_messages_truncate);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
