# Build fragment: sim/analyze.mk (included by Makefile.am)
# The trace analyzer (sfi-sim analyze): engine, trace source, synthetic
# source (benchmark, tests), reports and pictures. Worker threads use
# pthreads.
libsfisim_la_SOURCES += sim/sfi_analyze.h sim/sfi_analyze.c \
	sim/sfi_analyze_synth.h sim/sfi_analyze_synth.c \
	sim/sfi_analyze_trace.h sim/sfi_analyze_trace.c \
	sim/sfi_analyze_report.h sim/sfi_analyze_report.c
sfi_sim_LDADD += -lpthread -lm
