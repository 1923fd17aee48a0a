/* Trigger replay over token streams (see sfi_replay.h). The decision of
 * each step is ref/'s sfi_trigger_next: the simulator never restates the
 * trigger rule. */
#include <config.h>

#include "sfi_replay.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_rng.h"

#define MAX_STEPS ((int64_t)1 << 40)

sfi_status sfi_replay_run(const sfi_replay_stream *in, sfi_trigger_kind kind, const sfi_params *prm,
                          int interval, int batch, int64_t stagger, int64_t steps, int64_t timeline,
                          sfi_replay_result *out, sfi_error *err)
{
    memset(out, 0, sizeof *out);
    if (!in || !in->tokens || in->n < 1)
        return sfi_error_set(err, SFI_EINVAL, "replay: empty token stream");
    if (batch < 1 || batch > (1 << 20))
        return sfi_error_set(err, SFI_ERANGE, "replay: batch %d outside 1..2^20", batch);
    if (steps < 1 || steps > MAX_STEPS)
        return sfi_error_set(err, SFI_ERANGE, "replay: steps %lld outside 1..2^40",
                             (long long)steps);
    if (stagger < 0 || stagger > MAX_STEPS)
        return sfi_error_set(err, SFI_ERANGE, "replay: stagger %lld outside 0..2^40",
                             (long long)stagger);
    if (timeline < 0)
        timeline = 0;
    if (timeline > steps)
        timeline = steps;
    sfi_trigger_policy *tp = malloc((size_t)batch * sizeof *tp);
    int64_t *pos = malloc((size_t)batch * sizeof *pos);
    int32_t *prev = malloc((size_t)batch * sizeof *prev);
    out->hist = calloc((size_t)batch + 1, sizeof *out->hist);
    out->timeline = timeline ? malloc((size_t)timeline * sizeof *out->timeline) : NULL;
    if (!tp || !pos || !prev || !out->hist || (timeline && !out->timeline)) {
        free(tp);
        free(pos);
        free(prev);
        sfi_replay_result_free(out);
        return sfi_error_set(err, SFI_ENOMEM, "replay: out of memory");
    }
    for (int r = 0; r < batch; r++) {
        sfi_trigger_policy_init(&tp[r], kind, prm, in->is_trigger, in->n_vocab, interval);
        pos[r] = (int64_t)((double)r * (double)in->n / batch) % in->n;
        prev[r] = -1; /* ignored at step 0 */
        /* Decode the warm-up steps from the tokens before the offset. */
        int64_t warm = (int64_t)((double)r * (double)stagger / batch);
        int64_t p = ((pos[r] - warm) % in->n + in->n) % in->n;
        for (int64_t w = 0; w < warm; w++) {
            (void)sfi_trigger_next(&tp[r], prev[r], NULL);
            prev[r] = in->tokens[p];
            if (++p == in->n)
                p = 0;
        }
    }
    const int32_t *tok = in->tokens;
    const int64_t n = in->n;
    for (int64_t t = 0; t < steps; t++) {
        int ns = 0;
        for (int r = 0; r < batch; r++) {
            sfi_step_reason why;
            ns += sfi_trigger_next(&tp[r], prev[r], &why) == SFI_STEP_SLOW;
            assert((unsigned)why < sizeof out->reasons / sizeof out->reasons[0]);
            out->reasons[why]++;
            prev[r] = tok[pos[r]];
            if (++pos[r] == n)
                pos[r] = 0;
        }
        out->hist[ns]++;
        out->slow += ns;
        if (t < timeline)
            out->timeline[t] = ns;
    }
    out->batch = batch;
    out->steps = steps;
    out->n_timeline = timeline;
    free(tp);
    free(pos);
    free(prev);
    return SFI_OK;
}

void sfi_replay_result_free(sfi_replay_result *r)
{
    if (!r)
        return;
    free(r->hist);
    free(r->timeline);
    r->hist = NULL;
    r->timeline = NULL;
}

sfi_status sfi_replay_synthetic(int64_t n, double mean_sentence, uint64_t seed, int32_t **tokens,
                                uint8_t **is_trigger, sfi_error *err)
{
    if (n < 1 || n > ((int64_t)1 << 32))
        return sfi_error_set(err, SFI_ERANGE, "synthetic stream: length %lld outside 1..2^32",
                             (long long)n);
    if (!(mean_sentence >= 1 && mean_sentence <= 1e6))
        return sfi_error_set(err, SFI_ERANGE,
                             "synthetic stream: mean sentence length must be >= 1");
    int32_t *t = malloc((size_t)n * sizeof *t);
    uint8_t *trig = malloc(2);
    if (!t || !trig) {
        free(t);
        free(trig);
        return sfi_error_set(err, SFI_ENOMEM, "synthetic stream: out of memory");
    }
    trig[0] = 0;
    trig[1] = 1;
    /* A token ends a sentence with probability 1/mean (geometric sentence
     * lengths). */
    uint64_t x = seed;
    const uint64_t thresh = (uint64_t)((double)UINT64_MAX / mean_sentence);
    for (int64_t i = 0; i < n; i++) {
        t[i] = sfi_rng_next(&x) < thresh ? 1 : 0;
    }
    *tokens = t;
    *is_trigger = trig;
    return SFI_OK;
}
