# Build fragment: tests/trace.mk (included by Makefile.am)
