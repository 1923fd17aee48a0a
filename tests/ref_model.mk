# Build fragment: tests/ref_model.mk (included by Makefile.am)
# Check suites of the reference's model layer (safetensors, Qwen3, decode).
check_PROGRAMS += tests/test_safetensors
tests_test_safetensors_SOURCES = tests/test_safetensors.c
tests_test_safetensors_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_safetensors_LDADD = $(TEST_LDADD)
TESTS += tests/test_safetensors
noinst_HEADERS += tests/sfi_hf_fixture.h
check_PROGRAMS += tests/test_qwen3 tests/test_qwen3_blas tests/test_qwen3_real
tests_test_qwen3_SOURCES = tests/test_qwen3.c
tests_test_qwen3_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_qwen3_LDADD = $(TEST_LDADD)
tests_test_qwen3_blas_SOURCES = tests/test_qwen3_blas.c
tests_test_qwen3_blas_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_qwen3_blas_LDADD = $(TEST_LDADD)
tests_test_qwen3_real_SOURCES = tests/test_qwen3_real.c
tests_test_qwen3_real_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_qwen3_real_LDADD = $(TEST_LDADD)
TESTS += tests/test_qwen3 tests/test_qwen3_blas tests/test_qwen3_real
EXTRA_DIST += tests/make_hf_fixtures.py tests/fixtures/hf
check_PROGRAMS += tests/test_decode
tests_test_decode_SOURCES = tests/test_decode.c
tests_test_decode_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_decode_LDADD = $(TEST_LDADD)
TESTS += tests/test_decode
DIGEST_TESTS += tests/test_decode
