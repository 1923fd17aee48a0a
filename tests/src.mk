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
