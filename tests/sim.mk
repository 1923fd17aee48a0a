# Build fragment: tests/sim.mk (included by Makefile.am)
# Tests of the simulator's modules link libsfisim (noinst) before libsfi.
SIM_TEST_LDADD = libsfisim.la $(TEST_LDADD)

check_PROGRAMS += tests/test_hw
tests_test_hw_SOURCES = tests/test_hw.c
tests_test_hw_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_hw_LDADD = $(SIM_TEST_LDADD)
TESTS += tests/test_hw

check_PROGRAMS += tests/test_cost
tests_test_cost_SOURCES = tests/test_cost.c
tests_test_cost_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_cost_LDADD = $(SIM_TEST_LDADD)
TESTS += tests/test_cost
