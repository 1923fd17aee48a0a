# Build fragment: tests/ref_model.mk (included by Makefile.am)
# Check suites of the reference's model layer (safetensors, Qwen3, decode).
check_PROGRAMS += tests/test_safetensors
tests_test_safetensors_SOURCES = tests/test_safetensors.c
tests_test_safetensors_CPPFLAGS = $(TEST_CPPFLAGS)
tests_test_safetensors_LDADD = $(TEST_LDADD)
TESTS += tests/test_safetensors
