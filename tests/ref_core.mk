# Build fragment: tests/ref_core.mk (included by Makefile.am)
# Check suites of the reference core (ref/sfi_math, attention, selector,
# state) and its golden digests.
check_PROGRAMS += tests/test_math
tests_test_math_SOURCES = tests/test_math.c
tests_test_math_CPPFLAGS = $(TEST_CPPFLAGS)
# libm only as the accuracy yardstick; ref/ itself never calls it.
tests_test_math_LDADD = $(TEST_LDADD) -lm
TESTS += tests/test_math
check_PROGRAMS += tests/test_attention
tests_test_attention_SOURCES = tests/test_attention.c
tests_test_attention_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_attention_LDADD = $(TEST_LDADD) -lm
TESTS += tests/test_attention
