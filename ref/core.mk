# Build fragment: ref/core.mk (included by Makefile.am)
# The reference core (method.md sections 2-4 and 6): deterministic math,
# attention, Selector, managed state and trigger policies; plus the SHA-256
# digests every golden test and the run digest use.
libsfi_la_SOURCES += src/sfi_digest.c
pkginclude_HEADERS += src/sfi_digest.h
