# Build fragment: src/sim_support.mk (included by Makefile.am)
