# Build fragment: sim/analyze.mk (included by Makefile.am)
