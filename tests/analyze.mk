# Build fragment: tests/analyze.mk (included by Makefile.am)
# Comparison policies on hand-made steps with known answers.
check_PROGRAMS += tests/test_policies
tests_test_policies_SOURCES = tests/test_policies.c
tests_test_policies_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_policies_LDADD = $(TEST_LDADD)
TESTS += tests/test_policies

# The analyzer engine on in-memory traces, and sfi-sim analyze end to end.
check_PROGRAMS += tests/test_analyze
tests_test_analyze_SOURCES = tests/test_analyze.c
tests_test_analyze_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_analyze_LDADD = libsfisim.la $(TEST_LDADD) -lpthread -lm
TESTS += tests/test_analyze

# Benchmark (make bench): 2,000 steps x 32K x 28 layers x 8 KV heads.
EXTRA_PROGRAMS += tests/bench_analyze
SFI_BENCHES += tests/bench_analyze
tests_bench_analyze_SOURCES = tests/bench_analyze.c
tests_bench_analyze_CPPFLAGS = $(TEST_CPPFLAGS)
tests_bench_analyze_LDADD = libsfisim.la $(TEST_LDADD) -lpthread -lm

# The peers on real queries and keys end to end: sfi-ref calibrate, sfi-ref
# run --trace-qk --trace-calib, the analyzer on the trace.
check_PROGRAMS += tests/test_policy_trace
tests_test_policy_trace_SOURCES = tests/test_policy_trace.c
tests_test_policy_trace_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_policy_trace_LDADD = libsfisim.la $(TEST_LDADD) -lpthread -lm
TESTS += tests/test_policy_trace
