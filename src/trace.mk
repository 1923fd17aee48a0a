# Build fragment: src/trace.mk (included by Makefile.am)
# Decode traces in SQLite: writer, reader, validation (sfi-trace(5)).
pkginclude_HEADERS += src/sfi_trace.h
libsfi_la_SOURCES += src/sfi_trace.c
# The sfi-ref run trace recorder (a decode observer), kept with the trace
# code it drives.
libsfi_la_SOURCES += ref/sfi_recorder.c
pkginclude_HEADERS += ref/sfi_recorder.h
