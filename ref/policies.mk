# Build fragment: ref/policies.mk (included by Makefile.am)
