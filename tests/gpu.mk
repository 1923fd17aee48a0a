# Build fragment: tests/gpu.mk (included by Makefile.am)
# The GPU checker as a test: runs `sfi-gpu check --quick` where a CUDA
# device exists; prints "SKIP: no CUDA device" and exits 77 where none does
# (and "SKIP: ..." when configured without CUDA).
TESTS += tests/test_gpu.sh tests/test_gpu_tp.sh
EXTRA_DIST += tests/test_gpu.sh tests/test_gpu_tp.sh tests/fixtures/tp tests/fixtures/gqa

# The engine's check against the reference (gpu/sfi_gpu_verify.c, plain C)
# on the CPU, with a stand-in engine: built and run everywhere.
check_PROGRAMS += tests/test_gpu_verify
tests_test_gpu_verify_SOURCES = tests/test_gpu_verify.c gpu/sfi_gpu_verify.c
tests_test_gpu_verify_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/gpu
tests_test_gpu_verify_LDADD = $(TEST_LDADD) -lpthread
TESTS += tests/test_gpu_verify
