# Build fragment: traces/local.mk (included by Makefile.am)
# tokenize_corpus: text files -> tokens-level traces (traces/README.md).
noinst_PROGRAMS += traces/tokenize_corpus
traces_tokenize_corpus_SOURCES = traces/tokenize_corpus.c
traces_tokenize_corpus_LDADD = libsfi.la $(SFI_DEP_LIBS)
EXTRA_DIST += traces/README.md traces/record_hf.py traces/hf_gpu_check.sh
EXTRA_DIST += traces/kjv-8k.db traces/kjv-32k.db traces/kjv-128k.db traces/licenses-8k.db
EXTRA_DIST += traces/full/sfi-small-qwen3-8k.db traces/full/sfi-small-qwen3-8k-hf.db
EXTRA_DIST += traces/text/kjv-genesis.txt traces/eval/sfi-small-qwen3-kjv-genesis.png \
	traces/eval/sfi-small-qwen3-kjv-genesis.json traces/eval/sfi-small-qwen3-kjv-genesis-calib.json
EXTRA_DIST += traces/full/sfi-small-qwen3-2k-qk.db
# Kascade/FASA calibration: the text and its calibration of the small model.
EXTRA_DIST += traces/calib/perl-test-tutorial.pod traces/calib/sfi-small-qwen3.json
# record_hf.py is installed as sfi-record-hf (man sfi-record-hf): the way to
# record a user's own Hugging Face model; it needs torch and transformers.
bin_SCRIPTS += sfi-record-hf
CLEANFILES += sfi-record-hf
sfi-record-hf: $(top_srcdir)/traces/record_hf.py
	$(AM_V_GEN)cp $(top_srcdir)/traces/record_hf.py $@ && chmod +x $@
