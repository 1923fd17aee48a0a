# Build fragment: src/sim_support.mk (included by Makefile.am)
# PNG plots through cairo (sfi-sim and the analyzer draw with it).
libsfi_la_SOURCES += src/sfi_plot.c
pkginclude_HEADERS += src/sfi_plot.h
# fontconfig (a dependency of cairo; libcairo2-dev pulls libfontconfig-dev)
# for sfi_plot_release_fonts.
libsfi_la_LIBADD += -lfontconfig -lm
