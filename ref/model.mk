# Build fragment: ref/model.mk (included by Makefile.am)
