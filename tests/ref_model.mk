# Build fragment: tests/ref_model.mk (included by Makefile.am)
