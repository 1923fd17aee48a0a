# Build fragment: gpu/local.mk (included by Makefile.am)
