/* Shared helpers of the Check suites. */
#ifndef SFI_TEST_UTIL_H
#define SFI_TEST_UTIL_H

#include <check.h>
#include <stddef.h>
#include <stdlib.h>

/* $SFI_SRCDIR/rel (the source tree; fixtures live under tests/). Static
 * buffer: copy before the next call. */
const char *sfi_test_src(const char *rel);
/* $SFI_BUILDDIR/rel (built programs). */
const char *sfi_test_build(const char *rel);
/* $SFI_SHARED/rel when that path exists, else NULL: callers then print
 * "SKIP: ..." and skip (never pass) what needs it. */
const char *sfi_test_shared(const char *rel);

/* A fresh private directory under $TMPDIR (removed by the caller with
 * sfi_test_rmtree). Returns a malloc'd path. */
char *sfi_test_tmpdir(void);
void sfi_test_rmtree(const char *path);

/* Runs cmd with /bin/sh -c, stdin from /dev/null, and captures stdout and
 * stderr (malloc'd, NUL-terminated; pass NULL to discard). Returns the exit
 * status, 128+signal when killed, -1 when the command could not run. */
int sfi_test_run(const char *cmd, char **out, char **err);
/* sfi_test_run of the program prog with args (shell words, quoted by the
 * caller) in dir, with SFI_TRACE empty (no trace recorded). */
int sfi_test_run_in(const char *dir, const char *prog, const char *args, char **out, char **err);
/* 1 when path holds a PNG of more than 1000 bytes (a drawn figure). */
int sfi_test_is_png(const char *path);

/* A Check fixture: a fresh temporary directory sfi_test_dir for each
 * test, made by sfi_test_dir_setup and removed by sfi_test_dir_teardown. */
extern char *sfi_test_dir;
void sfi_test_dir_setup(void);
void sfi_test_dir_teardown(void);

/* Reads a whole file (malloc'd, NUL-terminated); NULL on error. */
char *sfi_test_read_file(const char *path, size_t *len);
int sfi_test_write_file(const char *path, const void *data, size_t len);

/* sfi(7)'s SFI defaults, written out here so the tests that use them
 * pin the method's values independently of src/sfi_params.c. */
#include "sfi_params.h"
sfi_params sfi_test_method_defaults(void);

/* The end of every test program's main(): runs suite s (each test in its
 * own process, unless fork is CK_NOFORK; CK_FORK_GETENV follows $CK_FORK)
 * and returns the exit status, EXIT_FAILURE when a test failed. Inline:
 * only test programs link Check. */
static inline int sfi_test_run_suite(Suite *s, enum fork_status fork)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, fork);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
