/* Benchmarks of sfi-sim (make bench): trigger replay speed per core, the
 * wall time of the default sweep, and of a served workload. Targets from
 * the simulator issues: >= 1M replayed decode steps per second per core;
 * default sweep < 2 s; 128 requests x 2048 tokens priced in < 1 s. */
#include <config.h>

#include <stdio.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_clock.h"
#include "sfi_replay.h"
#include "sfi_rng.h"
#include "sfi_serve.h"
#include "sfi_test_util.h"

int main(void)
{
    int32_t *tok;
    uint8_t *trig;
    sfi_error e;
    if (sfi_replay_synthetic(1 << 20, 24, 7, &tok, &trig, &e) != SFI_OK) {
        fprintf(stderr, "bench_sim: %s\n", e.msg);
        return 1;
    }
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_replay_stream in = {tok, 1 << 20, trig, 2};
    int fail = 0;
    const int batches[] = {1, 8, 64};
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        int B = batches[i];
        int64_t steps = (int64_t)(8 << 20) / B;
        sfi_replay_result r;
        double t0 = sfi_clock_wall();
        if (sfi_replay_run(&in, SFI_TRIG_SFI, &prm, 0, B, prm.T_max, steps, 0, &r, &e) != SFI_OK) {
            fprintf(stderr, "bench_sim: %s\n", e.msg);
            return 1;
        }
        double dt = sfi_clock_wall() - t0;
        double rate = (double)steps * B / dt;
        printf("replay sfi batch %2d: %lld request-steps in %.3f s = %.1f M steps/s/core "
               "(slow %.2f%%) %s\n",
               B, (long long)steps * B, dt, rate / 1e6, 100.0 * r.slow / ((double)steps * B),
               rate >= 1e6 ? "[>= 1M: ok]" : "[< 1M: MISSED]");
        fail |= rate < 1e6;
        sfi_replay_result_free(&r);
    }

    /* A served workload: 128 requests of 2048 new tokens each, prompts of
     * 8K all at once (identical contexts share the cost model's groups),
     * or lognormal around 8K arriving at 4 per second (every request at
     * its own context: the slow case); Qwen3-235B-A22B on 8 B200 (TP 8)
     * and Qwen3-4B on one; full KV and SFI; every step priced by the
     * cost model. */
    const char *models[] = {"Qwen3-235B-A22B", "Qwen3-4B"};
    const int tps[] = {8, 1};
    for (int mi = 0; mi < 2; mi++)
        for (int pk = 0; pk < 4; pk++) {
            sfi_model_config m;
            sfi_serve_config c;
            sfi_serve_config_init(&c);
            if (sfi_model_preset(models[mi], &m, &e) != SFI_OK ||
                sfi_gpu_preset("B200", &c.cost.gpu, &e) != SFI_OK) {
                fprintf(stderr, "bench_sim: %s\n", e.msg);
                return 1;
            }
            c.cost.model = &m;
            c.cost.tp = tps[mi];
            c.cost.kind = pk & 1 ? SFI_POLICY_SFI : SFI_POLICY_FULL;
            c.stream = &in;
            c.trigger = SFI_TRIG_SFI;
            sfi_serve_request rq[128];
            uint64_t rng = 1;
            sfi_len_dist ln = {SFI_LEN_LOGNORMAL, 8192, 1.0};
            double t = 0;
            for (int i = 0; i < 128; i++) {
                rq[i] = (sfi_serve_request){0, 8192, 2048};
                if (pk & 2) {
                    rq[i].prompt = sfi_len_dist_draw(&ln, &rng, i, NULL, 0);
                    if (rq[i].prompt > 65536)
                        rq[i].prompt = 65536;
                    t += -log(1 - sfi_rng_uniform(&rng)) / 4.0;
                    rq[i].arrival = t;
                }
            }
            sfi_serve_result r;
            double t0 = sfi_clock_wall();
            if (sfi_serve_run(&c, rq, 128, &r, &e) != SFI_OK) {
                fprintf(stderr, "bench_sim: serve: %s\n", e.msg);
                return 1;
            }
            double dt = sfi_clock_wall() - t0;
            printf("serve %s TP %d %-4s: 128 requests x (%s + 2048) in %lld steps, peak %d "
                   "running: %.3f s %s\n",
                   models[mi], tps[mi], pk & 1 ? "sfi" : "full",
                   pk & 2 ? "lognormal 8K, Poisson 4/s" : "8K at once", (long long)r.n_steps,
                   r.peak_running, dt, dt < 1.0 ? "[< 1 s: ok]" : "[>= 1 s: MISSED]");
            fail |= dt >= 1.0;
            sfi_serve_result_free(&r);
        }
    free(tok);
    free(trig);

    /* The default run, as `make demo` runs it, in a scratch directory. */
    char *dir = sfi_test_tmpdir();
    char cmd[8192];
    /* Absolute: the command runs in the scratch directory. */
    char *prog = realpath(sfi_test_build("sfi-sim"), NULL);
    if (!prog) {
        fprintf(stderr, "bench_sim: %s: not built\n", sfi_test_build("sfi-sim"));
        return 1;
    }
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s'", dir, prog);
    free(prog);
    char *out = NULL, *err = NULL;
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        free(out);
        free(err);
        double t0 = sfi_clock_wall();
        int rc = sfi_test_run(cmd, &out, &err);
        double dt = sfi_clock_wall() - t0;
        if (rc != 0) {
            fprintf(stderr, "bench_sim: default sweep failed (%d): %s\n", rc, err);
            return 1;
        }
        if (dt < best)
            best = dt;
    }
    int lines = 0;
    for (char *p = out; *p; p++)
        lines += *p == '\n';
    printf("default sweep (table of %d lines + PNG): best of 3 %.3f s %s\n", lines - 2, best,
           best < 2.0 ? "[< 2 s: ok]" : "[>= 2 s: MISSED]");
    printf("%.*s", (int)(strchr(out, '\n') ? strchr(out, '\n') - out + 1 : 0), out);
    fail |= best >= 2.0;
    free(out);
    free(err);
    sfi_test_rmtree(dir);
    free(dir);
    return fail;
}
