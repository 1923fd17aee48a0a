# Build fragment: ref/policies.mk (included by Makefile.am)
# Comparison policies of sfi(7) PEER METHODS (full KV, oracle, StreamingLLM,
# H2O, SnapKV, Quest, LFPS, Kascade, FASA, SFI and its trigger variants): one
# list for the analyzer, the cost model and the evaluation in the forward
# pass; the calibration of Kascade and FASA.
libsfi_la_SOURCES += ref/sfi_policies.c
pkginclude_HEADERS += ref/sfi_policies.h
libsfi_la_SOURCES += ref/sfi_policy_calib.c
pkginclude_HEADERS += ref/sfi_policy_calib.h
