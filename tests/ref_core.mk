# Build fragment: tests/ref_core.mk (included by Makefile.am)
