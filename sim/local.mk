# sfi-sim: cost model, replay, sweeps, reports (libsfisim) and its main.
noinst_LTLIBRARIES = libsfisim.la
libsfisim_la_SOURCES = sim/sfi_sim_cli.h sim/sfi_hw.h sim/sfi_hw.c sim/sfi_cost.h sim/sfi_cost.c \
	sim/sfi_replay.h sim/sfi_replay.c sim/sfi_sim_util.h sim/sfi_sim_util.c \
	sim/sfi_sim_stream.h sim/sfi_sim_stream.c sim/sfi_stepval.h sim/sfi_stepval.c sim/sfi_serve.h sim/sfi_serve.c \
	sim/cmd_sweep.c sim/cmd_serve.c sim/cmd_trace.c sim/cmd_analyze.c sim/cmd_presets.c sim/cmd_validate.c
bin_PROGRAMS += sfi-sim
sfi_sim_SOURCES = sim/main.c
sfi_sim_LDADD = libsfisim.la libsfi.la $(SFI_DEP_LIBS) -lm
# Where the default run looks for the bundled sample traces and tokenizer:
# the source tree (uninstalled use, make demo) and the installed data dir.
libsfisim_la_CPPFLAGS = $(AM_CPPFLAGS) -DSFI_SIM_SRCDIR='"$(abs_top_srcdir)"' \
	-DSFI_SIM_PKGDATADIR='"$(pkgdatadir)"'
# The documented default calibration profile and the named engine profiles
# (sfi-sim serve --engine NAME), installed next to the data; the B200 as
# vLLM sees it (192.3 GB).
simprofilesdir = $(pkgdatadir)/profiles
dist_simprofiles_DATA = sim/profiles/default.json sim/profiles/vllm-triton-b200.json \
	sim/profiles/b200-192g.json sim/profiles/h100-steps-fit.json
EXTRA_DIST += sim/profiles/VALIDATION.md sim/profiles/fit_vllm_triton_b200.py \
	sim/profiles/h100-steps-fit-4acad2e.json
