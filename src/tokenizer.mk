# Build fragment: src/tokenizer.mk (included by Makefile.am)
# Tokenizer: vocabulary + trigger set (sfi_vocab), byte-level BPE encode and
# decode (sfi_tokenizer).
libsfi_la_SOURCES += src/sfi_vocab.c src/sfi_tokenizer.c src/sfi_nfc.c
pkginclude_HEADERS += src/sfi_vocab.h src/sfi_tokenizer.h
noinst_HEADERS += src/sfi_nfc.h src/sfi_nfc_tables.h src/sfi_pretok_classes.h
EXTRA_DIST += src/gen_nfc_tables.py src/gen_pretok_classes.py

check_PROGRAMS += tests/test_vocab
tests_test_vocab_SOURCES = tests/test_vocab.c
tests_test_vocab_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_vocab_LDADD = $(TEST_LDADD)
TESTS += tests/test_vocab

check_PROGRAMS += tests/test_tokenizer
tests_test_tokenizer_SOURCES = tests/test_tokenizer.c
tests_test_tokenizer_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_tokenizer_LDADD = $(TEST_LDADD)
TESTS += tests/test_tokenizer

# The same files under ../shared (exits 77 without it).
check_PROGRAMS += tests/test_vocab_shared
tests_test_vocab_shared_SOURCES = tests/test_vocab_shared.c
tests_test_vocab_shared_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_vocab_shared_LDADD = $(TEST_LDADD)
TESTS += tests/test_vocab_shared

EXTRA_DIST += tests/fixtures/qwen3-tokenizer/vocab.json \
	tests/fixtures/qwen3-tokenizer/merges.txt \
	tests/fixtures/qwen3-tokenizer/tokenizer_config.json \
	tests/fixtures/qwen3-tokenizer/LICENSE
EXTRA_DIST += tests/fixtures/sfi-small-qwen3-tokenizer/vocab.json \
	tests/fixtures/sfi-small-qwen3-tokenizer/merges.txt \
	tests/fixtures/sfi-small-qwen3-tokenizer/tokenizer_config.json \
	tests/fixtures/tokenizer-conformance.json \
	tests/make_tokenizer_fixtures.py

# make bench: load time and encode/decode MB/s.
EXTRA_PROGRAMS += tests/bench_tokenizer
tests_bench_tokenizer_SOURCES = tests/bench_tokenizer.c
tests_bench_tokenizer_CPPFLAGS = $(TEST_CPPFLAGS)
tests_bench_tokenizer_LDADD = $(TEST_LDADD)
SFI_BENCHES += tests/bench_tokenizer
CLEANFILES += tests/bench_tokenizer
