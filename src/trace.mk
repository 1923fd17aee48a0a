# Build fragment: src/trace.mk (included by Makefile.am)
