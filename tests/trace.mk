# Build fragment: tests/trace.mk (included by Makefile.am)
check_PROGRAMS += tests/test_trace
tests_test_trace_SOURCES = tests/test_trace.c
tests_test_trace_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_trace_LDADD = $(TEST_LDADD)
TESTS += tests/test_trace
EXTRA_PROGRAMS += tests/bench_trace
SFI_BENCHES += tests/bench_trace
tests_bench_trace_SOURCES = tests/bench_trace.c
tests_bench_trace_CPPFLAGS = $(TEST_CPPFLAGS)
tests_bench_trace_LDADD = $(TEST_LDADD)
check_PROGRAMS += tests/test_trace_cli
tests_test_trace_cli_SOURCES = tests/test_trace_cli.c
tests_test_trace_cli_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_trace_cli_LDADD = $(TEST_LDADD)
TESTS += tests/test_trace_cli
