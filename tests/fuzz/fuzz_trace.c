/* libFuzzer harness: trace databases -> sfi_trace_open, sfi_trace_check
 * and every reader.
 *
 * The first byte picks how the file is made:
 *  even: the rest is the file's bytes (corrupt, truncated, foreign files);
 *  odd:  the rest is SQL run against a valid full-level trace built by the
 *        writer (wrong types, huge or short blobs, negative counts, steps
 *        out of order, dangling references, a newer schema version...) --
 *        hostile contents that raw byte mutation would rarely reach past
 *        SQLite's own checks.
 * The SQL runs under an authorizer that allows only reads, writes of the
 * trace's tables, and a few pragmas: no ATTACH, no VACUUM INTO, no new
 * files. Invariants: refusals have messages; reads of an opened file never
 * return counts outside the header's limits; a top-M record read back has
 * distinct positions inside its step's context in descending probability
 * order; meta values of an opened file are what sfi-trace(5) allows; and
 * the analyzer (sfi_analyze_trace_open) refuses whatever sfi_trace_check
 * refuses, with the same message (one validator, issue 20). */
#include <config.h>

#include <jansson.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fuzz_util.h"
#include "sfi_analyze_trace.h"
#include "sfi_params.h"
#include "sfi_state.h"
#include "sfi_trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t *template_db;
static size_t template_len;

static void build_template(void)
{
    const char *path = fuzz_file("template.db", "", 0);
    unlink(path);
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "fuzz_trace";
    m.tool_version = "0";
    m.model_config_json = "{\"num_hidden_layers\": 2}";
    m.tokenizer = "toy";
    m.params_json = "{\"K\": 4}";
    m.policy = "sfi";
    m.level = SFI_TRACE_FULL;
    m.n_vocab = 1000;
    m.n_layers = 2;
    m.n_heads = 4;
    m.n_kv_heads = 2;
    m.head_dim = 8;
    m.top_m = 5;
    sfi_trace_writer *w;
    sfi_error e;
    if (sfi_trace_create(path, &m, 0, 0, &w, &e) != SFI_OK)
        abort();
    int32_t prompt[4] = {1, 2, 3, 4};
    if (sfi_trace_add_request(w, prompt, 4, NULL, &e) != SFI_OK)
        abort();
    for (int step = 0; step < 3; step++) {
        if (sfi_trace_append_step(w, 0, step, 5 + step, 7 + step,
                                  step ? SFI_STEP_FAST : SFI_STEP_SLOW,
                                  step ? SFI_REASON_NONE : SFI_REASON_FIRST, &e) != SFI_OK)
            abort();
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) {
                int32_t sel[3] = {0, 2, 3 + h};
                if (step == 0 &&
                    sfi_trace_add_selection(w, 0, 0, l, h, sel, 3, 0.75f, 0.01f, &e) != SFI_OK)
                    abort();
                if (sfi_trace_add_fast_mass(w, 0, step, l, h, 0.5f, &e) != SFI_OK)
                    abort();
            }
        /* Every layer and head: a trace the analyzer reads as it is. */
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 4; h++) {
                int32_t pos[3] = {4 + step, h, h == 3 ? 0 : h + 1};
                float prob[3] = {0.5f, 0.25f, 0.125f};
                if (sfi_trace_add_topm(w, 0, step, l, h, pos, prob, 3, 0.125f, &e) != SFI_OK)
                    abort();
            }
        float q[4 * 8] = {0};
        if (sfi_trace_add_snapshot(w, 0, step, 1, 'q', 4, 8, q, &e) != SFI_OK)
            abort();
    }
    if (sfi_trace_finish(w, &e) != SFI_OK)
        abort();
    FILE *f = fopen(path, "rb");
    if (!f)
        abort();
    fseek(f, 0, SEEK_END);
    template_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    template_db = malloc(template_len);
    if (!template_db || fread(template_db, 1, template_len, f) != template_len)
        abort();
    fclose(f);
    unlink(path);
    /* SFI_FUZZ_DUMP_TEMPLATE=FILE writes the template, e.g. as a raw seed
     * (tests/fuzz/corpus/trace/raw-full-trace is one, with a 0 byte first). */
    const char *dump = getenv("SFI_FUZZ_DUMP_TEMPLATE");
    if (dump && *dump) {
        FILE *o = fopen(dump, "wb");
        if (o) {
            fwrite(template_db, 1, template_len, o);
            fclose(o);
        }
    }
}

static int authorize(void *u, int action, const char *a, const char *b, const char *c,
                     const char *d)
{
    (void)u; (void)b; (void)c; (void)d;
    switch (action) {
    case SQLITE_SELECT:
    case SQLITE_READ:
    case SQLITE_INSERT:
    case SQLITE_UPDATE:
    case SQLITE_DELETE:
    case SQLITE_FUNCTION:
    case SQLITE_TRANSACTION:
    case SQLITE_SAVEPOINT:
    case SQLITE_RECURSIVE:
    case SQLITE_DROP_TABLE:
    case SQLITE_DROP_INDEX:
    case SQLITE_CREATE_INDEX:
    case SQLITE_ALTER_TABLE:
        return SQLITE_OK;
    case SQLITE_PRAGMA:
        if (a && (!strcasecmp(a, "user_version") || !strcasecmp(a, "application_id") ||
                  !strcasecmp(a, "writable_schema")))
            return SQLITE_OK;
        return SQLITE_DENY;
    default:
        return SQLITE_DENY; /* ATTACH, CREATE TABLE/VIEW/TRIGGER, ... */
    }
}

/* Stops runaway SQL (recursive CTEs, huge zeroblob loops). */
static int progress(void *u)
{
    int *budget = u;
    return --*budget < 0;
}

static void apply_sql(const char *path, const uint8_t *sql, size_t len)
{
    char *text = malloc(len + 1);
    if (!text)
        abort();
    memcpy(text, sql, len);
    text[len] = '\0';
    /* VACUUM INTO writes a new file; the authorizer has no code for it. */
    for (char *p = text; *p; p++)
        if (!strncasecmp(p, "vacuum", 6))
            goto out;
    sqlite3 *db;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        int budget = 2000;
        sqlite3_limit(db, SQLITE_LIMIT_LENGTH, 1 << 24);
        sqlite3_limit(db, SQLITE_LIMIT_ATTACHED, 0);
        sqlite3_set_authorizer(db, authorize, NULL);
        sqlite3_progress_handler(db, 100, progress, &budget);
        sqlite3_exec(db, text, NULL, NULL, NULL);
    }
    sqlite3_close(db);
out:
    free(text);
}

static int has_control(const char *v)
{
    for (; v && *v; v++)
        if ((unsigned char)*v < 0x20 || *v == 0x7f)
            return 1;
    return 0;
}

/* A top-M record as sfi-trace(5) defines it (ctx 0: the step's context
 * is unknown here, when the steps could not be read). */
static void check_topm(const int32_t *pos, const float *prob, int32_t n, int32_t ctx)
{
    for (int32_t i = 0; i < n; i++) {
        if (pos[i] < 0 || (ctx > 0 && pos[i] >= ctx) || !(prob[i] >= 0.0f && prob[i] <= 1.0f))
            abort();
        if (i && (prob[i] > prob[i - 1] || (prob[i] == prob[i - 1] && pos[i] < pos[i - 1])))
            abort();
        for (int32_t j = 0; j < i; j++)
            if (pos[j] == pos[i])
                abort();
    }
}

static void read_everything(sfi_trace *t, sfi_status *check_st, char *check_msg)
{
    sfi_error err;
    const sfi_trace_meta *m = sfi_trace_get_meta(t);
    if (!m || m->n_layers < 0 || m->n_layers > SFI_TRACE_MAX_LAYERS || m->top_m < 0 ||
        m->top_m > SFI_TRACE_MAX_TOP_M)
        abort();
    /* Meta values an opened trace may hold. */
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_trigger_kind tk;
    if (sfi_params_from_json(&prm, m->params_json, "params", &err) != SFI_OK ||
        has_control(m->tool) || has_control(m->tool_version) || has_control(m->tokenizer) ||
        (*m->policy && strcmp(m->policy, "dense") &&
         sfi_trigger_policy_parse(m->policy, &tk, NULL) != SFI_OK) ||
        strlen(sfi_trace_created(t)) != 20)
        abort();
    json_t *mc = json_loads(m->model_config_json, 0, NULL);
    if (!json_is_object(mc))
        abort();
    json_decref(mc);
    char *layers = NULL;
    if (sfi_trace_get_meta_value(t, "topm_layers", &layers, &err) == SFI_OK) {
        for (char *p = layers; strcmp(layers, "all") && *p;) {
            char *end;
            long x = strtol(p, &end, 10);
            if (end == p || x < 0 || x >= m->n_layers)
                abort();
            p = *end ? end + 1 : end;
        }
        free(layers);
    }
    *check_st = sfi_trace_check(t, &err);
    if (*check_st)
        memcpy(check_msg, err.msg, sizeof err.msg);
    int64_t nr = sfi_trace_n_requests(t);
    for (int64_t r = 0; r < nr && r < 4; r++) {
        sfi_trace_request rq;
        if (sfi_trace_read_request(t, r, &rq, &err) == SFI_OK) {
            if (rq.n_prompt < 0 || rq.n_prompt > SFI_TRACE_MAX_TOKENS_PER_REQUEST)
                abort();
            sfi_trace_request_free(&rq);
        }
        sfi_trace_steps s;
        int32_t ctx[3] = {0, 0, 0};
        if (sfi_trace_read_steps(t, r, &s, &err) == SFI_OK) {
            if (s.n < 0 || s.n > SFI_TRACE_MAX_TOKENS_PER_REQUEST)
                abort();
            for (int64_t i = 0; i < s.n && i < 3; i++)
                ctx[i] = s.ctx_len[i];
            sfi_trace_steps_free(&s);
        }
        for (int64_t step = 0; step < 3; step++) {
            for (int l = 0; l < 2; l++) {
                for (int h = 0; h < 4; h++) {
                    int32_t *sel = NULL, n_sel = 0;
                    float mass, lambda;
                    if (sfi_trace_read_selection(t, r, step, l, h, &sel, &n_sel, &mass, &lambda,
                                                 &err) == SFI_OK) {
                        for (int32_t i = 0; i < n_sel; i++)
                            if (sel[i] < 0 || (ctx[step] > 0 && sel[i] >= ctx[step]))
                                abort();
                        free(sel);
                    }
                    /* Any status will do: the harness looks for memory
                     * errors, and a mangled trace fails this read. */
                    SFI_IGNORE_STATUS(sfi_trace_read_fast_mass(t, r, step, l, h, &mass, &err));
                    /* pos/prob hold top_m entries, as the reader asks. */
                    if (m->top_m <= 4096) {
                        int32_t *pos = malloc(sizeof *pos * (size_t)(m->top_m + 1));
                        float *prob = malloc(sizeof *prob * (size_t)(m->top_m + 1));
                        int32_t mm;
                        float tail;
                        if (pos && prob &&
                            sfi_trace_read_topm(t, r, step, l, h, pos, prob, &mm, &tail, &err) ==
                                SFI_OK) {
                            if (mm < 0 || mm > m->top_m)
                                abort();
                            check_topm(pos, prob, mm, ctx[step]);
                        }
                        free(pos);
                        free(prob);
                    }
                }
                static const char kinds[3] = {'q', 'k', 'v'};
                for (int k = 0; k < 3; k++) {
                    float *d = NULL;
                    int32_t rows, cols;
                    if (sfi_trace_read_snapshot(t, r, step, l, kinds[k], &d, &rows, &cols,
                                                &err) == SFI_OK)
                        free(d);
                }
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (!template_db)
        build_template();
    /* Leftover WAL files of a previous input must not leak into this one. */
    fuzz_file("trace.db-wal", NULL, 0);
    fuzz_file("trace.db-shm", NULL, 0);
    fuzz_file("trace.db-journal", NULL, 0);
    char path[1024];
    if (!(data[0] & 1)) {
        snprintf(path, sizeof path, "%s", fuzz_file("trace.db", data + 1, size - 1));
    } else {
        snprintf(path, sizeof path, "%s", fuzz_file("trace.db", template_db, template_len));
        apply_sql(path, data + 1, size - 1);
    }
    sfi_trace *t = NULL;
    sfi_error err;
    sfi_error_clear(&err);
    sfi_status check_st = SFI_OK;
    static char check_msg[SFI_ERROR_MSG_MAX];
    if (sfi_trace_open(path, &t, &err) == SFI_OK) {
        read_everything(t, &check_st, check_msg);
        sfi_trace_close(t);
    } else if (!err.msg[0]) {
        abort();
    } else {
        check_st = err.code;
        memcpy(check_msg, err.msg, sizeof check_msg);
    }
    /* The analyzer validates as `trace check` does: what check refuses it
     * refuses with the same message. */
    sfi_analyze_trace *a = NULL;
    sfi_error aerr;
    sfi_error_clear(&aerr);
    sfi_status ast = sfi_analyze_trace_open(path, NULL, NULL, -1, &a, &aerr);
    sfi_analyze_trace_free(a);
    if (check_st != SFI_OK && (ast == SFI_OK || strcmp(aerr.msg, check_msg)))
        abort();
    if (ast != SFI_OK && !aerr.msg[0])
        abort();
    return 0;
}
