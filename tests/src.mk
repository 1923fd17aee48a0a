# Check suites of the shared layer (src/).
check_PROGRAMS += tests/test_error
tests_test_error_SOURCES = tests/test_error.c
tests_test_error_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_error_LDADD = $(TEST_LDADD)
TESTS += tests/test_error
check_PROGRAMS += tests/test_params
tests_test_params_SOURCES = tests/test_params.c
tests_test_params_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_params_LDADD = $(TEST_LDADD)
TESTS += tests/test_params
check_PROGRAMS += tests/test_model tests/test_model_shared
tests_test_model_SOURCES = tests/test_model.c
tests_test_model_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_model_LDADD = $(TEST_LDADD)
# The same suite's part that needs $SFI_SHARED (skips, exit 77, without it).
tests_test_model_shared_SOURCES = tests/test_model.c
tests_test_model_shared_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_TEST_SHARED_ONLY
tests_test_model_shared_LDADD = $(TEST_LDADD)
TESTS += tests/test_model tests/test_model_shared
check_PROGRAMS += tests/test_cmd_info
tests_test_cmd_info_SOURCES = tests/test_cmd_info.c
tests_test_cmd_info_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_cmd_info_LDADD = $(TEST_LDADD)
TESTS += tests/test_cmd_info
# src/sfi_cli.c: the refused-option message, through the sfi-ref commands.
check_PROGRAMS += tests/test_cli
tests_test_cli_SOURCES = tests/test_cli.c
tests_test_cli_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_cli_LDADD = $(TEST_LDADD)
TESTS += tests/test_cli
# src/sfi_io.c: whole-file reads and the output rule, also through sfi-sim.
check_PROGRAMS += tests/test_io
tests_test_io_SOURCES = tests/test_io.c
tests_test_io_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_io_LDADD = $(TEST_LDADD)
TESTS += tests/test_io
# src/sfi_progress.c: silent off a terminal, drawn and erased on one.
check_PROGRAMS += tests/test_progress
tests_test_progress_SOURCES = tests/test_progress.c
tests_test_progress_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_progress_LDADD = $(TEST_LDADD)
TESTS += tests/test_progress
