# Helpers every test program links (finding fixtures and ../shared, running
# the built programs).
check_LTLIBRARIES = tests/libsfitest.la
tests_libsfitest_la_SOURCES = tests/sfi_test_util.c tests/sfi_test_util.h
tests_libsfitest_la_CPPFLAGS = $(TEST_CPPFLAGS)
TEST_LDADD += tests/libsfitest.la

# The man pages: EXAMPLES run as written, groff-clean, cross references
# resolve, every page installed (tests/test_man.sh says how).
TESTS += tests/test_man.sh
EXTRA_DIST += tests/test_man.sh

# The installed libsfi, sfi.pc and <sfi.h>: a program outside the tree built
# against a DESTDIR install (tests/test_pkgconfig.sh says how).
TESTS += tests/test_pkgconfig.sh
EXTRA_DIST += tests/test_pkgconfig.sh
