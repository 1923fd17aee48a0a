# Build fragment: tests/gpu.mk (included by Makefile.am)
# The GPU checker as a test: runs `sfi-gpu check --quick` where a CUDA
# device exists; prints "SKIP: no CUDA device" and exits 77 where none does
# (and "SKIP: ..." when configured without CUDA).
TESTS += tests/test_gpu.sh
EXTRA_DIST += tests/test_gpu.sh
