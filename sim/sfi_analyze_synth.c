/* Synthetic attention source (see sfi_analyze_synth.h). */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "sfi_analyze_synth.h"

static uint64_t synth_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t synth_h(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return synth_mix(a * 0x9e3779b97f4a7c15ULL ^ synth_mix(b + 0x632be59bd9b4e019ULL) ^
                         synth_mix(c * 31 + 7) * 3 ^ synth_mix(d + 12345) * 5);
}

sfi_status sfi_analyze_synth_init(sfi_analyze_synth *s, int n_layers, int n_kv_heads, int n_steps,
                                 int ctx0, int M, int sent_len, sfi_error *err)
{
    if (n_layers < 1 || n_kv_heads < 1 || n_steps < 1 || M < 6 || sent_len < 1 ||
        ctx0 < 64 + 4 * M)
        return sfi_error_set(err, SFI_EINVAL, "synthetic trace: bad shape (%d layers, %d heads, "
                             "%d steps, context %d, M %d)", n_layers, n_kv_heads, n_steps, ctx0, M);
    memset(s, 0, sizeof *s);
    s->n_layers = n_layers;
    s->n_kv_heads = n_kv_heads;
    s->n_steps = n_steps;
    s->ctx0 = ctx0;
    s->M = M;
    s->sent_len = sent_len;
    s->tail = 0.25f;
    s->n_ctx = malloc(sizeof(int32_t) * (size_t)n_steps);
    s->trigger = malloc((size_t)n_steps);
    s->sent = malloc(sizeof(int) * (size_t)n_steps);
    if (!s->n_ctx || !s->trigger || !s->sent) {
        sfi_analyze_synth_free(s);
        return sfi_error_set(err, SFI_ENOMEM, "synthetic trace: out of memory");
    }
    int sent = 0;
    for (int t = 0; t < n_steps; t++) {
        s->n_ctx[t] = ctx0 + t;
        s->sent[t] = sent;
        s->trigger[t] = synth_h(t, 99, 0, 0) % (uint64_t)sent_len == 0;
        sent += s->trigger[t];
    }
    s->seq_begin[0] = 0;
    s->seq_begin[1] = n_steps;
    return SFI_OK;
}

void sfi_analyze_synth_free(sfi_analyze_synth *s)
{
    free(s->n_ctx);
    free(s->trigger);
    free(s->sent);
    s->n_ctx = NULL;
    s->trigger = NULL;
    s->sent = NULL;
}

/* Entries: rank 0 the sink (position 0), ranks 1..4 the latest positions,
 * the rest anchors, one per stripe of the middle of the context; the
 * stripe of a rank is permuted per sentence; ranks past 3/4 of M drift
 * every step. Probabilities ~ 1/(rank+2)^1.1 with a per-step jitter,
 * sorted, scaled to 1 - tail. */
static int synth_get(void *ctx, int step, int layer, int kvh, sfi_policy_obs *o,
                         int32_t *pos, float *prob, sfi_error *err)
{
    (void)err;
    const sfi_analyze_synth *s = ctx;
    int n_ctx = s->n_ctx[step], M = s->M;
    int sent = s->sent[step];
    int n_rec = 4, n_anchor = M - 1 - n_rec;
    int lo = 4, hi = n_ctx - 64;
    int stripe = (hi - lo) / (n_anchor > 0 ? n_anchor : 1);
    uint64_t hs = synth_h(sent, layer, kvh, 1);
    int mult = (int)(hs % 1000) * 2 + 1, off = (int)((hs >> 20) % (uint64_t)n_anchor);
    int n = 0;
    pos[n++] = 0;
    for (int r = 0; r < n_rec; r++)
        pos[n++] = n_ctx - 1 - r;
    for (int r = 0; r < n_anchor; r++) {
        int sidx = (int)(((int64_t)r * mult + off) % n_anchor);
        uint64_t key = r * 4 < n_anchor * 3 ? (uint64_t)sent : (uint64_t)step + 1000000u;
        uint64_t hh = synth_h(key, layer * 64 + kvh, r, 2);
        pos[n++] = lo + sidx * stripe + (int)(hh % (uint64_t)(stripe > 0 ? stripe : 1));
    }
    /* Probabilities by rank with jitter; then sort entries descending. */
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        uint64_t hh = synth_h(step, layer * 64 + kvh, i, 3);
        float base = 1.0f;
        for (int e = 0; e < i + 2 && e < 64; e++)
            base *= 0.93f;  /* a geometric profile is cheap and heavy-headed */
        prob[i] = base * (0.7f + 0.6f * (float)(hh % 1024) / 1024.0f);
        sum += prob[i];
    }
    float scale = (1.0f - s->tail) / sum;
    for (int i = 0; i < n; i++)
        prob[i] *= scale;
    /* insertion sort (M is small; entries are nearly sorted) */
    for (int i = 1; i < n; i++) {
        float pv = prob[i];
        int32_t pp = pos[i];
        int j = i - 1;
        while (j >= 0 && prob[j] < pv) {
            prob[j + 1] = prob[j];
            pos[j + 1] = pos[j];
            j--;
        }
        prob[j + 1] = pv;
        pos[j + 1] = pp;
    }
    o->n_ctx = n_ctx;
    o->n_top = n;
    o->pos = pos;
    o->prob = prob;
    o->tail = s->tail;
    return 0;
}

void sfi_analyze_synth_source(sfi_analyze_synth *s, sfi_analyze_source *src)
{
    memset(src, 0, sizeof *src);
    src->n_layers = s->n_layers;
    src->n_kv_heads = s->n_kv_heads;
    src->n_steps = s->n_steps;
    src->n_seq = 1;
    src->seq_begin = s->seq_begin;
    src->n_ctx = s->n_ctx;
    src->trigger = s->trigger;
    src->max_ctx = s->ctx0 + s->n_steps;
    src->max_top = s->M;
    src->get = synth_get;
    src->ctx = s;
}

