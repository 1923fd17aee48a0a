/* Benchmark of the analyzer: a full-level trace of 2,000 decode steps at
 * 32K context, 28 layers x 8 KV heads (Qwen3-8B's shape), every policy,
 * generated on the fly (no file). Prints the wall time; the target is
 * under 60 s on 2 cores.
 *
 * usage: bench_analyze [STEPS [CTX [LAYERS [HEADS [M [THREADS [BUDGET [POLICIES]]]]]]]]
 * Prints wall and process CPU time (a busy machine stretches the first). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>

#include "sfi_analyze.h"
#include "sfi_analyze_synth.h"
#include "sfi_clock.h"

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 2000;
    int ctx = argc > 2 ? atoi(argv[2]) : 32768;
    int layers = argc > 3 ? atoi(argv[3]) : 28;
    int heads = argc > 4 ? atoi(argv[4]) : 8;
    int M = argc > 5 ? atoi(argv[5]) : 64;
    int threads = argc > 6 ? atoi(argv[6]) : 2;
    double ratio = argc > 7 ? atof(argv[7]) : 0.06;
    const char *pols = argc > 8 ? argv[8] : "all";
    sfi_error err;
    sfi_analyze_synth syn;
    if (sfi_analyze_synth_init(&syn, layers, heads, steps, ctx, M, 20, &err)) {
        fprintf(stderr, "bench_analyze: %s\n", err.msg);
        return 1;
    }
    sfi_analyze_source src;
    sfi_analyze_synth_source(&syn, &src);
    sfi_analyze_opts opt;
    sfi_analyze_opts_default(&opt);
    opt.n_threads = threads;
    opt.budget.ratio = ratio;
    if (sfi_policy_parse_list(pols, &opt.policies, &err)) {
        fprintf(stderr, "bench_analyze: %s\n", err.msg);
        sfi_analyze_synth_free(&syn);
        return 1;
    }
    sfi_analyze_result res;
    double t0 = sfi_clock_wall();
    double c0 = sfi_clock_cpu();
    if (sfi_analyze_run(&src, &opt, &res, &err)) {
        fprintf(stderr, "bench_analyze: %s\n", err.msg);
        sfi_analyze_synth_free(&syn);
        return 1;
    }
    double dt = sfi_clock_wall() - t0;
    double cpu = sfi_clock_cpu() - c0;
    printf("analyze: %d steps x %d layers x %d KV heads, context %d..%d, M=%d, budget %.0f%%, "
           "%d threads: %.2f s wall, %.2f s CPU (target < 60 s wall)\n", steps, layers, heads, ctx,
           ctx + steps - 1, M, ratio * 100, threads, dt, cpu);
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++) {
        const sfi_analyze_policy *p = &res.pol[k];
        if (!p->used)
            continue;
        if (!p->available) {
            printf("  %-10s n/a (needs snapshots)\n", sfi_policy_kind_name((sfi_policy_kind)k));
            continue;
        }
        printf("  %-10s recall %.4f  overlap %.4f  ratio %.4f\n",
               sfi_policy_kind_name((sfi_policy_kind)k), p->recall / p->n, p->overlap / p->n,
               p->ratio / p->n);
    }
    sfi_analyze_result_free(&res);
    sfi_analyze_synth_free(&syn);
    return 0;
}
