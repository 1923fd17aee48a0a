/* Managed sparse state and trigger policies (sfi(7): MANAGED STATE, TRIGGERS, DECODE LOOP);
 * see sfi_state.h. */
#include <config.h>

#include "sfi_state.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

const char *sfi_step_kind_name(sfi_step_kind k)
{
    switch (k) {
    case SFI_STEP_PREFILL: return "prefill";
    case SFI_STEP_SLOW: return "slow";
    case SFI_STEP_FAST: return "fast";
    }
    return "unknown";
}

const char *sfi_step_reason_name(sfi_step_reason r)
{
    switch (r) {
    case SFI_REASON_NONE: return "none";
    case SFI_REASON_FIRST: return "first";
    case SFI_REASON_TRIGGER: return "trigger";
    case SFI_REASON_TMAX: return "tmax";
    case SFI_REASON_INTERVAL: return "interval";
    case SFI_REASON_ALWAYS: return "always";
    case SFI_REASON_PROMPT: return "prompt";
    }
    return "unknown";
}

static const char *const trig_names[] = {"sfi", "tmax", "boundary", "interval", "always", "never", "custom"};
#define N_TRIG ((int)(sizeof trig_names / sizeof trig_names[0]))

const char *sfi_trigger_kind_name(sfi_trigger_kind k)
{
    if ((int)k < 0 || (int)k >= N_TRIG)
        return "unknown";
    return trig_names[k];
}

sfi_status sfi_trigger_policy_parse(const char *name, sfi_trigger_kind *kind, sfi_error *err)
{
    /* "custom" needs a function: not selectable by name. */
    for (int i = 0; name && i < (int)SFI_TRIG_CUSTOM; i++)
        if (strcmp(name, trig_names[i]) == 0) {
            *kind = (sfi_trigger_kind)i;
            return SFI_OK;
        }
    return sfi_error_set(err, SFI_EINVAL,
                         "trigger policy '%s': unknown (expected sfi, tmax, boundary, interval, always or never)",
                         name ? name : "(null)");
}

void sfi_trigger_policy_init(sfi_trigger_policy *tp, sfi_trigger_kind kind,
                             const sfi_params *prm, const uint8_t *is_trigger,
                             int32_t n_vocab, int interval)
{
    memset(tp, 0, sizeof *tp);
    tp->kind = kind;
    tp->T_max = prm ? prm->T_max : 64;
    tp->interval = interval;
    tp->is_trigger = is_trigger;
    tp->n_vocab = is_trigger ? n_vocab : 0;
    tp->step = 0;
    tp->since_slow = 0;
}

void sfi_trigger_policy_init_custom(sfi_trigger_policy *tp, sfi_trigger_fn fn, void *ctx)
{
    memset(tp, 0, sizeof *tp);
    tp->kind = SFI_TRIG_CUSTOM;
    tp->custom = fn;
    tp->custom_ctx = ctx;
}

static int is_trigger_token(const sfi_trigger_policy *tp, int32_t tok)
{
    return tp->is_trigger && tok >= 0 && tok < tp->n_vocab && tp->is_trigger[tok];
}

sfi_step_kind sfi_trigger_next(sfi_trigger_policy *tp, int32_t prev_token,
                               sfi_step_reason *reason)
{
    sfi_step_reason why = SFI_REASON_NONE;
    /* Steps since the last slow step, counting this one. */
    const int d = tp->since_slow + 1;
    if (tp->step == 0) {
        why = SFI_REASON_FIRST;
    } else {
        switch (tp->kind) {
        case SFI_TRIG_SFI:
            if (is_trigger_token(tp, prev_token))
                why = SFI_REASON_TRIGGER;
            else if (tp->T_max >= 1 && d >= tp->T_max)
                why = SFI_REASON_TMAX;
            break;
        case SFI_TRIG_TMAX:
            if (tp->T_max >= 1 && d >= tp->T_max)
                why = SFI_REASON_TMAX;
            break;
        case SFI_TRIG_BOUNDARY:
            if (is_trigger_token(tp, prev_token))
                why = SFI_REASON_TRIGGER;
            break;
        case SFI_TRIG_INTERVAL:
            if (tp->interval >= 1 && d >= tp->interval)
                why = SFI_REASON_INTERVAL;
            break;
        case SFI_TRIG_ALWAYS:
            why = SFI_REASON_ALWAYS;
            break;
        case SFI_TRIG_NEVER:
            break;
        case SFI_TRIG_CUSTOM:
            if (tp->custom)
                why = tp->custom(tp, prev_token, tp->custom_ctx);
            if ((int)why < SFI_REASON_NONE || (int)why > SFI_REASON_PROMPT)
                why = SFI_REASON_NONE; /* a reason we do not know: treat as fast */
            break;
        }
    }
    tp->step++;
    tp->since_slow = why == SFI_REASON_NONE ? d : 0;
    if (reason)
        *reason = why;
    return why == SFI_REASON_NONE ? SFI_STEP_FAST : SFI_STEP_SLOW;
}

sfi_status sfi_state_init(sfi_state *st, int n_layers, int n_kv_heads, int K, sfi_error *err)
{
    memset(st, 0, sizeof *st);
    if (n_layers < 1 || n_kv_heads < 1 || K < 1)
        return sfi_error_set(err, SFI_EINVAL, "state: n_layers=%d, n_kv_heads=%d, K=%d: each must be >= 1",
                             n_layers, n_kv_heads, K);
    size_t slots = (size_t)n_layers * (size_t)n_kv_heads;
    if (slots > ((size_t)1 << 40) / (size_t)K)
        return sfi_error_set(err, SFI_ERANGE, "state: %d layers x %d kv heads x K=%d is too large",
                             n_layers, n_kv_heads, K);
    st->selected = malloc(slots * (size_t)K * sizeof *st->selected);
    st->n_selected = calloc(slots, sizeof *st->n_selected);
    if (!st->selected || !st->n_selected) {
        sfi_state_free(st);
        return sfi_error_set(err, SFI_ENOMEM, "state: out of memory");
    }
    st->n_layers = n_layers;
    st->n_kv_heads = n_kv_heads;
    st->K = K;
    return SFI_OK;
}

void sfi_state_free(sfi_state *st)
{
    if (!st)
        return;
    free(st->selected);
    free(st->n_selected);
    st->selected = NULL;
    st->n_selected = NULL;
}

void sfi_state_candidates(const sfi_params *prm, int n_ctx, int *j_begin, int *j_end)
{
    int b = prm->n_sink, e = n_ctx - prm->n_recent;
    if (n_ctx < 0)
        n_ctx = 0;
    if (b < 0)
        b = 0;
    if (b > n_ctx)
        b = n_ctx;
    if (e > n_ctx)
        e = n_ctx;
    if (e < b)
        e = b;
    *j_begin = b;
    *j_end = e;
}

int32_t *sfi_state_selected(const sfi_state *st, int layer, int kv_head)
{
    assert(layer >= 0 && layer < st->n_layers && kv_head >= 0 && kv_head < st->n_kv_heads);
    return st->selected + ((size_t)layer * (size_t)st->n_kv_heads + (size_t)kv_head) * (size_t)st->K;
}

void sfi_state_fast_set(const sfi_state *st, const sfi_params *prm, int layer,
                        int kv_head, int n_ctx, int32_t *idx, int *n)
{
    int a = prm->n_sink < n_ctx ? prm->n_sink : n_ctx; /* sink = [0, a) */
    if (a < 0)
        a = 0;
    int b = n_ctx - prm->n_recent; /* recent = [max(a, b), n_ctx) */
    if (b < a)
        b = a;
    int cnt = 0;
    for (int j = 0; j < a; j++)
        idx[cnt++] = j;
    const int32_t *sel = sfi_state_selected(st, layer, kv_head);
    const int ns = st->n_selected[(size_t)layer * (size_t)st->n_kv_heads + (size_t)kv_head];
    /* idx holds n_sink + K + n_recent: a set larger than K would overrun it */
    assert(ns >= 0 && ns <= st->K);
    int32_t last = a - 1;
    for (int i = 0; i < ns; i++) {
        /* Selected positions inside sink or recent are already counted;
         * the ascending check also drops duplicates. */
        if (sel[i] > last && sel[i] < b) {
            idx[cnt++] = sel[i];
            last = sel[i];
        }
    }
    for (int j = b; j < n_ctx; j++)
        idx[cnt++] = j;
    *n = cnt;
}

sfi_status sfi_state_slow_update(sfi_state *st, const sfi_params *prm, int layer,
                                 const sfi_selector_input *in, sfi_selector_detail *detail,
                                 sfi_error *err)
{
    if (layer < 0 || layer >= st->n_layers)
        return sfi_error_set(err, SFI_EINVAL, "state: layer %d outside 0..%d", layer, st->n_layers - 1);
    if (!in || in->n_kv_heads != st->n_kv_heads)
        return sfi_error_set(err, SFI_EINVAL, "state: selector input has %d kv heads, state has %d",
                             in ? in->n_kv_heads : 0, st->n_kv_heads);
    if (!prm || prm->K > st->K || prm->K < 1)
        return sfi_error_set(err, SFI_EINVAL, "state: K=%d: must be in 1..%d (the state's capacity)",
                             prm ? prm->K : 0, st->K);
    const int H = st->n_kv_heads;
    const int nJ = in->j_end - in->j_begin;
    const int K_out = nJ > 0 && prm->K > nJ ? nJ : prm->K;
    int32_t *tmp = malloc((size_t)H * (size_t)(K_out > 0 ? K_out : 1) * sizeof *tmp);
    if (!tmp)
        return sfi_error_set(err, SFI_ENOMEM, "state: out of memory");
    int n_sel = 0;
    sfi_status s = sfi_selector_run(prm, in, tmp, &n_sel, detail, err);
    if (s == SFI_OK) {
        assert(n_sel >= 0 && n_sel <= st->K); /* the slots hold K */
        /* Only now, so a failed Selector leaves the previous sets in place. */
        for (int h = 0; h < H; h++) {
            memcpy(sfi_state_selected(st, layer, h), tmp + (size_t)h * (size_t)n_sel,
                   (size_t)n_sel * sizeof *tmp);
            st->n_selected[(size_t)layer * (size_t)H + (size_t)h] = n_sel;
        }
    }
    free(tmp);
    return s;
}
