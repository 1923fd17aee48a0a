# Build fragment: man/local.mk (included by Makefile.am)
# Every page is installed and distributed: the method (sfi.7), each command
# and subcommand, and the trace format. tests/test_man.sh runs their
# EXAMPLES.
dist_man_MANS += man/sfi.7 man/sfi-trace.5 \
	man/sfi-ref.1 man/sfi-ref-run.1 man/sfi-ref-info.1 man/sfi-ref-encode.1 \
	man/sfi-ref-decode.1 man/sfi-ref-trigger-set.1 man/sfi-ref-digest.1 \
	man/sfi-ref-make-checkpoint.1 man/sfi-ref-eval.1 man/sfi-ref-calibrate.1 \
	man/sfi-sim.1 man/sfi-sim-sweep.1 man/sfi-sim-presets.1 man/sfi-sim-validate.1 \
	man/sfi-sim-trace.1 man/sfi-sim-analyze.1 man/sfi-sim-serve.1 \
	man/sfi-gpu.1 man/sfi-record-hf.1
