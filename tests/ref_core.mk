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
check_PROGRAMS += tests/test_selector
tests_test_selector_SOURCES = tests/test_selector.c
tests_test_selector_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_selector_LDADD = $(TEST_LDADD) -lm
TESTS += tests/test_selector
check_PROGRAMS += tests/test_state
tests_test_state_SOURCES = tests/test_state.c
tests_test_state_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_state_LDADD = $(TEST_LDADD)
TESTS += tests/test_state
# Golden digests of the seeded suite in ref/sfi_golden.c; regenerate with
# `./sfi-ref digest --suite > tests/golden/ref_core.sha256` only when an
# output is meant to change, and say why in the commit.
check_PROGRAMS += tests/test_ref_digest
tests_test_ref_digest_SOURCES = tests/test_ref_digest.c
tests_test_ref_digest_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_ref_digest_LDADD = $(TEST_LDADD)
TESTS += tests/test_ref_digest
DIGEST_TESTS += tests/test_ref_digest
EXTRA_DIST += tests/golden/ref_core.sha256
# `make bench`: Selector 8 KV heads x 32K x K=2048, dense attention at 32K.
EXTRA_PROGRAMS += tests/bench_ref
SFI_BENCHES += tests/bench_ref
tests_bench_ref_SOURCES = tests/bench_ref.c
tests_bench_ref_LDADD = libsfi.la $(SFI_DEP_LIBS)
CLEANFILES += tests/bench_ref
