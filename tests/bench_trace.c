/* Benchmark: tokens-level trace write and read throughput (issue target:
 * >= 1M steps/s each). Prints steps/s; run by `make bench`. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_clock.h"
#include "sfi_test_util.h"
#include "sfi_trace.h"

static void report(const char *what, int64_t n, double wall, double cpus)
{
    printf("%s %lld steps: wall %.3f s = %.2f M steps/s; cpu %.3f s = %.2f M steps/s\n", what,
           (long long)n, wall, (double)n / wall / 1e6, cpus, (double)n / cpus / 1e6);
}

int main(int argc, char **argv)
{
    int64_t n_req = 8, per_req = 250000; /* 2M steps */
    if (argc > 1)
        per_req = atoll(argv[1]);
    char *dir = sfi_test_tmpdir();
    if (!dir) {
        fprintf(stderr, "bench_trace: no temporary directory\n");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/bench.db", dir);
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "bench_trace";
    m.n_vocab = 151936;
    sfi_error e;
    sfi_trace_writer *w;
    int32_t *ctx = malloc(per_req * 4), *tok = malloc(per_req * 4);
    uint8_t *kind = malloc(per_req), *reason = malloc(per_req);
    for (int64_t i = 0; i < per_req; i++) {
        ctx[i] = (int32_t)(8192 + i);
        tok[i] = (int32_t)((i * 7919) % 151936);
        kind[i] = (i == 0 || i % 19 == 0) ? SFI_STEP_SLOW : SFI_STEP_FAST;
        reason[i] = i == 0 ? SFI_REASON_FIRST : (i % 19 == 0 ? SFI_REASON_TRIGGER : SFI_REASON_NONE);
    }
    int32_t prompt[8192];
    for (int i = 0; i < 8191; i++)
        prompt[i] = i;
    double t0 = sfi_clock_wall(), c0 = sfi_clock_cpu();
    if (sfi_trace_create(path, &m, 0, getenv("CE") ? atoi(getenv("CE")) : 0, &w, &e) != SFI_OK)
        goto fail;
    for (int64_t r = 0; r < n_req; r++) {
        int64_t id;
        if (sfi_trace_add_request(w, prompt, 8191, &id, &e) ||
            sfi_trace_append_steps(w, id, 0, per_req, ctx, tok, kind, reason, &e))
            goto fail;
    }
    if (sfi_trace_finish(w, &e) != SFI_OK)
        goto fail;
    double t1 = sfi_clock_wall(), c1 = sfi_clock_cpu();
    int64_t total = n_req * per_req;
    report("write:", total, t1 - t0, c1 - c0);
    sfi_trace *t;
    t0 = sfi_clock_wall();
    c0 = sfi_clock_cpu();
    if (sfi_trace_open(path, &t, &e) != SFI_OK)
        goto fail;
    int64_t sum = 0, nread = 0;
    for (int64_t r = 0; r < sfi_trace_n_requests(t); r++) {
        sfi_trace_steps s;
        if (sfi_trace_read_steps(t, r, &s, &e) != SFI_OK)
            goto fail;
        for (int64_t i = 0; i < s.n; i++)
            sum += s.kind[i] == SFI_STEP_SLOW;
        nread += s.n;
        sfi_trace_steps_free(&s);
    }
    t1 = sfi_clock_wall();
    c1 = sfi_clock_cpu();
    report("read: ", nread, t1 - t0, c1 - c0);
    printf("       slow steps read: %lld\n", (long long)sum);
    t0 = sfi_clock_wall();
    c0 = sfi_clock_cpu();
    if (sfi_trace_check(t, &e) != SFI_OK)
        goto fail;
    t1 = sfi_clock_wall();
    c1 = sfi_clock_cpu();
    report("check:", nread, t1 - t0, c1 - c0);
    sfi_trace_close(t);
    free(ctx); free(tok); free(kind); free(reason);
    sfi_test_rmtree(dir);
    free(dir);
    return 0;
fail:
    fprintf(stderr, "bench_trace: %s\n", e.msg);
    sfi_test_rmtree(dir);
    return 1;
}
