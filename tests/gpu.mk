# Build fragment: tests/gpu.mk (included by Makefile.am)
