# Build fragment: ref/policies.mk (included by Makefile.am)
# Comparison policies of sfi(7) PEER METHODS (oracle, full KV, StreamingLLM,
# H2O, SnapKV, Quest, LFPS, Kascade, FASA, SFI) for the trace analyzer.
libsfi_la_SOURCES += ref/sfi_policies.c
pkginclude_HEADERS += ref/sfi_policies.h
