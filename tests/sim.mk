# Build fragment: tests/sim.mk (included by Makefile.am)
