# Build fragment: tests/sim.mk (included by Makefile.am)
# Tests of the simulator's modules link libsfisim (noinst) before libsfi.
SIM_TEST_LDADD = libsfisim.la $(TEST_LDADD) -lm

check_PROGRAMS += tests/test_hw
tests_test_hw_SOURCES = tests/test_hw.c
tests_test_hw_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_hw_LDADD = $(SIM_TEST_LDADD)
TESTS += tests/test_hw

check_PROGRAMS += tests/test_stepval
tests_test_stepval_SOURCES = tests/test_stepval.c
tests_test_stepval_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_stepval_LDADD = $(SIM_TEST_LDADD)
TESTS += tests/test_stepval

check_PROGRAMS += tests/test_cost
tests_test_cost_SOURCES = tests/test_cost.c
tests_test_cost_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_cost_LDADD = $(SIM_TEST_LDADD)
TESTS += tests/test_cost

check_PROGRAMS += tests/test_replay
tests_test_replay_SOURCES = tests/test_replay.c
tests_test_replay_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_replay_LDADD = $(SIM_TEST_LDADD)
TESTS += tests/test_replay

check_PROGRAMS += tests/test_sweep
tests_test_sweep_SOURCES = tests/test_sweep.c
tests_test_sweep_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_sweep_LDADD = $(TEST_LDADD)
TESTS += tests/test_sweep

# make bench: replay speed and the default sweep's wall time.
EXTRA_PROGRAMS += tests/bench_sim
SFI_BENCHES += tests/bench_sim
tests_bench_sim_SOURCES = tests/bench_sim.c
tests_bench_sim_CPPFLAGS = $(TEST_CPPFLAGS)
tests_bench_sim_LDADD = $(SIM_TEST_LDADD)

check_PROGRAMS += tests/test_sweep_plot
tests_test_sweep_plot_SOURCES = tests/test_sweep_plot.c
tests_test_sweep_plot_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_sweep_plot_LDADD = $(TEST_LDADD) -lm
TESTS += tests/test_sweep_plot

check_PROGRAMS += tests/test_serve
tests_test_serve_SOURCES = tests/test_serve.c
tests_test_serve_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_serve_LDADD = $(SIM_TEST_LDADD)
TESTS += tests/test_serve

check_PROGRAMS += tests/test_serve_cli
tests_test_serve_cli_SOURCES = tests/test_serve_cli.c
tests_test_serve_cli_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_serve_cli_LDADD = $(TEST_LDADD) -lm
TESTS += tests/test_serve_cli
