/* libsfi, the whole public API in one include: `#include <sfi.h>` with the
 * flags of `pkg-config --cflags sfi`. Every header that `make install` puts
 * in $(includedir)/sfi is listed here (tests/test_pkgconfig.sh fails on one
 * that is not); the test programs' helpers (tests/sfi_test_util.h,
 * tests/sfi_hf_fixture.h) and the library's private headers (NFC tables,
 * pre-tokenizer classes, built-in presets) are not installed. */
#ifndef SFI_H
#define SFI_H

/* src/: errors, files, small shared helpers, parameters, models. */
#include "sfi_error.h"
#include "sfi_io.h"
#include "sfi_clock.h"
#include "sfi_parse.h"
#include "sfi_rng.h"
#include "sfi_sort.h"
#include "sfi_progress.h"
#include "sfi_params.h"
#include "sfi_model.h"
#include "sfi_digest.h"
#include "sfi_vocab.h"
#include "sfi_tokenizer.h"
#include "sfi_trace.h"
#include "sfi_plot.h"

/* ref/: the bit-exact reference (core, model, policies, recorder). */
#include "sfi_math.h"
#include "sfi_attention.h"
#include "sfi_selector.h"
#include "sfi_state.h"
#include "sfi_golden.h"
#include "sfi_safetensors.h"
#include "sfi_qwen3.h"
#include "sfi_decode.h"
#include "sfi_eval.h"
#include "sfi_policies.h"
#include "sfi_policy_calib.h"
#include "sfi_recorder.h"

#endif
