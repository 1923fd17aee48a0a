# Build fragment: gpu/local.mk (included by Makefile.am)
# The CUDA path: sfi-gpu (checker + benchmarks) built from C host code and
# CUDA kernels. Built only when configure found nvcc (HAVE_CUDA); on a
# machine without a GPU it still compiles and links, and `sfi-gpu check`
# exits 77 ("no CUDA device").

SFI_GPU_CU = gpu/sfi_gpu_attn.cu gpu/sfi_gpu_select.cu gpu/sfi_gpu_sched.cu gpu/sfi_gpu_model.cu \
	gpu/sfi_gpu_tp.cu
SFI_GPU_HDRS = gpu/sfi_gpu.h gpu/sfi_gpu_cli.h gpu/sfi_gpu_math.cuh gpu/sfi_gpu_model.h \
	gpu/sfi_gpu_prefill.cuh gpu/sfi_gpu_tma.cuh gpu/sfi_gpu_engine.h gpu/sfi_gpu_status.h \
	gpu/sfi_gpu_nccl.h gpu/sfi_gpu_tp.h
EXTRA_DIST += $(SFI_GPU_CU) $(SFI_GPU_HDRS) gpu/bench_torch.py gpu/calibrate_profile.py \
	gpu/profiles/h100.json gpu/profiles/h100-bench.txt gpu/profiles/h100-e2e.json gpu/bench_e2e_torch.py \
	gpu/bench_e2e_matrix.py gpu/profiles/h100-steps.json gpu/profiles/h200-steps.json gpu/tp_device.sh \
	gpu/profiles/h200-tp-steps.json

if HAVE_CUDA
bin_PROGRAMS += sfi-gpu
sfi_gpu_SOURCES = gpu/main.c gpu/cmd_check.c gpu/cmd_bench.c gpu/cmd_run.c gpu/sfi_gpu_engine.c \
	gpu/cmd_allreduce.c \
	gpu/sfi_gpu_verify.c gpu/sfi_gpu_verify.h gpu/sfi_gpu_nccl.c gpu/sfi_gpu_tprun.c \
	gpu/sfi_gpu_tprun.h gpu/sfi_gpu_moe.c gpu/sfi_gpu_moe.h $(SFI_GPU_HDRS)
# The .cu objects are built by the suffix rule below and linked as plain
# objects (automake does not know CUDA as a language).
SFI_GPU_CU_OBJS = $(SFI_GPU_CU:.cu=.o)
# NCCL_CPPFLAGS: nccl.h (configure's --with-nccl; empty without NCCL). The
# library itself is opened at run time (gpu/sfi_gpu_nccl.h says why), so
# nothing NCCL is linked.
sfi_gpu_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/gpu -I$(CUDA_HOME_DIR)/include $(NCCL_CPPFLAGS)
# Static CUDA runtime (nvcc's own default) and static libsfi: the binary
# then runs on a GPU machine that has the driver but none of our build's
# shared libraries (the device runs carry just this file).
# cuBLAS has no static library in the toolkit here: it is linked as a
# shared library, found through the toolkit's lib64 (rpath) or
# LD_LIBRARY_PATH on the GPU machine.
sfi_gpu_LDADD = $(SFI_GPU_CU_OBJS) libsfi.la -L$(CUDA_HOME_DIR)/lib64 -lcublas -lcudart_static \
	-ldl -lrt -lpthread -lstdc++ -lm
sfi_gpu_LDFLAGS = $(AM_LDFLAGS) -static-libtool-libs -Wl,-rpath,$(CUDA_HOME_DIR)/lib64
sfi_gpu_DEPENDENCIES = $(SFI_GPU_CU_OBJS) libsfi.la
CLEANFILES += $(SFI_GPU_CU_OBJS)

# sm_90 machine code (H100/H200) plus compute_90 PTX so newer GPUs can JIT
# it. nvcc's own warnings are errors; the host compiler sees -Wall -Wextra.
SFI_NVCCFLAGS = -std=c++17 -O3 -lineinfo \
	-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
	-Werror all-warnings -Xcompiler -Wall,-Wextra \
	-I$(top_srcdir)/gpu -I$(top_builddir)

SUFFIXES = .cu
.cu.o:
	$(AM_V_GEN)$(NVCC) $(SFI_NVCCFLAGS) $(NVCCFLAGS) -c -o $@ $<

$(SFI_GPU_CU_OBJS): $(SFI_GPU_HDRS)
endif

