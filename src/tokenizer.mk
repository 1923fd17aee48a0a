# Build fragment: src/tokenizer.mk (included by Makefile.am)
