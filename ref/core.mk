# Build fragment: ref/core.mk (included by Makefile.am)
# The reference core (sfi(7): MANAGED STATE, TRIGGERS, SELECTOR and
# BIT-EXACT REFERENCE): deterministic math, attention, Selector, managed
# state and trigger policies; plus the SHA-256 digests every golden test and
# the run digest use.
libsfi_la_SOURCES += src/sfi_digest.c
pkginclude_HEADERS += src/sfi_digest.h
libsfi_la_SOURCES += ref/sfi_math.c ref/sfi_attention.c
pkginclude_HEADERS += ref/sfi_math.h ref/sfi_attention.h
libsfi_la_SOURCES += ref/sfi_selector.c
pkginclude_HEADERS += ref/sfi_selector.h
libsfi_la_SOURCES += ref/sfi_state.c
pkginclude_HEADERS += ref/sfi_state.h
# The golden-digest suite (tests/test_ref_digest, `sfi-ref digest --suite`).
libsfi_la_SOURCES += ref/sfi_golden.c
pkginclude_HEADERS += ref/sfi_golden.h
