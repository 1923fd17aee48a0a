/* Step-level validation against sfi-gpu run --bench (see sfi_stepval.h). */
#include <config.h>

#include "sfi_stepval.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sfi_cost.h"
#include "sfi_io.h"
#include "sfi_params.h"
#include "sfi_state.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

/* sfi-gpu run --bench: steps 1 and 2 are warm-up, 3 .. new_tokens - 1 are
 * timed (gpu/cmd_run.c, bench_report). */
#define FIRST_TIMED 3
/* sfi-gpu run --replay: at most this many trace requests, copies of a
 * request start at most this many tokens apart (gpu/cmd_run.c,
 * read_replay; SFI_GPU_MAX_BATCH). */
#define REPLAY_MAX_REQ 64
#define REPLAY_MAX_STRIDE 512

static const char *const class_names[SFI_SV_NCLASS] = {"dense", "slow", "fast"};

/* ---- reading ---- */

static sfi_status bad(sfi_error *err, const char *origin, size_t i, const char *what)
{
    return sfi_error_set(err, SFI_EFORMAT, "%s: step_measurements[%zu]: %s", origin, i, what);
}

static int get_int(json_t *o, const char *key, int lo, int hi, int dflt, int *out)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        *out = dflt;
        return dflt >= lo || dflt == 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return 0;
    *out = (int)json_integer_value(v);
    return 1;
}

static sfi_status parse_one(json_t *o, const char *origin, size_t i, sfi_step_meas *m,
                            sfi_error *err)
{
    memset(m, 0, sizeof *m);
    if (!json_is_object(o))
        return bad(err, origin, i, "not an object");
    json_t *model = json_object_get(o, "model"), *mode = json_object_get(o, "mode");
    if (!json_is_string(model) || !json_string_value(model)[0] ||
        strlen(json_string_value(model)) >= sizeof m->model)
        return bad(err, origin, i, "model: needs a preset name (a string of 1..63 bytes)");
    snprintf(m->model, sizeof m->model, "%s", json_string_value(model));
    if (!json_is_string(mode) ||
        (strcmp(json_string_value(mode), "dense") && strcmp(json_string_value(mode), "sfi")))
        return bad(err, origin, i, "mode: needs \"dense\" or \"sfi\"");
    m->sfi = !strcmp(json_string_value(mode), "sfi");
    if (!get_int(o, "context", 1, 1 << 24, -1, &m->context))
        return bad(err, origin, i, "context: needs an integer in 1..2^24");
    if (!get_int(o, "batch", 1, SFI_SV_MAXB, -1, &m->batch))
        return bad(err, origin, i, "batch: needs an integer in 1..1024");
    if (!get_int(o, "new_tokens", FIRST_TIMED + 1, 1 << 20, 128, &m->new_tokens))
        return bad(err, origin, i, "new_tokens: needs an integer in 4..2^20");
    if (!get_int(o, "layers", 1, 100000, 0, &m->layers))
        return bad(err, origin, i, "layers: needs an integer >= 1");
    if (!get_int(o, "tp", 1, 64, 1, &m->tp))
        return bad(err, origin, i, "tp: needs an integer in 1..64");
    /* what the engine reports it sent into collectives (-1: not given) */
    static const char *const comm_keys[2] = {"allreduce_bytes_per_step", "gather_bytes_per_step"};
    for (int k = 0; k < 2; k++) {
        json_t *cb = json_object_get(o, comm_keys[k]);
        double *dst = k ? &m->gather_bytes : &m->allreduce_bytes;
        *dst = -1;
        if (!cb)
            continue;
        if (!json_is_number(cb) || !(json_number_value(cb) >= 0 && json_number_value(cb) < 1e15)) {
            char msg[96];
            snprintf(msg, sizeof msg, "%s: needs a number of bytes >= 0", comm_keys[k]);
            return bad(err, origin, i, msg);
        }
        *dst = json_number_value(cb);
    }
    json_t *sr = json_object_get(o, "attn_split_rows");
    if (sr) {
        json_t *f = json_object_get(sr, "fast"), *s = json_object_get(sr, "slow");
        if (!json_is_object(sr) || !json_is_integer(f) || !json_is_integer(s) ||
            json_integer_value(f) < 64 || json_integer_value(f) > (1 << 24) ||
            json_integer_value(s) < 64 || json_integer_value(s) > (1 << 24))
            return bad(err, origin, i,
                       "attn_split_rows: needs {\"fast\": rows, \"slow\": rows}, each 64..2^24");
        m->split_fast = (int)json_integer_value(f);
        m->split_slow = (int)json_integer_value(s);
    }
    json_t *dt = json_object_get(o, "dtype");
    m->dtype_bytes = 2;
    if (dt) {
        if (json_is_string(dt) && !strcmp(json_string_value(dt), "bf16"))
            m->dtype_bytes = 2;
        else if (json_is_string(dt) && !strcmp(json_string_value(dt), "f32"))
            m->dtype_bytes = 4;
        else
            return bad(err, origin, i, "dtype: needs \"bf16\" or \"f32\"");
    }
    json_t *tps = json_object_get(o, "decode_tokens_per_s");
    if (!json_is_number(tps) || !(json_number_value(tps) > 0 && json_number_value(tps) < 1e9))
        return bad(err, origin, i, "decode_tokens_per_s: needs a number in (0, 1e9)");
    m->tps = json_number_value(tps);
    json_t *rp = json_object_get(o, "replay");
    if (rp) {
        if (!json_is_string(rp) || strlen(json_string_value(rp)) >= sizeof m->replay)
            return bad(err, origin, i, "replay: needs a trace path (a string)");
        snprintf(m->replay, sizeof m->replay, "%s", json_string_value(rp));
    }
    json_t *steps = json_object_get(o, "steps");
    if (steps) {
        if (!json_is_object(steps))
            return bad(err, origin, i, "steps: not an object");
        const char *k;
        json_t *c;
        json_object_foreach(steps, k, c)
        {
            int ci = 0;
            while (ci < SFI_SV_NCLASS && strcmp(k, class_names[ci]))
                ci++;
            char msg[160];
            if (!strcmp(k, "fast+sel") && m->sfi) {
                /* deferred refresh (sfi-gpu's refresh_delay): a fast step
                 * running a Selector behind it; not modelled */
                m->deferred = 1;
                continue;
            }
            if (ci == SFI_SV_NCLASS) {
                snprintf(msg, sizeof msg,
                         "steps: unknown class '%.40s' (dense, slow, fast, fast+sel)", k);
                return bad(err, origin, i, msg);
            }
            if ((ci == SFI_SV_DENSE) == m->sfi) {
                snprintf(msg, sizeof msg, "steps.%s: a %s-mode run has no %s steps", k,
                         m->sfi ? "sfi" : "dense", k);
                return bad(err, origin, i, msg);
            }
            json_t *mean = json_is_object(c) ? json_object_get(c, "mean_ms") : NULL;
            if (!json_is_number(mean) ||
                !(json_number_value(mean) > 0 && json_number_value(mean) < 1e7)) {
                snprintf(msg, sizeof msg, "steps.%s.mean_ms: needs a positive number", k);
                return bad(err, origin, i, msg);
            }
            sfi_sv_class *cl = &m->cls[ci];
            cl->have = 1;
            cl->mean_s = json_number_value(mean) * 1e-3;
            json_t *n = json_object_get(c, "n"), *b = json_object_get(c, "bytes_per_step");
            if (n && (!json_is_integer(n) || json_integer_value(n) < 0 ||
                      json_integer_value(n) > (1 << 30))) {
                snprintf(msg, sizeof msg, "steps.%s.n: needs a non-negative integer", k);
                return bad(err, origin, i, msg);
            }
            cl->n = n ? (int)json_integer_value(n) : 0;
            if (b && (!json_is_number(b) || !(json_number_value(b) >= 0))) {
                snprintf(msg, sizeof msg, "steps.%s.bytes_per_step: needs a number >= 0", k);
                return bad(err, origin, i, msg);
            }
            cl->bytes = b ? json_number_value(b) : 0;
        }
    }
    /* Engine settings other than sfi-gpu run's defaults are listed, not
     * compared: GEMMs through cuBLAS, programmatic dependent launch other
     * than its rule (on in sfi mode, off in dense), the Selector on the
     * main stream, timing runs without the Selector. */
    json_t *g = json_object_get(o, "gemm"), *pdl = json_object_get(o, "pdl"),
           *ov = json_object_get(o, "overlap"), *note = json_object_get(o, "note");
    const char *why = NULL;
    m->no_overlap = m->sfi && ov && json_is_boolean(ov) && !json_is_true(ov);
    const int note_nosel =
        note && json_is_string(note) && strstr(json_string_value(note), "no-selector") != NULL;
    m->no_selector = m->sfi && note_nosel; /* priced so in SFI mode only */
    if (m->deferred)
        why = "deferred refresh";
    else if (g && (!json_is_string(g) || strcmp(json_string_value(g), "sfi")))
        why = "gemm cublas";
    else if (pdl && json_is_boolean(pdl) && json_is_true(pdl) != m->sfi)
        why = json_is_true(pdl) ? "pdl on" : "pdl off";
    else if (ov && json_is_boolean(ov) && !json_is_true(ov) && m->sfi)
        why = "no overlap";
    else if (note_nosel)
        why = "no Selector";
    if (why) {
        m->variant = 1;
        snprintf(m->variant_why, sizeof m->variant_why, "%s", why);
    }
    return SFI_OK;
}

sfi_status sfi_step_meas_parse(const char *json, size_t len, const char *origin,
                               sfi_step_meas **out, size_t *n, sfi_error *err)
{
    *out = NULL;
    *n = 0;
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return sfi_error_set(err, SFI_EFORMAT, "%s:%d:%d: invalid JSON: %s", origin, je.line,
                             je.column, je.text);
    json_t *a = json_object_get(root, "step_measurements");
    sfi_status st = SFI_OK;
    if (!a) {
        json_decref(root);
        return SFI_OK;
    }
    if (!json_is_array(a) || json_array_size(a) > 100000) {
        json_decref(root);
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: step_measurements: not an array of at most 100000", origin);
    }
    size_t k = json_array_size(a);
    sfi_step_meas *v = k ? calloc(k, sizeof *v) : NULL;
    if (k && !v)
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", origin);
    for (size_t i = 0; i < k && !st; i++)
        st = parse_one(json_array_get(a, i), origin, i, &v[i], err);
    json_decref(root);
    if (st) {
        free(v);
        return st;
    }
    *out = v;
    *n = k;
    return SFI_OK;
}

sfi_status sfi_step_meas_load(const char *path, sfi_step_meas **out, size_t *n, sfi_error *err)
{
    char *buf;
    size_t len;
    sfi_status st = sfi_io_read(path, SFI_HW_FILE_MAX, "a profile", &buf, &len, err);
    if (st)
        return st;
    st = sfi_step_meas_parse(buf, len, path, out, n, err);
    free(buf);
    return st;
}

/* ---- the model and the step mix ---- */

sfi_status sfi_sv_model(const sfi_step_meas *m, sfi_model_config *mc, sfi_error *err)
{
    sfi_status st = sfi_model_resolve(m->model, mc, err);
    if (st)
        return st;
    if (m->layers > 0) {
        if (m->layers > mc->num_hidden_layers)
            return sfi_error_set(err, SFI_ERANGE, "%s has %d layers, the measurement keeps %d",
                                 m->model, mc->num_hidden_layers, m->layers);
        mc->num_hidden_layers = m->layers;
    }
    return SFI_OK;
}

sfi_status sfi_sv_trigger_set(const char *tok_dir, sfi_trigger_set *ts, sfi_error *err)
{
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_vocab *voc = NULL;
    memset(ts, 0, sizeof *ts);
    sfi_status st = sfi_vocab_load(tok_dir, &voc, err);
    if (!st)
        st = sfi_trigger_set_build(voc, prm.trigger_chars, ts, err);
    sfi_vocab_free(voc);
    return st;
}

sfi_status sfi_sv_replay(const sfi_step_meas *m, const char *trace_path, const sfi_trigger_set *ts,
                         sfi_sv_mix *mix, sfi_error *err)
{
    memset(mix, 0, sizeof *mix);
    mix->batch = m->batch;
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_status st;
    sfi_trace *t = NULL;
    if ((st = sfi_trace_open(trace_path, &t, err)))
        return st;
    const int B = m->batch, T = m->new_tokens, n_force = T - 1;
    int64_t nr = sfi_trace_n_requests(t);
    if (nr > REPLAY_MAX_REQ)
        nr = REPLAY_MAX_REQ;
    /* kinds[b][t], step t of slot b */
    uint8_t *kind = calloc((size_t)B * T, 1);
    if (!kind || nr < 1)
        st = kind ? sfi_error_set(err, SFI_EFORMAT, "%s: no requests", trace_path)
                  : sfi_error_set(err, SFI_ENOMEM, "out of memory");
    for (int64_t i = 0; i < nr && i < B && !st; i++) {
        sfi_trace_request r;
        sfi_trace_steps s;
        if ((st = sfi_trace_read_request(t, i, &r, err)))
            break;
        if ((st = sfi_trace_read_steps(t, i, &s, err))) {
            sfi_trace_request_free(&r);
            break;
        }
        int64_t total = r.n_prompt + s.n, p = m->context;
        int copies = (int)((B - 1 - i) / nr) + 1;
        int64_t spare = total - p - n_force;
        if (spare < 0)
            st = sfi_error_set(err, SFI_ERANGE,
                               "%s: request %lld has %lld tokens, fewer than context + steps",
                               trace_path, (long long)i, (long long)total);
        int64_t stride = copies > 1 ? spare / (copies - 1) : 0;
        if (stride > REPLAY_MAX_STRIDE)
            stride = REPLAY_MAX_STRIDE;
        for (int k = 0; k < copies && !st; k++) {
            int64_t b = i + (int64_t)k * nr, off = k * stride;
            sfi_trigger_policy tp;
            sfi_trigger_policy_init(&tp, SFI_TRIG_SFI, &prm, ts->is_trigger, ts->n_vocab, 16);
            for (int step = 0; step < T; step++) {
                /* step t's input (and the trigger's x_{t-1}) is forced
                 * token t - 1 of the stream after the prompt */
                int64_t at = off + p + step - 1;
                int32_t prev = step == 0         ? -1
                               : at < r.n_prompt ? r.prompt[at]
                                                 : s.token[at - r.n_prompt];
                kind[b * T + step] = sfi_trigger_next(&tp, prev, NULL) == SFI_STEP_SLOW;
            }
        }
        sfi_trace_steps_free(&s);
        sfi_trace_request_free(&r);
    }
    sfi_trace_close(t);
    if (!st) {
        for (int step = FIRST_TIMED; step < T; step++) {
            int ns = 0;
            for (int b = 0; b < B; b++)
                ns += kind[(size_t)b * T + step];
            mix->hist[ns]++;
        }
        mix->replayed = 1;
    }
    free(kind);
    return st;
}

/* ---- prediction ---- */

/* KV heads one GPU of a tensor-parallel group holds (sfi_cost's rule). */
static int sv_kv_heads(const sfi_model_config *mc, int tp)
{
    int kv = mc->num_key_value_heads;
    return kv >= tp ? kv / tp : 1;
}

int sfi_sv_moe_pair_reads = 1;

void sfi_sv_setup(const sfi_step_meas *m, const sfi_model_config *mc, const sfi_hw_profile *p,
                  const sfi_gpu *gpu, sfi_cost_setup *out)
{
    sfi_cost_setup s;
    sfi_cost_setup_init(&s);
    s.model = mc;
    s.gpu = *gpu;
    s.prof = *p;
    s.batch = m->batch;
    /* the timed steps' mean context (step t holds context + t positions;
     * every term is linear in the context) */
    s.context = m->context + (FIRST_TIMED + m->new_tokens - 1) / 2;
    s.weight_bytes = s.kv_bytes = m->dtype_bytes;
    /* sfi-gpu launches with PDL in SFI mode, without in dense mode */
    if (m->sfi && p->launch_pdl_s > 0)
        s.prof.launch_s = p->launch_pdl_s;
    s.kind = m->sfi ? SFI_POLICY_SFI : SFI_POLICY_FULL;
    /* sfi-gpu's engine (gpu/sfi_gpu_engine.c): one attention launch for
     * slow and fast requests; an MoE layer launches norm, QKV, q/k norm +
     * RoPE, O, norm, router, routing, gate/up per pair, SwiGLU, down per
     * pair and the weighted combine */
    s.mixed_attention = 1;
    s.moe_launches = 11;
    /* sfi-gpu's MoE routing (gpu/sfi_gpu_model.cu moe_route_kernel): a
     * thread per token picks its top experts by repeated selection, each
     * pick a pass of dependent compares over the E experts */
    if (mc->arch == SFI_ARCH_QWEN3_MOE)
        s.moe_route_steps = mc->num_experts * mc->num_experts_per_tok;
    s.moe_pair_reads = sfi_sv_moe_pair_reads;
    /* its expert GEMV (moe_gemv_kernel: a warp per weight row, 16-byte
     * loads, 64 CTAs per (token, expert) pair) is a plain stream of the
     * experts' rows, as the dense attention is of K/V rows; the decode
     * GEMMs' efficiency is that of their own tiled, split-K kernels */
    s.moe_stream = 1;
    /* its decode GEMMs: the slab kernel where its rule takes a product,
     * else the register-streaming one (gemm_fixed in sfi_cost.c) */
    s.gemm_slab_rule = 1;
    /* sfi-gpu run --tp N: the run's GPUs (heads, MLP columns, experts'
     * columns and LM head split; two all-reduces of the f32 residual per
     * layer) */
    s.tp = m->tp > 0 ? m->tp : 1;
    s.allreduce_bytes = 4;
    /* SFI mode splits every request's rows into pieces of about a fast
     * step's rows (gpu/sfi_gpu_engine.c: min_split_rows); when the
     * (request, KV head) pairs fill at most half the SMs, fast requests
     * are cut finer, into pieces that spread them over the SMs once (at
     * least 256 rows), while slow requests keep the large pieces
     * (attn_ws.dense_min_rows, fast_splits). Since 2026-11-26 the engine
     * cuts slow requests as finely where the other requests' fast rows
     * are over three times a request's capacity, and reports both sizes
     * ("attn_split_rows"): an entry that has them is priced at them, one
     * without (measured before) at the rule above */
    if (m->sfi) {
        int mr = s.pol.prm.n_sink + s.pol.prm.K + s.pol.prm.n_recent;
        int msr = mr < 1024 ? 1024 : (mr + 63) / 64 * 64;
        s.attn_split_rows = msr;
        long pairs = (long)m->batch * sv_kv_heads(mc, s.tp);
        int sms = gpu->sm_count;
        if (sms > 0 && 2 * pairs <= sms) {
            long per = (sms + pairs - 1) / pairs;
            int r = (int)(((mr + per - 1) / per + 63) / 64 * 64);
            if (r < 256)
                r = 256;
            if (r < msr)
                s.attn_fast_split_rows = r;
        }
        if (m->split_fast > 0) {
            s.attn_fast_split_rows = m->split_fast < msr ? m->split_fast : 0;
            s.attn_split_rows = m->split_slow;
        }
    }
    /* At tp > 1 the Selector's cross-head step all-gathers the scores of
     * the graph's capacity, J_cap = round_up(context + new_tokens - 1 -
     * n_sink - n_recent, 4) positions (gpu/sfi_gpu_engine.c: capJ), on the
     * main stream (every collective on one stream): steps 1-7 on the side
     * stream beside the layer's O projection and MLP, the all-gather after
     * them, step 8, Top-K and reorg on the side stream again
     * (tp_chain_rest); a step without slow requests replays a graph
     * without the chain. The greedy argmax all-gathers each GPU's best of
     * its vocabulary rows. "overlap": false puts the chain on the main
     * stream. */
    s.side_serial = m->no_overlap;
    s.no_selector = m->no_selector;
    if (s.tp > 1) {
        int j = m->context + m->new_tokens - 1 - s.pol.prm.n_sink - s.pol.prm.n_recent;
        s.sel_gather_positions = ((j > 1 ? j : 1) + 3) & ~3;
        s.sel_split_gather = !m->no_overlap;
        s.argmax_gather = 1;
    }
    *out = s;
}

void sfi_sv_comm_bytes(const sfi_step_meas *m, const sfi_model_config *mc, double *allreduce,
                       double *gather)
{
    sfi_cost_setup s;
    sfi_hw_profile p;
    sfi_gpu g;
    sfi_hw_profile_default(&p);
    memset(&g, 0, sizeof g);
    sfi_sv_setup(m, mc, &p, &g, &s);
    sfi_cost_comm_bytes(&s, m->batch, allreduce, gather);
}

sfi_status sfi_sv_predict(const sfi_step_meas *m, const sfi_model_config *mc,
                          const sfi_hw_profile *p, const sfi_gpu *gpu, const sfi_sv_mix *mix,
                          sfi_sv_pred *out, sfi_error *err)
{
    memset(out, 0, sizeof *out);
    sfi_cost_setup s;
    sfi_sv_setup(m, mc, p, gpu, &s);
    sfi_step_cost c;
    sfi_status st = sfi_cost_step(&s, 0, &c, err);
    if (st)
        return st;
    if (!m->sfi) {
        out->t[SFI_SV_DENSE] = c.time_s;
        out->tps = m->batch / c.time_s;
        return SFI_OK;
    }
    out->t[SFI_SV_FAST] = c.time_s;
    double tot = 0, n_all = 0, slow_t = 0, n_slow = 0;
    for (int k = 0; k <= m->batch; k++) {
        if (!mix->hist[k])
            continue;
        double tk = c.time_s;
        if (k > 0) {
            sfi_step_cost ck;
            if ((st = sfi_cost_step(&s, k, &ck, err)))
                return st;
            tk = ck.time_s;
            slow_t += mix->hist[k] * tk;
            n_slow += mix->hist[k];
        }
        tot += mix->hist[k] * tk;
        n_all += mix->hist[k];
    }
    out->t[SFI_SV_SLOW] = n_slow > 0 ? slow_t / n_slow : 0;
    out->tps = tot > 0 ? m->batch * n_all / tot : 0;
    return SFI_OK;
}

/* ---- parameters ---- */

static const char *const param_names[SFI_SV_NPARAM] = {
    "attn_dense efficiency", "attn_sparse efficiency", "gemm efficiency",   "launch_us",
    "launch_pdl_us",         "overlap_contention",     "cta_GBps",          "cta_GFLOPS",
    "serial_step_ns",        "step_overhead_us",       "allreduce_step_us", "sel_pre_us",
    "gemm fixed_us"};

static const char *const param_keys[SFI_SV_NPARAM] = {
    "attn_dense",         "attn_sparse", "gemm",         "launch_us",      "launch_pdl_us",
    "overlap_contention", "cta_GBps",    "cta_GFLOPS",   "serial_step_ns", "step_overhead_us",
    "allreduce_step_us",  "sel_pre_us",  "gemm_fixed_us"};

const char *sfi_sv_param_name(int i)
{
    return i >= 0 && i < SFI_SV_NPARAM ? param_names[i] : "?";
}

const char *sfi_sv_param_key(int i)
{
    return i >= 0 && i < SFI_SV_NPARAM ? param_keys[i] : "?";
}

int sfi_sv_param_lookup(const char *key)
{
    for (int i = 0; i < SFI_SV_NPARAM; i++)
        if (!strcmp(key, param_keys[i]))
            return i;
    return -1;
}

double sfi_sv_param_get(const sfi_hw_profile *p, int i)
{
    switch (i) {
    case SFI_SV_P_ATTN_DENSE: return p->efficiency[SFI_KC_ATTN_DENSE];
    case SFI_SV_P_ATTN_SPARSE: return p->efficiency[SFI_KC_ATTN_SPARSE];
    case SFI_SV_P_GEMM: return p->efficiency[SFI_KC_GEMM];
    case SFI_SV_P_LAUNCH: return p->launch_s * 1e6;
    case SFI_SV_P_LAUNCH_PDL: return p->launch_pdl_s * 1e6;
    case SFI_SV_P_CONTENTION: return p->overlap_contention;
    case SFI_SV_P_CTA: return p->cta_bandwidth * 1e-9;
    case SFI_SV_P_CTA_FLOPS: return p->cta_flops * 1e-9;
    case SFI_SV_P_SERIAL: return p->serial_step_s * 1e9;
    case SFI_SV_P_STEP: return p->step_overhead_s * 1e6;
    case SFI_SV_P_AR_STEP: return p->allreduce_step_s * 1e6;
    case SFI_SV_P_SEL_PRE: return p->sel_pre_s * 1e6;
    case SFI_SV_P_GEMM_FIXED: return p->fixed_s[SFI_KC_GEMM] * 1e6;
    default: return 0;
    }
}

void sfi_sv_param_set(sfi_hw_profile *p, int i, double v)
{
    switch (i) {
    case SFI_SV_P_ATTN_DENSE: p->efficiency[SFI_KC_ATTN_DENSE] = v > 1 ? 1 : v; break;
    case SFI_SV_P_ATTN_SPARSE: p->efficiency[SFI_KC_ATTN_SPARSE] = v > 1 ? 1 : v; break;
    case SFI_SV_P_GEMM: p->efficiency[SFI_KC_GEMM] = v > 1 ? 1 : v; break;
    case SFI_SV_P_LAUNCH: p->launch_s = v * 1e-6; break;
    case SFI_SV_P_LAUNCH_PDL: p->launch_pdl_s = v * 1e-6; break;
    case SFI_SV_P_CONTENTION: p->overlap_contention = v < 0 ? 0 : v > 1 ? 1 : v; break;
    case SFI_SV_P_CTA: p->cta_bandwidth = v * 1e9; break;
    case SFI_SV_P_CTA_FLOPS: p->cta_flops = v * 1e9; break;
    case SFI_SV_P_SERIAL: p->serial_step_s = v * 1e-9; break;
    case SFI_SV_P_STEP: p->step_overhead_s = v * 1e-6; break;
    case SFI_SV_P_AR_STEP: p->allreduce_step_s = v * 1e-6; break;
    case SFI_SV_P_SEL_PRE: p->sel_pre_s = v * 1e-6; break;
    case SFI_SV_P_GEMM_FIXED: p->fixed_s[SFI_KC_GEMM] = v * 1e-6; break;
    default: break;
    }
}

/* Fit coordinates: log of the value (positive parameters), the value
 * itself for the contention (a share in [0, 1] that may be 0). */
static double to_x(int i, double v)
{
    return i == SFI_SV_P_CONTENTION ? v : log(v > 1e-9 ? v : 1e-9);
}

static double from_x(int i, double x)
{
    return i == SFI_SV_P_CONTENTION ? x : exp(x);
}

/* Relative errors of the fitted measurements' classes (or tokens/s where
 * no class time was kept) under p; r == NULL counts them. */
static int residuals(const sfi_step_meas *ms, const sfi_model_config *mcs, const sfi_sv_mix *mixes,
                     const int *in_fit, size_t n, const sfi_gpu *gpu, const sfi_hw_profile *p,
                     double *r, sfi_error *err)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in_fit[i] || ms[i].variant)
            continue;
        sfi_sv_pred pr;
        if (r && sfi_sv_predict(&ms[i], &mcs[i], p, gpu, &mixes[i], &pr, err))
            return -1;
        int any = 0;
        for (int c = 0; c < SFI_SV_NCLASS; c++)
            if (ms[i].cls[c].have) {
                if (r)
                    r[k] = pr.t[c] / ms[i].cls[c].mean_s - 1;
                k++;
                any = 1;
            }
        if (!any) {
            if (r)
                r[k] = pr.tps / ms[i].tps - 1;
            k++;
        }
    }
    return k;
}

/* Solves the n x n system A x = b (A symmetric positive definite after
 * damping) by Gaussian elimination with partial pivoting; 0 on success. */
static int solve(double *A, double *b, int n)
{
    for (int i = 0; i < n; i++) {
        int piv = i;
        for (int r = i + 1; r < n; r++)
            if (fabs(A[r * n + i]) > fabs(A[piv * n + i]))
                piv = r;
        if (fabs(A[piv * n + i]) < 1e-300)
            return -1;
        for (int c = 0; c < n; c++) {
            double t = A[i * n + c];
            A[i * n + c] = A[piv * n + c];
            A[piv * n + c] = t;
        }
        double t = b[i];
        b[i] = b[piv];
        b[piv] = t;
        for (int r = 0; r < n; r++) {
            if (r == i)
                continue;
            double f = A[r * n + i] / A[i * n + i];
            for (int c = i; c < n; c++)
                A[r * n + c] -= f * A[i * n + c];
            b[r] -= f * b[i];
        }
    }
    for (int i = 0; i < n; i++)
        b[i] /= A[i * n + i];
    return 0;
}

/* Run-to-run noise of a measured mean step time (relative), and the
 * largest standard error (of the parameter's log) that counts as
 * identified. */
#define SIGMA_NOISE 0.01
/* Where the fit starts the per-CTA bandwidth (GB/s) when the prior has
 * none: about a 132-SM H100's copy bandwidth over its SMs, twice. */
#define CTA_START 50.0
#define SE_MAX 0.25
/* Where the fit starts the per-CTA FLOP rate (GFLOP/s) when the prior has
 * none: half an SM's FP32 FMA rate (128 lanes at 1.755 GHz). */
#define CTA_FLOPS_START 225.0
/* Where the fit starts a serial step (ns) when the prior has none: an
 * L1-missing load's round trip on a GPU, a few hundred cycles. */
#define SERIAL_START 100.0
/* Where the fit starts a decode GEMM's fixed cost (us) when the prior has
 * none: about one launch. */
#define GEMM_FIXED_START 2.0
/* Where the fit starts an all-reduce's extra inside a step (us) when the
 * prior has none: what one all-reduce left out of a step saved beyond its
 * time alone (2 x H100, sfi-gpu SFI_GPU_SKIP=allreduce: 9.9 us against
 * 7.1). From a much smaller start its slope is below what 1% noise lets
 * the fit see. */
#define AR_STEP_START 2.8
/* Where the fit starts the Selector's steps 1-7 before a slow step's
 * all-gather (us) when the prior has none: half of what ncu gave their
 * kernel alone for one slow request (H100, Qwen3-0.6B, 24.8-26.5 us at 8K
 * and 32K alike). */
#define SEL_PRE_START 12.0

/* What a fit runs over, and its scratch: the residuals at the current
 * point (r0), at a trial point (r1), and their Jacobian. */
typedef struct {
    const sfi_step_meas *ms;
    const sfi_model_config *mcs;
    const sfi_sv_mix *mixes;
    const int *in_fit;
    size_t n;
    const sfi_gpu *gpu;
    int m;               /* residuals */
    double *r0, *r1, *J; /* [m], [m], [m][SFI_SV_NPARAM] */
} fit_data;

/* The residuals of profile p into r, and their sum of squares into *ss
 * (may be NULL). */
static sfi_status fit_resid(const fit_data *d, const sfi_hw_profile *p, double *r, double *ss,
                            sfi_error *err)
{
    if (residuals(d->ms, d->mcs, d->mixes, d->in_fit, d->n, d->gpu, p, r, err) < 0)
        return err->code ? err->code : SFI_EINVAL;
    if (ss) {
        double s = 0;
        for (int k = 0; k < d->m; k++)
            s += r[k] * r[k];
        *ss = s;
    }
    return SFI_OK;
}

/* The parameters a prior may lack (0: none): the fit starts them at
 * own_start's value and puts those the subset cannot determine back to
 * the prior's (fit_start, fit_hold). One list, so that a new one is
 * added to both. */
static const int own_params[] = {SFI_SV_P_CTA,       SFI_SV_P_CTA_FLOPS, SFI_SV_P_LAUNCH_PDL,
                                 SFI_SV_P_SERIAL,    SFI_SV_P_AR_STEP,   SFI_SV_P_SEL_PRE,
                                 SFI_SV_P_GEMM_FIXED};

static double own_start(int j, const sfi_sv_fit *out)
{
    switch (j) {
    case SFI_SV_P_CTA: return CTA_START;
    case SFI_SV_P_CTA_FLOPS: return CTA_FLOPS_START;
    case SFI_SV_P_SERIAL: return SERIAL_START;
    case SFI_SV_P_AR_STEP: return AR_STEP_START;
    case SFI_SV_P_SEL_PRE: return SEL_PRE_START;
    case SFI_SV_P_GEMM_FIXED: return GEMM_FIXED_START;
    case SFI_SV_P_LAUNCH_PDL: return out->value[SFI_SV_P_LAUNCH]; /* what other launches cost */
    default: return 0;
    }
}

/* The starting point: priors recorded (*prior_p: the profile they come
 * from), and a start for the parameters that have none. */
static void fit_start(sfi_hw_profile *p, sfi_sv_fit *out, sfi_hw_profile *prior_p)
{
    /* The attention classes' fixed costs are the launch cost's: one cost
     * per kernel, fitted or held. The GEMMs' is a parameter of its own
     * (SFI_SV_P_GEMM_FIXED), which only steps at more than one tp
     * determine. */
    p->fixed_s[SFI_KC_ATTN_DENSE] = p->fixed_s[SFI_KC_ATTN_SPARSE] = 0;
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        out->prior[j] = out->value[j] = sfi_sv_param_get(p, j);
    /* no per-CTA limit in the prior: the fit starts from one (CTA_START),
     * dropped again when the subset cannot determine it */
    *prior_p = *p;
    /* likewise the other parameters a prior may lack (own_params) */
    for (size_t q = 0; q < sizeof own_params / sizeof own_params[0]; q++)
        if (!(out->prior[own_params[q]] > 0)) {
            out->value[own_params[q]] = own_start(own_params[q], out);
            sfi_sv_param_set(p, own_params[q], out->value[own_params[q]]);
        }
}

/* The Jacobian J of the residuals r0 (at p, parameters x) by forward
 * differences. */
static sfi_status fit_jacobian(const fit_data *d, const sfi_hw_profile *p, const double *x,
                               sfi_error *err)
{
    for (int j = 0; j < SFI_SV_NPARAM; j++) {
        sfi_hw_profile q = *p;
        double h = j == SFI_SV_P_CONTENTION ? 1e-3 : 1e-4;
        double xj = x[j] + (j == SFI_SV_P_CONTENTION && x[j] + h > 1 ? -h : h);
        sfi_sv_param_set(&q, j, from_x(j, xj));
        sfi_status st = fit_resid(d, &q, d->r1, NULL, err);
        if (st)
            return st;
        for (int k = 0; k < d->m; k++)
            d->J[k * SFI_SV_NPARAM + j] = (d->r1[k] - d->r0[k]) / (xj - x[j]);
    }
    return SFI_OK;
}

/* Identification: the standard errors of the parameters at the
 * measurement noise SIGMA_NOISE, from (J'J)^-1 over the parameters still
 * in; while one exceeds SE_MAX, the worst is held at its prior and the
 * rest are tried again. */
static void fit_identify(const fit_data *d, sfi_sv_fit *out)
{
    const double *J = d->J;
    const int m = d->m;
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        out->identified[j] = !out->asked_held[j];
    for (;;) {
        int idx[SFI_SV_NPARAM], np = 0, worst = -1;
        double worst_se = 0;
        for (int j = 0; j < SFI_SV_NPARAM; j++)
            if (out->identified[j])
                idx[np++] = j;
        for (int a = 0; a < np; a++) {
            double A[SFI_SV_NPARAM * SFI_SV_NPARAM], e[SFI_SV_NPARAM];
            for (int u = 0; u < np; u++) {
                e[u] = u == a;
                for (int v = 0; v < np; v++) {
                    double sum = 0;
                    for (int k = 0; k < m; k++)
                        sum += J[k * SFI_SV_NPARAM + idx[u]] * J[k * SFI_SV_NPARAM + idx[v]];
                    A[u * np + v] = sum;
                }
            }
            double se = solve(A, e, np) || !(e[a] > 0) ? INFINITY : SIGMA_NOISE * sqrt(e[a]);
            out->se[idx[a]] = se;
            if (se > SE_MAX && se >= worst_se) {
                worst_se = se;
                worst = idx[a];
            }
        }
        if (worst < 0)
            break;
        out->identified[worst] = 0;
    }
}

/* The parameters without a prior of their own that the subset cannot
 * determine go back to none (no per-CTA limit; PDL launches cost what
 * others do). */
static void fit_hold(sfi_hw_profile *p, const sfi_hw_profile *prior_p, const sfi_sv_fit *out,
                     double *x)
{
    for (size_t q = 0; q < sizeof own_params / sizeof own_params[0]; q++) {
        const int j = own_params[q];
        if (!out->identified[j]) {
            sfi_sv_param_set(p, j, sfi_sv_param_get(prior_p, j));
            x[j] = to_x(j, sfi_sv_param_get(p, j));
        }
    }
}

/* One Levenberg-Marquardt step over the identified parameters from p
 * (parameters x, residuals r0 with sum of squares s0), damping *lambda
 * adapted. Returns 1 when it improved, 2 when by too little to go on, 0
 * when it did not (or nothing is identified); *st an error. */
static int fit_lm_step(const fit_data *d, const sfi_sv_fit *out, sfi_hw_profile *p, double *x,
                       double *lambda, double s0, sfi_status *st, sfi_error *err)
{
    const double *J = d->J, *r0 = d->r0;
    const int m = d->m;
    int idx[SFI_SV_NPARAM], np = 0;
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        if (out->identified[j])
            idx[np++] = j;
    if (!np)
        return 0;
    int improved = 0;
    for (int tries = 0; tries < 12 && !improved; tries++) {
        double A[SFI_SV_NPARAM * SFI_SV_NPARAM], g[SFI_SV_NPARAM];
        for (int a = 0; a < np; a++) {
            g[a] = 0;
            for (int k = 0; k < m; k++)
                g[a] -= J[k * SFI_SV_NPARAM + idx[a]] * r0[k];
            for (int b = 0; b < np; b++) {
                double s = 0;
                for (int k = 0; k < m; k++)
                    s += J[k * SFI_SV_NPARAM + idx[a]] * J[k * SFI_SV_NPARAM + idx[b]];
                A[a * np + b] = s * (a == b ? 1 + *lambda : 1);
            }
        }
        if (solve(A, g, np))
            break;
        sfi_hw_profile q = *p;
        double xn[SFI_SV_NPARAM];
        memcpy(xn, x, sizeof xn);
        for (int a = 0; a < np; a++) {
            xn[idx[a]] += g[a];
            sfi_sv_param_set(&q, idx[a], from_x(idx[a], xn[idx[a]]));
            xn[idx[a]] = to_x(idx[a], sfi_sv_param_get(&q, idx[a])); /* clamped */
        }
        double s1;
        if ((*st = fit_resid(d, &q, d->r1, &s1, err)))
            return 0;
        if (s1 < s0) {
            *p = q;
            memcpy(x, xn, sizeof xn);
            *lambda = *lambda / 10 > 1e-9 ? *lambda / 10 : 1e-9;
            improved = s0 - s1 > 1e-12 * s0 ? 1 : 2;
        } else {
            *lambda *= 10;
        }
    }
    return improved;
}

sfi_status sfi_sv_fit_run(const sfi_step_meas *ms, const sfi_model_config *mcs,
                          const sfi_sv_mix *mixes, const int *in_fit, size_t n, const sfi_gpu *gpu,
                          sfi_hw_profile *p, sfi_sv_fit *out, sfi_error *err)
{
    return sfi_sv_fit_run_some(ms, mcs, mixes, in_fit, n, gpu, NULL, p, out, err);
}

sfi_status sfi_sv_fit_run_some(const sfi_step_meas *ms, const sfi_model_config *mcs,
                               const sfi_sv_mix *mixes, const int *in_fit, size_t n,
                               const sfi_gpu *gpu, const int *free_params, sfi_hw_profile *p,
                               sfi_sv_fit *out, sfi_error *err)
{
    memset(out, 0, sizeof *out);
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        out->asked_held[j] = free_params && !free_params[j];
    fit_data d = {ms, mcs, mixes, in_fit, n, gpu, 0, NULL, NULL, NULL};
    d.m = residuals(ms, mcs, mixes, in_fit, n, gpu, p, NULL, err);
    if (d.m < 1)
        return sfi_error_set(err, SFI_EINVAL,
                             "the fit subset holds no measurement (variants are not fitted)");
    sfi_hw_profile prior_p;
    fit_start(p, out, &prior_p);
    d.r0 = malloc(sizeof(double) * d.m);
    d.r1 = malloc(sizeof(double) * d.m);
    d.J = malloc(sizeof(double) * d.m * SFI_SV_NPARAM);
    sfi_status st = SFI_OK;
    if (!d.r0 || !d.r1 || !d.J) {
        st = sfi_error_set(err, SFI_ENOMEM, "out of memory");
        goto done;
    }
    double x[SFI_SV_NPARAM];
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        x[j] = to_x(j, out->value[j]);
    double lambda = 1e-3;
    for (int it = 0; it < 200; it++) {
        double s0;
        if ((st = fit_resid(&d, p, d.r0, &s0, err)) || (st = fit_jacobian(&d, p, x, err)))
            goto done;
        if (it == 0) {
            fit_identify(&d, out);
            fit_hold(p, &prior_p, out, x);
            /* the held parameters are back at their priors: the residuals
             * and their slopes there, not at the starting point */
            if ((st = fit_resid(&d, p, d.r0, &s0, err)) || (st = fit_jacobian(&d, p, x, err)))
                goto done;
        }
        int improved = fit_lm_step(&d, out, p, x, &lambda, s0, &st, err);
        if (st)
            goto done;
        if (improved != 1)
            break;
    }
    double s;
    if ((st = fit_resid(&d, p, d.r0, &s, err)))
        goto done;
    out->rms = sqrt(s / d.m);
    out->n_resid = d.m;
    for (int j = 0; j < SFI_SV_NPARAM; j++)
        out->value[j] = sfi_sv_param_get(p, j);
done:
    free(d.r0);
    free(d.r1);
    free(d.J);
    return st;
}

/* ---- subsets ---- */

static int match_term(const char *key, size_t kl, const char *vals, size_t vl,
                      const sfi_step_meas *m, sfi_error *err)
{
    char v[128];
    int hit = 0;
    const char *p = vals, *end = vals + vl;
    while (p <= end) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        if (!c)
            c = end;
        size_t n = (size_t)(c - p);
        if (!n || n >= sizeof v)
            return sfi_error_set(err, SFI_EINVAL, "--fit-subset: empty or too long value"), -1;
        memcpy(v, p, n);
        v[n] = 0;
        if (kl == 5 && !strncmp(key, "model", 5)) {
            hit |= !strcasecmp(v, m->model);
        } else if (kl == 4 && !strncmp(key, "mode", 4)) {
            if (strcmp(v, "sfi") && strcmp(v, "dense"))
                return sfi_error_set(err, SFI_EINVAL, "--fit-subset: mode=%s: sfi or dense", v), -1;
            hit |= (strcmp(v, "sfi") == 0) == m->sfi;
        } else if ((kl == 5 && !strncmp(key, "batch", 5)) ||
                   (kl == 7 && !strncmp(key, "context", 7)) ||
                   (kl == 2 && !strncmp(key, "tp", 2))) {
            char *e;
            long x = strtol(v, &e, 10);
            if (*e == 'K' || *e == 'k') {
                x *= 1024;
                e++;
            }
            if (*e || x < 1)
                return sfi_error_set(err, SFI_EINVAL, "--fit-subset: %.*s=%s: not a count", (int)kl,
                                     key, v),
                       -1;
            hit |= x == (key[0] == 'b' ? m->batch : key[0] == 't' ? m->tp : m->context);
        } else {
            return sfi_error_set(
                       err, SFI_EINVAL,
                       "--fit-subset: unknown key '%.*s' (model, batch, context, mode, tp)",
                       (int)kl, key),
                   -1;
        }
        p = c + 1;
    }
    return hit;
}

int sfi_sv_subset_match(const char *spec, const sfi_step_meas *m, sfi_error *err)
{
    int all = 1;
    const char *p = spec;
    if (!*p)
        return sfi_error_set(err, SFI_EINVAL, "--fit-subset: empty"), -1;
    while (*p) {
        const char *c = strchr(p, ':');
        if (!c)
            c = p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(c - p));
        if (!eq || eq == p || eq + 1 == c)
            return sfi_error_set(err, SFI_EINVAL, "--fit-subset: '%.*s' is not KEY=VALUE",
                                 (int)(c - p), p),
                   -1;
        int h = match_term(p, (size_t)(eq - p), eq + 1, (size_t)(c - eq - 1), m, err);
        if (h < 0)
            return -1;
        all &= h;
        p = *c ? c + 1 : c;
    }
    return all;
}
