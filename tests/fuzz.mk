# Build fragment: tests/fuzz.mk (included by Makefile.am)
