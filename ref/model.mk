# Build fragment: ref/model.mk (included by Makefile.am)
# The reference's model layer: safetensors checkpoints, the Qwen3 forward
# pass (scalar + OpenBLAS backends) and the decode loop of sfi(7) DECODE LOOP.
pkginclude_HEADERS += ref/sfi_safetensors.h ref/sfi_qwen3.h ref/sfi_decode.h
libsfi_la_SOURCES += ref/sfi_safetensors.c ref/sfi_qwen3.c ref/sfi_decode.c
# sfi-ref eval's harness: every policy at equal budget inside the forward pass.
pkginclude_HEADERS += ref/sfi_eval.h
libsfi_la_SOURCES += ref/sfi_eval.c
libsfi_la_LIBADD += -lpthread
