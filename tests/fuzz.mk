# Fuzzing (issue 9). Harnesses in tests/fuzz/fuzz_NAME.c define
# LLVMFuzzerTestOneInput for one parser each.
#  * `make fuzz` builds them with clang -fsanitize=fuzzer,address,undefined
#    and runs each for FUZZ_SECONDS (tests/fuzz/run-fuzz.sh).
#  * `make check` replays every seed (tests/fuzz/corpus/NAME/) and every
#    regression input (tests/fuzz/regressions/NAME/) through the same entry
#    point, built with the ordinary compiler and tests/fuzz/replay_main.c.
FUZZ_HARNESSES = config params tokenizer safetensors trace hw names
FUZZ_SECONDS = 60
FUZZ_CC = clang

FUZZ_REPLAYS = tests/fuzz/replay_config tests/fuzz/replay_params \
	tests/fuzz/replay_tokenizer tests/fuzz/replay_safetensors \
	tests/fuzz/replay_trace tests/fuzz/replay_hw tests/fuzz/replay_names
check_PROGRAMS += $(FUZZ_REPLAYS)
TESTS += $(FUZZ_REPLAYS)
tests_fuzz_replay_config_SOURCES = tests/fuzz/fuzz_config.c tests/fuzz/replay_main.c
tests_fuzz_replay_config_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"config"'
tests_fuzz_replay_config_LDADD = $(TEST_LDADD)
tests_fuzz_replay_params_SOURCES = tests/fuzz/fuzz_params.c tests/fuzz/replay_main.c
tests_fuzz_replay_params_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"params"'
tests_fuzz_replay_params_LDADD = $(TEST_LDADD)
tests_fuzz_replay_tokenizer_SOURCES = tests/fuzz/fuzz_tokenizer.c tests/fuzz/replay_main.c \
	tests/fuzz/fuzz_util.h
tests_fuzz_replay_tokenizer_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"tokenizer"'
tests_fuzz_replay_tokenizer_LDADD = $(TEST_LDADD)
tests_fuzz_replay_safetensors_SOURCES = tests/fuzz/fuzz_safetensors.c tests/fuzz/replay_main.c \
	tests/fuzz/fuzz_util.h
tests_fuzz_replay_safetensors_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"safetensors"'
tests_fuzz_replay_safetensors_LDADD = $(TEST_LDADD)
tests_fuzz_replay_trace_SOURCES = tests/fuzz/fuzz_trace.c tests/fuzz/replay_main.c \
	tests/fuzz/fuzz_util.h
tests_fuzz_replay_trace_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"trace"'
# The analyzer (libsfisim) must refuse what trace check refuses.
tests_fuzz_replay_trace_LDADD = libsfisim.la $(TEST_LDADD)
tests_fuzz_replay_hw_SOURCES = tests/fuzz/fuzz_hw.c tests/fuzz/replay_main.c
tests_fuzz_replay_hw_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"hw"'
# The hardware files are parsed in sfi-sim's library.
tests_fuzz_replay_hw_LDADD = libsfisim.la $(TEST_LDADD)
tests_fuzz_replay_names_SOURCES = tests/fuzz/fuzz_names.c tests/fuzz/replay_main.c
tests_fuzz_replay_names_CPPFLAGS = $(TEST_CPPFLAGS) -DSFI_FUZZ_NAME='"names"'
tests_fuzz_replay_names_LDADD = libsfisim.la $(TEST_LDADD)

EXTRA_DIST += tests/fuzz/README.md tests/fuzz/run-fuzz.sh tests/fuzz/corpus \
	tests/fuzz/regressions tests/fuzz/config.dict tests/fuzz/params.dict \
	tests/fuzz/tokenizer.dict tests/fuzz/safetensors.dict tests/fuzz/trace.dict \
	tests/fuzz/hw.dict tests/fuzz/names.dict

fuzz: $(BUILT_SOURCES)
	FUZZ_CC='$(FUZZ_CC)' \
	FUZZ_CPPFLAGS='$(DEFS) -I$(abs_top_builddir) -I$(abs_top_srcdir) $(AM_CPPFLAGS) $(CPPFLAGS) -DSFI_SIM_SRCDIR="$(abs_top_srcdir)" -DSFI_SIM_PKGDATADIR="$(pkgdatadir)"' \
	FUZZ_LIBS='$(SFI_DEP_LIBS) -lm' \
	FUZZ_SOURCES='$(libsfi_la_SOURCES) $(nodist_libsfi_la_SOURCES) $(libsfisim_la_SOURCES)' \
	$(SHELL) $(srcdir)/tests/fuzz/run-fuzz.sh '$(abs_top_srcdir)' '$(abs_top_builddir)' \
	  '$(FUZZ_SECONDS)' $(FUZZ_HARNESSES)
.PHONY: fuzz

clean-local: clean-fuzz
clean-fuzz:
	rm -rf tests/fuzz/out
.PHONY: clean-fuzz
