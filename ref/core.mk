# Build fragment: ref/core.mk (included by Makefile.am)
