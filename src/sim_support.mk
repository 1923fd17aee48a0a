# Build fragment: src/sim_support.mk (included by Makefile.am)
# PNG plots through cairo (sfi-sim and the analyzer draw with it).
libsfi_la_SOURCES += src/sfi_plot.c
pkginclude_HEADERS += src/sfi_plot.h
libsfi_la_LIBADD += -lm
