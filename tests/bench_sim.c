/* Benchmarks of sfi-sim (make bench): trigger replay speed per core and
 * the wall time of the default sweep. Targets from the simulator issue:
 * >= 1M replayed decode steps per second per core; default sweep < 2 s. */
#include <config.h>

#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sfi_replay.h"
#include "sfi_test_util.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

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
        double t0 = now();
        if (sfi_replay_run(&in, SFI_TRIG_SFI, &prm, 0, B, prm.T_max, steps, 0, &r, &e) != SFI_OK) {
            fprintf(stderr, "bench_sim: %s\n", e.msg);
            return 1;
        }
        double dt = now() - t0;
        double rate = (double)steps * B / dt;
        printf("replay sfi batch %2d: %lld request-steps in %.3f s = %.1f M steps/s/core "
               "(slow %.2f%%) %s\n",
               B, (long long)steps * B, dt, rate / 1e6, 100.0 * r.slow / ((double)steps * B),
               rate >= 1e6 ? "[>= 1M: ok]" : "[< 1M: MISSED]");
        fail |= rate < 1e6;
        sfi_replay_result_free(&r);
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
        double t0 = now();
        int rc = sfi_test_run(cmd, &out, &err);
        double dt = now() - t0;
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
