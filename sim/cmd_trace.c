/* sfi-sim trace check|info FILE: validate a trace database or summarize
 * it (counts, slow-step fraction, context range, levels present). */
#include <config.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_sim_cli.h"
#include "sfi_trace.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-sim trace check [--complete] FILE\n"
                 "       sfi-sim trace info [--json] FILE\n\n"
                 "check  reads and validates every row of the trace (schema version, types,\n"
                 "       ranges, step order, blob sizes, record shapes); prints one line and\n"
                 "       exits 0 when valid, 1 with a message naming the problem otherwise.\n"
                 "       --complete also requires the writer to have finished (complete = 1).\n"
                 "info   prints the trace's meta data, counts, slow-step fraction by reason,\n"
                 "       prompt and context ranges and the levels present; --json as a JSON\n"
                 "       object.\n\n"
                 "The format is described in sfi-trace(5).\n");
}

/* Names of ref/sfi_state.h's enums, kept here so that sfi-sim trace works
 * on its own (values are the on-disk integers). */
static const char *const kind_names[3] = {"prefill", "slow", "fast"};
static const char *const reason_names[7] = {"none",     "first",  "trigger", "tmax",
                                            "interval", "always", "prompt"};

typedef struct {
    int64_t n_requests, n_steps;
    int64_t by_kind[3], by_reason[7];
    int64_t prompt_min, prompt_max, ctx_min, ctx_max, steps_min, steps_max;
} stats;

static int gather(sfi_trace *t, stats *s, sfi_error *e)
{
    memset(s, 0, sizeof *s);
    s->n_requests = sfi_trace_n_requests(t);
    s->prompt_min = s->ctx_min = s->steps_min = INT64_MAX;
    for (int64_t r = 0; r < s->n_requests; r++) {
        sfi_trace_request rq;
        if (sfi_trace_read_request(t, r, &rq, e))
            return 1;
        if (rq.n_prompt < s->prompt_min)
            s->prompt_min = rq.n_prompt;
        if (rq.n_prompt > s->prompt_max)
            s->prompt_max = rq.n_prompt;
        sfi_trace_request_free(&rq);
        sfi_trace_steps st;
        if (sfi_trace_read_steps(t, r, &st, e))
            return 1;
        if (st.n < s->steps_min)
            s->steps_min = st.n;
        if (st.n > s->steps_max)
            s->steps_max = st.n;
        for (int64_t i = 0; i < st.n; i++) {
            s->by_kind[st.kind[i]]++;
            s->by_reason[st.reason[i]]++;
            if (st.ctx_len[i] < s->ctx_min)
                s->ctx_min = st.ctx_len[i];
            if (st.ctx_len[i] > s->ctx_max)
                s->ctx_max = st.ctx_len[i];
        }
        s->n_steps += st.n;
        sfi_trace_steps_free(&st);
    }
    if (!s->n_requests)
        s->prompt_min = s->steps_min = 0;
    if (!s->n_steps)
        s->ctx_min = 0;
    return 0;
}

static const char *levels_present(sfi_trace *t, char *buf, size_t n)
{
    snprintf(buf, n, "tokens%s%s",
             sfi_trace_n_selections(t) || sfi_trace_n_fast_mass(t) ? ",summary" : "",
             sfi_trace_n_topm(t) || sfi_trace_n_snapshots(t) ? ",full" : "");
    return buf;
}

static int info_text(sfi_trace *t, const stats *s)
{
    const sfi_trace_meta *m = sfi_trace_get_meta(t);
    char lv[64];
    printf("file:          %s\n", sfi_trace_path(t));
    printf("schema:        %d.%d\n", SFI_TRACE_SCHEMA_MAJOR, sfi_trace_schema_minor(t));
    printf("tool:          %s %s\n", m->tool, m->tool_version);
    printf("created:       %s\n", sfi_trace_created(t));
    printf("complete:      %s\n", sfi_trace_complete(t) ? "yes" : "no (writer did not finish)");
    printf("level:         %s (records present: %s)\n", sfi_trace_level_name(m->level),
           levels_present(t, lv, sizeof lv));
    printf("policy:        %s\n", *m->policy ? m->policy : "(none)");
    printf("tokenizer:     %s\n", *m->tokenizer ? m->tokenizer : "(none)");
    printf("model:         vocab %d, layers %d, heads %d, kv heads %d, head dim %d\n", m->n_vocab,
           m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim);
    printf("requests:      %lld\n", (long long)s->n_requests);
    printf("prompt length: %lld..%lld\n", (long long)s->prompt_min, (long long)s->prompt_max);
    printf("steps:         %lld (per request %lld..%lld)\n", (long long)s->n_steps,
           (long long)s->steps_min, (long long)s->steps_max);
    printf("context:       %lld..%lld\n", (long long)s->ctx_min, (long long)s->ctx_max);
    double den = s->n_steps ? (double)s->n_steps : 1.0;
    printf("slow steps:    %lld (fraction %.4f)\n", (long long)s->by_kind[SFI_STEP_SLOW],
           (double)s->by_kind[SFI_STEP_SLOW] / den);
    for (int r = 1; r < 7; r++)
        if (s->by_reason[r])
            printf("  %-12s %lld\n", reason_names[r], (long long)s->by_reason[r]);
    printf("fast steps:    %lld\n", (long long)s->by_kind[SFI_STEP_FAST]);
    if (s->by_kind[SFI_STEP_PREFILL])
        printf("prefill steps: %lld\n", (long long)s->by_kind[SFI_STEP_PREFILL]);
    if (m->level >= SFI_TRACE_SUMMARY)
        printf("summary:       %lld selections, %lld fast-mass records\n",
               (long long)sfi_trace_n_selections(t), (long long)sfi_trace_n_fast_mass(t));
    char *layers = NULL;
    if (m->level >= SFI_TRACE_SUMMARY &&
        sfi_trace_get_meta_value(t, "layers_recorded", &layers, NULL) == SFI_OK)
        printf("layers:        %s recorded (of %d)\n", layers, m->n_layers);
    free(layers);
    if (m->level >= SFI_TRACE_FULL)
        printf("full:          %lld top-M records (M = %d, %s heads), %lld snapshots\n",
               (long long)sfi_trace_n_topm(t), m->top_m,
               m->topm_heads == SFI_TRACE_HEADS_KV ? "kv" : "query",
               (long long)sfi_trace_n_snapshots(t));
    return 0;
}

static int info_json(sfi_trace *t, const stats *s)
{
    const sfi_trace_meta *m = sfi_trace_get_meta(t);
    json_t *o = json_object();
    char lv[64], ver[32];
    snprintf(ver, sizeof ver, "%d.%d", SFI_TRACE_SCHEMA_MAJOR, sfi_trace_schema_minor(t));
    json_object_set_new(o, "file", json_string(sfi_trace_path(t)));
    json_object_set_new(o, "schema_version", json_string(ver));
    json_object_set_new(o, "tool", json_string(m->tool));
    json_object_set_new(o, "tool_version", json_string(m->tool_version));
    json_object_set_new(o, "created", json_string(sfi_trace_created(t)));
    json_object_set_new(o, "complete", json_boolean(sfi_trace_complete(t)));
    json_object_set_new(o, "level", json_string(sfi_trace_level_name(m->level)));
    json_t *lvl = json_array();
    levels_present(t, lv, sizeof lv);
    for (char *tok = strtok(lv, ","); tok; tok = strtok(NULL, ","))
        json_array_append_new(lvl, json_string(tok));
    json_object_set_new(o, "levels_present", lvl);
    json_object_set_new(o, "policy", json_string(m->policy));
    json_object_set_new(o, "tokenizer", json_string(m->tokenizer));
    json_t *cfg = json_loads(m->model_config_json, 0, NULL);
    json_object_set_new(o, "model_config", cfg ? cfg : json_string(m->model_config_json));
    json_t *prm = json_loads(m->params_json, 0, NULL);
    json_object_set_new(o, "params", prm ? prm : json_string(m->params_json));
    json_t *shape = json_object();
    json_object_set_new(shape, "n_vocab", json_integer(m->n_vocab));
    json_object_set_new(shape, "n_layers", json_integer(m->n_layers));
    json_object_set_new(shape, "n_heads", json_integer(m->n_heads));
    json_object_set_new(shape, "n_kv_heads", json_integer(m->n_kv_heads));
    json_object_set_new(shape, "head_dim", json_integer(m->head_dim));
    json_object_set_new(shape, "top_m", json_integer(m->top_m));
    json_object_set_new(shape, "topm_heads",
                        json_string(m->topm_heads == SFI_TRACE_HEADS_KV ? "kv" : "query"));
    json_object_set_new(o, "shape", shape);
    json_object_set_new(o, "requests", json_integer(s->n_requests));
    json_object_set_new(o, "steps", json_integer(s->n_steps));
    json_object_set_new(o, "prompt_min", json_integer(s->prompt_min));
    json_object_set_new(o, "prompt_max", json_integer(s->prompt_max));
    json_object_set_new(o, "steps_per_request_min", json_integer(s->steps_min));
    json_object_set_new(o, "steps_per_request_max", json_integer(s->steps_max));
    json_object_set_new(o, "ctx_min", json_integer(s->ctx_min));
    json_object_set_new(o, "ctx_max", json_integer(s->ctx_max));
    json_t *kinds = json_object();
    for (int k = 0; k < 3; k++)
        json_object_set_new(kinds, kind_names[k], json_integer(s->by_kind[k]));
    json_object_set_new(o, "steps_by_kind", kinds);
    json_t *reasons = json_object();
    for (int r = 0; r < 7; r++)
        json_object_set_new(reasons, reason_names[r], json_integer(s->by_reason[r]));
    json_object_set_new(o, "steps_by_reason", reasons);
    json_object_set_new(
        o, "slow_fraction",
        json_real(s->n_steps ? (double)s->by_kind[SFI_STEP_SLOW] / (double)s->n_steps : 0.0));
    json_object_set_new(o, "selections", json_integer(sfi_trace_n_selections(t)));
    json_object_set_new(o, "fast_mass", json_integer(sfi_trace_n_fast_mass(t)));
    json_object_set_new(o, "topm", json_integer(sfi_trace_n_topm(t)));
    json_object_set_new(o, "snapshots", json_integer(sfi_trace_n_snapshots(t)));
    char *layers = NULL;
    if (sfi_trace_get_meta_value(t, "layers_recorded", &layers, NULL) == SFI_OK)
        json_object_set_new(o, "layers_recorded", json_string(layers));
    free(layers);
    int rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (rc != 0) {
        fprintf(stderr, "sfi-sim trace info: cannot write JSON\n");
        return 1;
    }
    printf("\n");
    return 0;
}

int sfi_sim_cmd_trace(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    int is_check = !strcmp(argv[1], "check"), is_info = !strcmp(argv[1], "info");
    if (!is_check && !is_info) {
        fprintf(stderr, "sfi-sim trace: unknown subcommand '%s' (expected check or info)\n",
                argv[1]);
        usage(stderr);
        return 2;
    }
    int json = 0, need_complete = 0;
    const char *file = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (is_info && !strcmp(argv[i], "--json")) {
            json = 1;
        } else if (is_check && !strcmp(argv[i], "--complete")) {
            need_complete = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "sfi-sim trace %s: unknown option '%s'\n", argv[1], argv[i]);
            usage(stderr);
            return 2;
        } else if (file) {
            fprintf(stderr, "sfi-sim trace %s: one FILE expected, got '%s' and '%s'\n", argv[1],
                    file, argv[i]);
            return 2;
        } else {
            file = argv[i];
        }
    }
    if (!file) {
        fprintf(stderr, "sfi-sim trace %s: FILE missing\n", argv[1]);
        usage(stderr);
        return 2;
    }
    sfi_error e;
    sfi_error_clear(&e);
    sfi_trace *t;
    if (sfi_trace_open(file, &t, &e) != SFI_OK) {
        fprintf(stderr, "sfi-sim trace %s: %s\n", argv[1], e.msg);
        return 1;
    }
    int rc = 0;
    if (is_check) {
        if (sfi_trace_check(t, &e) != SFI_OK) {
            fprintf(stderr, "sfi-sim trace check: %s\n", e.msg);
            rc = 1;
        } else if (need_complete && !sfi_trace_complete(t)) {
            fprintf(stderr,
                    "sfi-sim trace check: %s: incomplete (complete = 0: the writer did not "
                    "finish)\n",
                    file);
            rc = 1;
        } else {
            printf("%s: ok: level %s, %lld requests, %lld steps, %s\n", file,
                   sfi_trace_level_name(sfi_trace_get_meta(t)->level),
                   (long long)sfi_trace_n_requests(t), (long long)sfi_trace_n_steps(t),
                   sfi_trace_complete(t) ? "complete" : "incomplete (writer did not finish)");
        }
    } else {
        stats s;
        if (gather(t, &s, &e)) {
            fprintf(stderr, "sfi-sim trace info: %s\n", e.msg);
            rc = 1;
        } else {
            rc = json ? info_json(t, &s) : info_text(t, &s);
        }
    }
    sfi_trace_close(t);
    return rc;
}
