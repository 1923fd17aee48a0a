# sfi-sim: cost model, replay, sweeps, reports (libsfisim) and its main.
noinst_LTLIBRARIES = libsfisim.la
libsfisim_la_SOURCES = sim/sfi_sim_cli.h sim/sfi_hw.h sim/sfi_hw.c sim/sfi_cost.h sim/sfi_cost.c \
	sim/cmd_sweep.c sim/cmd_trace.c sim/cmd_analyze.c sim/cmd_presets.c
bin_PROGRAMS += sfi-sim
sfi_sim_SOURCES = sim/main.c
sfi_sim_LDADD = libsfisim.la libsfi.la $(SFI_DEP_LIBS)
