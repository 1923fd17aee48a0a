# Fuzzing (issue 9). Harnesses in tests/fuzz/fuzz_NAME.c define
# LLVMFuzzerTestOneInput for one parser each.
#  * `make fuzz` builds them with clang -fsanitize=fuzzer,address,undefined
#    and runs each for FUZZ_SECONDS (tests/fuzz/run-fuzz.sh).
#  * `make check` replays every seed (tests/fuzz/corpus/NAME/) and every
#    regression input (tests/fuzz/regressions/NAME/) through the same entry
#    point, built with the ordinary compiler and tests/fuzz/replay_main.c.
FUZZ_HARNESSES = config params
FUZZ_SECONDS = 60
FUZZ_CC = clang

check_PROGRAMS += tests/fuzz/replay_config tests/fuzz/replay_params
tests_fuzz_replay_config_SOURCES = tests/fuzz/fuzz_config.c tests/fuzz/replay_main.c
tests_fuzz_replay_config_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"config"'
tests_fuzz_replay_config_LDADD = $(TEST_LDADD)
tests_fuzz_replay_params_SOURCES = tests/fuzz/fuzz_params.c tests/fuzz/replay_main.c
tests_fuzz_replay_params_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"params"'
tests_fuzz_replay_params_LDADD = $(TEST_LDADD)
TESTS += tests/fuzz/replay_config tests/fuzz/replay_params

EXTRA_DIST += tests/fuzz/README.md tests/fuzz/run-fuzz.sh tests/fuzz/corpus \
	tests/fuzz/regressions tests/fuzz/config.dict tests/fuzz/params.dict

fuzz: $(BUILT_SOURCES)
	FUZZ_CC='$(FUZZ_CC)' \
	FUZZ_CPPFLAGS='$(DEFS) -I$(abs_top_builddir) -I$(abs_top_srcdir) $(AM_CPPFLAGS) $(CPPFLAGS)' \
	FUZZ_LIBS='$(SFI_DEP_LIBS) -lm' \
	FUZZ_SOURCES='$(libsfi_la_SOURCES) $(nodist_libsfi_la_SOURCES)' \
	$(SHELL) $(srcdir)/tests/fuzz/run-fuzz.sh '$(abs_top_srcdir)' '$(abs_top_builddir)' \
	  '$(FUZZ_SECONDS)' $(FUZZ_HARNESSES)
.PHONY: fuzz

clean-local: clean-fuzz
clean-fuzz:
	rm -rf tests/fuzz/out
.PHONY: clean-fuzz
