# sfi-ref: the reference's command-line program. The oracle's modules live
# in libsfi (see ref/core.mk, ref/model.mk, ref/policies.mk).
bin_PROGRAMS += sfi-ref
sfi_ref_SOURCES = ref/main.c ref/sfi_ref_cli.h \
	ref/cmd_trigger_set.c ref/cmd_run.c ref/cmd_encode.c ref/cmd_decode.c \
	ref/cmd_info.c ref/cmd_digest.c ref/cmd_make_checkpoint.c \
	ref/cmd_tokenizer_common.c ref/cmd_eval.c ref/cmd_calibrate.c
sfi_ref_LDADD = libsfi.la $(SFI_DEP_LIBS)
