# Build fragment: traces/local.mk (included by Makefile.am)
