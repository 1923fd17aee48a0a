/* Benchmark (make bench): sfi-ref eval's harness on the trained small model
 * with the BLAS backend: every policy at one budget, an 8K prefix
 * prefilled once and 512 teacher-forced tokens of traces/text/kjv-genesis.txt
 * (target: under 10 minutes on a 2-core machine). Prints the wall and CPU
 * time of the prefill, of full KV and of each policy, and the total.
 *
 * Needs $SFI_SHARED/models/sfi-small-qwen3 (prints SKIP without it) and
 * the OpenBLAS backend. Environment: SFI_BENCH_EVAL_PREFIX (8192),
 * SFI_BENCH_EVAL_TOKENS (512), SFI_BENCH_EVAL_BUDGET (6%),
 * SFI_BENCH_EVAL_POLICIES (sfi-ref eval's default: every peer and SFI). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sfi_eval.h"
#include "sfi_qwen3.h"
#include "sfi_test_util.h"
#include "sfi_tokenizer.h"
#include "sfi_vocab.h"

static int env_int(const char *k, int d)
{
    const char *v = getenv(k);
    return v && *v ? atoi(v) : d;
}

static const char *env_str(const char *k, const char *d)
{
    const char *v = getenv(k);
    return v && *v ? v : d;
}

int main(void)
{
    const char *p = sfi_test_shared("models/sfi-small-qwen3/model.safetensors");
    if (!p) {
        printf("SKIP: $SFI_SHARED/models/sfi-small-qwen3 is absent (set SFI_SHARED)\n");
        return 0;
    }
    if (!sfi_backend_available(SFI_BACKEND_BLAS)) {
        printf("SKIP: built without the OpenBLAS backend\n");
        return 0;
    }
    char model[4096];
    snprintf(model, sizeof model, "%s", p);
    *strrchr(model, '/') = 0;
    sfi_error e;
    sfi_error_clear(&e);
    sfi_eval_opts o;
    sfi_eval_opts_default(&o);
    o.backend = SFI_BACKEND_BLAS;
    o.n_prefix = env_int("SFI_BENCH_EVAL_PREFIX", 8192);
    o.n_tokens = env_int("SFI_BENCH_EVAL_TOKENS", 512);
    const char *pol = getenv("SFI_BENCH_EVAL_POLICIES");
    if (sfi_eval_parse_shares(env_str("SFI_BENCH_EVAL_BUDGET", "6%"), &o, &e) ||
        (pol && *pol && sfi_policy_parse_list(pol, &o.policies, &e))) {
        fprintf(stderr, "bench_eval: %s\n", e.msg);
        return 1;
    }
    o.progress = stdout;
    char text_path[4096];
    snprintf(text_path, sizeof text_path, "%s", sfi_test_src("traces/text/kjv-genesis.txt"));
    size_t len = 0;
    char *text = sfi_test_read_file(text_path, &len);
    if (!text) {
        fprintf(stderr, "bench_eval: cannot read %s\n", text_path);
        return 1;
    }
    sfi_qwen3 *m = NULL;
    sfi_tokenizer *tk = NULL;
    sfi_trigger_set ts;
    int32_t *ids = NULL;
    size_t n = 0;
    if (sfi_qwen3_load(model, &m, &e) || sfi_tokenizer_load(model, &tk, &e) ||
        sfi_trigger_set_build(sfi_tokenizer_vocab(tk), o.cfg.prm.trigger_chars, &ts, &e) ||
        sfi_tokenizer_encode(tk, text, len, &ids, &n, &e)) {
        fprintf(stderr, "bench_eval: %s\n", e.msg);
        return 1;
    }
    o.is_trigger = ts.is_trigger;
    o.n_trigger_vocab = ts.n_vocab;
    FILE *la = fopen("/proc/loadavg", "r");
    char lbuf[128] = "?\n";
    if (la) {
        if (!fgets(lbuf, sizeof lbuf, la))
            snprintf(lbuf, sizeof lbuf, "?\n");
        fclose(la);
    }
    printf("load average at start: %s", lbuf);
    printf("runs in parallel: %d (one per CPU), one BLAS thread each\n",
           (int)sysconf(_SC_NPROCESSORS_ONLN));
    printf("model %s, text %s (%zu tokens), prefix %d, scored %d, budget %.1f%%, blas\n", model,
           text_path, n, o.n_prefix, o.n_tokens, 100.0 * o.shares[0]);
    sfi_eval_result r;
    if (sfi_eval_run(m, &o, ids, (int)n, &r, &e)) {
        fprintf(stderr, "bench_eval: %s\n", e.msg);
        return 1;
    }
    printf("prefill (once): %.1f s wall, %.1f s CPU\n", r.prefill_seconds,
           r.prefill_cpu_seconds);
    printf("full KV: %.1f s wall\n", r.full_seconds);
    for (int i = 0; i < r.n_rows; i++)
        printf("%-9s %.1f s wall, %.1f s CPU, %.2f ms/token\n",
               sfi_policy_kind_name(r.rows[i].kind), r.rows[i].seconds, r.rows[i].cpu_seconds,
               1e3 * r.rows[i].seconds / o.n_tokens);
    printf("eval total (%d policies, one budget, %d+%d tokens): %.1f s wall, %.1f s CPU "
           "(target < 600 s wall on 2 cores: %s)\n",
           r.n_rows, o.n_prefix, o.n_tokens, r.seconds, r.cpu_seconds,
           r.seconds < 600.0 ? "met" : "MISSED");
    la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fgets(lbuf, sizeof lbuf, la))
            printf("load average at the end: %s", lbuf);
        fclose(la);
    }
    sfi_eval_result_free(&r);
    free(ids);
    free(text);
    sfi_trigger_set_free(&ts);
    sfi_tokenizer_free(tk);
    sfi_qwen3_free(m);
    return 0;
}
