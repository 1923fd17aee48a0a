# Build fragment: tests/analyze.mk (included by Makefile.am)
