# libsfi, shared layer: errors, parameters, model description, vocabulary.
# src/sfi.h includes every installed header (the umbrella of sfi.pc).
pkginclude_HEADERS += src/sfi.h
libsfi_la_SOURCES += src/sfi_error.c
pkginclude_HEADERS += src/sfi_error.h
libsfi_la_SOURCES += src/sfi_io.c
pkginclude_HEADERS += src/sfi_io.h
libsfi_la_SOURCES += src/sfi_clock.c src/sfi_parse.c src/sfi_rng.c src/sfi_sort.c
pkginclude_HEADERS += src/sfi_clock.h src/sfi_parse.h src/sfi_rng.h src/sfi_sort.h
# The commands' message for a refused option: for the sfi programs, not installed.
libsfi_la_SOURCES += src/sfi_cli.c
noinst_HEADERS += src/sfi_cli.h
libsfi_la_SOURCES += src/sfi_progress.c
pkginclude_HEADERS += src/sfi_progress.h
libsfi_la_SOURCES += src/sfi_params.c
pkginclude_HEADERS += src/sfi_params.h
libsfi_la_SOURCES += src/sfi_model.c src/sfi_presets.h
pkginclude_HEADERS += src/sfi_model.h

# Built-in model presets: the config.json files under src/presets/ compiled
# into libsfi as strings, so that no binary needs ../shared at run time. The
# generated file lives in the build tree (VPATH, distcheck).
SFI_PRESET_JSON = src/presets/Qwen3-0.6B.json src/presets/Qwen3-1.7B.json \
	src/presets/Qwen3-4B.json src/presets/Qwen3-4B-Instruct-2507.json \
	src/presets/Qwen3-8B.json src/presets/Qwen3-14B.json \
	src/presets/Qwen3-32B.json src/presets/Qwen3-30B-A3B.json \
	src/presets/Qwen3-235B-A22B.json
nodist_libsfi_la_SOURCES = src/sfi_presets.c
BUILT_SOURCES += src/sfi_presets.c
CLEANFILES += src/sfi_presets.c
EXTRA_DIST += $(SFI_PRESET_JSON) src/presets/LICENSE src/presets/README.md \
	src/presets/gen-presets.sh
src/sfi_presets.c: $(SFI_PRESET_JSON) src/presets/gen-presets.sh
	$(AM_V_GEN)$(MKDIR_P) src && \
	(cd $(srcdir) && $(SHELL) src/presets/gen-presets.sh $(SFI_PRESET_JSON)) > $@-t && \
	mv -f $@-t $@
# Man page of `sfi-ref info` (ref/cmd_info.c; the model description's CLI).
