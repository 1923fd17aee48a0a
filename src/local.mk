# libsfi, shared layer: errors, parameters, model description, vocabulary.
libsfi_la_SOURCES += src/sfi_error.c
pkginclude_HEADERS += src/sfi_error.h
libsfi_la_SOURCES += src/sfi_params.c
pkginclude_HEADERS += src/sfi_params.h
