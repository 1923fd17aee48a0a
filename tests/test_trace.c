/* Trace store: round trips at every level, writer argument checks, the
 * reader's refusal of foreign/corrupt/truncated/absurd files, and crash
 * safety (a writer killed with SIGKILL leaves every committed step). */
#include <config.h>

#include <check.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sfi_test_util.h"
#include "sfi_trace.h"

static char *dir;
static char path[4096];

static void setup(void)
{
    dir = sfi_test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    snprintf(path, sizeof path, "%s/t.db", dir);
}

static void teardown(void)
{
    sfi_test_rmtree(dir);
    free(dir);
}

static void meta_small(sfi_trace_meta *m, sfi_trace_level level)
{
    sfi_trace_meta_init(m);
    m->tool = "test_trace";
    m->tool_version = "0";
    m->model_config_json = "{\"num_hidden_layers\": 2}";
    m->tokenizer = "toy";
    m->params_json = "{\"K\": 4}";
    m->policy = "sfi";
    m->level = level;
    m->n_vocab = 1000;
    m->n_layers = 2;
    m->n_heads = 4;
    m->n_kv_heads = 2;
    m->head_dim = 8;
    m->top_m = 5;
}

/* Step i of the synthetic request: slow every 7th step. */
static void synth(int64_t i, int32_t *tok, sfi_step_kind *k, sfi_step_reason *r)
{
    *tok = (int32_t)((i * 37 + 11) % 1000);
    if (i == 0) {
        *k = SFI_STEP_SLOW;
        *r = SFI_REASON_FIRST;
    } else if (i % 7 == 0) {
        *k = SFI_STEP_SLOW;
        *r = SFI_REASON_TRIGGER;
    } else {
        *k = SFI_STEP_FAST;
        *r = SFI_REASON_NONE;
    }
}

static void write_tokens_trace(const char *p, int n_req, int n_steps, int commit_every, int finish)
{
    sfi_trace_meta m;
    meta_small(&m, SFI_TRACE_TOKENS);
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_msg(sfi_trace_create(p, &m, SFI_TRACE_OVERWRITE, commit_every, &w, &e) == SFI_OK,
                  "%s", e.msg);
    for (int r = 0; r < n_req; r++) {
        int32_t prompt[10];
        for (int i = 0; i < 10; i++)
            prompt[i] = r * 10 + i;
        int64_t id;
        ck_assert_int_eq(sfi_trace_add_request(w, prompt, 10, &id, &e), SFI_OK);
        ck_assert_int_eq(id, r);
        for (int64_t i = 0; i < n_steps; i++) {
            int32_t tok;
            sfi_step_kind k;
            sfi_step_reason rs;
            synth(i, &tok, &k, &rs);
            ck_assert_msg(sfi_trace_append_step(w, r, i, (int32_t)(11 + i), tok, k, rs, &e) ==
                              SFI_OK,
                          "%s", e.msg);
        }
    }
    if (finish)
        ck_assert_msg(sfi_trace_finish(w, &e) == SFI_OK, "%s", e.msg);
    else
        sfi_trace_writer_close(w);
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

START_TEST(tokens_round_trip)
{
    write_tokens_trace(path, 3, 100, 16, 1);
    char wal[4200];
    snprintf(wal, sizeof wal, "%s-wal", path);
    ck_assert_msg(!file_exists(wal), "a finished trace is one file");
    sfi_trace *t;
    sfi_error e;
    ck_assert_msg(sfi_trace_open(path, &t, &e) == SFI_OK, "%s", e.msg);
    const sfi_trace_meta *m = sfi_trace_get_meta(t);
    ck_assert_str_eq(m->tool, "test_trace");
    ck_assert_str_eq(m->policy, "sfi");
    ck_assert_str_eq(m->tokenizer, "toy");
    ck_assert_str_eq(m->params_json, "{\"K\": 4}");
    ck_assert_int_eq(m->level, SFI_TRACE_TOKENS);
    ck_assert_int_eq(m->n_vocab, 1000);
    ck_assert_int_eq(m->n_kv_heads, 2);
    ck_assert_int_eq(sfi_trace_complete(t), 1);
    ck_assert_int_eq(strlen(sfi_trace_created(t)), 20);
    ck_assert_int_eq(sfi_trace_n_requests(t), 3);
    ck_assert_int_eq(sfi_trace_n_steps(t), 300);
    sfi_trace_request rq;
    ck_assert_int_eq(sfi_trace_read_request(t, 2, &rq, &e), SFI_OK);
    ck_assert_int_eq(rq.n_prompt, 10);
    ck_assert_int_eq(rq.prompt[9], 29);
    ck_assert_int_eq(rq.n_steps, 100);
    sfi_trace_request_free(&rq);
    sfi_trace_steps s;
    ck_assert_int_eq(sfi_trace_read_steps(t, 1, &s, &e), SFI_OK);
    ck_assert_int_eq(s.n, 100);
    for (int64_t i = 0; i < 100; i++) {
        int32_t tok;
        sfi_step_kind k;
        sfi_step_reason r;
        synth(i, &tok, &k, &r);
        ck_assert_int_eq(s.token[i], tok);
        ck_assert_int_eq(s.kind[i], k);
        ck_assert_int_eq(s.reason[i], r);
        ck_assert_int_eq(s.ctx_len[i], 11 + i);
    }
    sfi_trace_steps_free(&s);
    ck_assert_int_eq(sfi_trace_read_request(t, 3, &rq, &e), SFI_EINVAL);
    ck_assert_msg(sfi_trace_check(t, &e) == SFI_OK, "%s", e.msg);
    sfi_trace_close(t);
}
END_TEST

START_TEST(full_round_trip)
{
    sfi_trace_meta m;
    meta_small(&m, SFI_TRACE_FULL);
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_int_eq(sfi_trace_create(path, &m, 0, 1, &w, &e), SFI_OK);
    int32_t prompt[4] = {1, 2, 3, 4};
    ck_assert_int_eq(sfi_trace_add_request(w, prompt, 4, NULL, &e), SFI_OK);
    for (int step = 0; step < 3; step++) {
        ck_assert_msg(sfi_trace_append_step(
                          w, 0, step, 5 + step, 7 + step, step ? SFI_STEP_FAST : SFI_STEP_SLOW,
                          step ? SFI_REASON_NONE : SFI_REASON_FIRST, &e) == SFI_OK,
                      "%s", e.msg);
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++) {
                if (step == 0) {
                    int32_t sel[3] = {0, 2, 3 + h};
                    ck_assert_msg(
                        sfi_trace_add_selection(w, 0, 0, l, h, sel, 3, 0.75f, 0.01f, &e) == SFI_OK,
                        "%s", e.msg);
                }
                ck_assert_int_eq(sfi_trace_add_fast_mass(w, 0, step, l, h, 0.5f + 0.1f * h, &e),
                                 SFI_OK);
            }
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 4; h++) {
                int32_t pos[3] = {4 + step, h, h == 1 ? 2 : 1};
                float prob[3] = {0.5f, 0.25f, 0.125f};
                ck_assert_msg(sfi_trace_add_topm(w, 0, step, l, h, pos, prob, 3, 0.125f, &e) ==
                                  SFI_OK,
                              "%s", e.msg);
            }
        float q[4 * 8];
        for (int i = 0; i < 32; i++)
            q[i] = (float)i * 0.5f - (float)step;
        ck_assert_int_eq(sfi_trace_add_snapshot(w, 0, step, 1, 'q', 4, 8, q, &e), SFI_OK);
    }
    /* A record before its step, or at a layer outside the shape: refused. */
    int32_t pos[1] = {0};
    float prob[1] = {1.0f};
    ck_assert_int_eq(sfi_trace_add_topm(w, 0, 3, 0, 0, pos, prob, 1, 0.0f, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_trace_add_topm(w, 0, 0, 2, 0, pos, prob, 1, 0.0f, &e), SFI_ERANGE);
    ck_assert_int_eq(sfi_trace_finish(w, &e), SFI_OK);

    sfi_trace *t;
    ck_assert_msg(sfi_trace_open(path, &t, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(sfi_trace_n_selections(t), 4);
    ck_assert_int_eq(sfi_trace_n_fast_mass(t), 12);
    ck_assert_int_eq(sfi_trace_n_topm(t), 24);
    ck_assert_int_eq(sfi_trace_n_snapshots(t), 3);
    int32_t *sel, nsel;
    float mass, lam;
    ck_assert_int_eq(sfi_trace_read_selection(t, 0, 0, 1, 1, &sel, &nsel, &mass, &lam, &e), SFI_OK);
    ck_assert_int_eq(nsel, 3);
    ck_assert_int_eq(sel[2], 4);
    ck_assert_float_eq(mass, 0.75f);
    ck_assert_float_eq(lam, 0.01f);
    free(sel);
    ck_assert_int_eq(sfi_trace_read_selection(t, 0, 1, 1, 1, &sel, &nsel, &mass, &lam, &e),
                     SFI_ENOTFOUND);
    float fm;
    ck_assert_int_eq(sfi_trace_read_fast_mass(t, 0, 2, 0, 1, &fm, &e), SFI_OK);
    ck_assert_float_eq(fm, 0.6f);
    int32_t p5[5];
    float pr5[5], tail;
    int32_t mm;
    ck_assert_int_eq(sfi_trace_read_topm(t, 0, 2, 1, 3, p5, pr5, &mm, &tail, &e), SFI_OK);
    ck_assert_int_eq(mm, 3);
    ck_assert_int_eq(p5[0], 6);
    ck_assert_int_eq(p5[1], 3);
    ck_assert_float_eq(pr5[2], 0.125f);
    ck_assert_float_eq(tail, 0.125f);
    float *q;
    int32_t rows, cols;
    ck_assert_int_eq(sfi_trace_read_snapshot(t, 0, 2, 1, 'q', &q, &rows, &cols, &e), SFI_OK);
    ck_assert_int_eq(rows, 4);
    ck_assert_int_eq(cols, 8);
    ck_assert_float_eq(q[31], 15.5f - 2.0f);
    free(q);
    ck_assert_int_eq(sfi_trace_read_snapshot(t, 0, 2, 0, 'k', &q, &rows, &cols, &e), SFI_ENOTFOUND);
    ck_assert_msg(sfi_trace_check(t, &e) == SFI_OK, "%s", e.msg);
    sfi_trace_close(t);
}
END_TEST

START_TEST(writer_refuses_bad_arguments)
{
    sfi_trace_meta m;
    meta_small(&m, SFI_TRACE_TOKENS);
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_int_eq(sfi_trace_create(path, &m, 0, 0, &w, &e), SFI_OK);
    int32_t bad_prompt[2] = {1, 1000};
    ck_assert_int_eq(sfi_trace_add_request(w, bad_prompt, 2, NULL, &e), SFI_ERANGE);
    ck_assert_int_eq(sfi_trace_add_request(w, bad_prompt, 1, NULL, &e), SFI_OK);
    ck_assert_int_eq(sfi_trace_append_step(w, 1, 0, 2, 5, SFI_STEP_SLOW, SFI_REASON_FIRST, &e),
                     SFI_EINVAL);
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 1, 2, 5, SFI_STEP_SLOW, SFI_REASON_FIRST, &e),
                     SFI_EINVAL);
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 0, 2, 5, SFI_STEP_FAST, SFI_REASON_TRIGGER, &e),
                     SFI_EINVAL);
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 0, 0, 5, SFI_STEP_SLOW, SFI_REASON_FIRST, &e),
                     SFI_EINVAL);
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 0, 2, 5000, SFI_STEP_SLOW, SFI_REASON_FIRST, &e),
                     SFI_ERANGE);
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 0, 2, 5, SFI_STEP_SLOW, SFI_REASON_FIRST, &e),
                     SFI_OK);
    int32_t sel[1] = {0};
    ck_assert_int_eq(sfi_trace_add_selection(w, 0, 0, 0, 0, sel, 1, 1.0f, 0.0f, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "need level summary"));
    ck_assert_int_eq(sfi_trace_put_meta(w, "complete", "1", &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_trace_put_meta(w, "note", "hello", &e), SFI_OK);
    ck_assert_int_eq(sfi_trace_finish(w, &e), SFI_OK);
    sfi_trace *t;
    ck_assert_int_eq(sfi_trace_open(path, &t, &e), SFI_OK);
    char *v;
    ck_assert_int_eq(sfi_trace_get_meta_value(t, "note", &v, &e), SFI_OK);
    ck_assert_str_eq(v, "hello");
    free(v);
    sfi_trace_close(t);
    /* An existing file is not overwritten without the flag. */
    ck_assert_int_eq(sfi_trace_create(path, &m, 0, 0, &w, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, path));

    /* Meta strings the readers would refuse are refused at create. */
    char p3[4200];
    snprintf(p3, sizeof p3, "%s/meta-bad.db", dir);
    sfi_trace_meta bad;
    meta_small(&bad, SFI_TRACE_TOKENS);
    bad.tool = "x\033]0;title\007";
    ck_assert_int_eq(sfi_trace_create(p3, &bad, 0, 0, &w, &e), SFI_EINVAL);
    ck_assert_msg(strstr(e.msg, "meta tool: byte 1 is a control character"), "%s", e.msg);
    meta_small(&bad, SFI_TRACE_TOKENS);
    bad.params_json = "{\"K\": 0}";
    ck_assert_int_eq(sfi_trace_create(p3, &bad, 0, 0, &w, &e), SFI_EINVAL);
    ck_assert_msg(strstr(e.msg, "meta params: K"), "%s", e.msg);
    meta_small(&bad, SFI_TRACE_TOKENS);
    bad.policy = "sometimes";
    ck_assert_int_eq(sfi_trace_create(p3, &bad, 0, 0, &w, &e), SFI_EINVAL);
    meta_small(&bad, SFI_TRACE_TOKENS);
    bad.model_config_json = "[]";
    ck_assert_int_eq(sfi_trace_create(p3, &bad, 0, 0, &w, &e), SFI_EINVAL);
    ck_assert_int_eq(access(p3, F_OK), -1);

    /* The writer refuses what the readers refuse (issue 20.5): the same
     * record rules on both sides. */
    char p2[4200];
    snprintf(p2, sizeof p2, "%s/w2.db", dir);
    sfi_trace_meta f;
    meta_small(&f, SFI_TRACE_FULL);
    ck_assert_int_eq(sfi_trace_create(p2, &f, 0, 0, &w, &e), SFI_OK);
    int32_t pr[3] = {1, 2, 3};
    ck_assert_int_eq(sfi_trace_add_request(w, pr, 3, NULL, &e), SFI_OK);
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 0, 2, 5, SFI_STEP_SLOW, SFI_REASON_FIRST, &e),
                     SFI_EINVAL); /* ctx below the prompt */
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 0, 3, 5, SFI_STEP_SLOW, SFI_REASON_FIRST, &e),
                     SFI_OK);
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 1, 5, 5, SFI_STEP_FAST, SFI_REASON_NONE, &e),
                     SFI_EINVAL); /* ctx skips a position */
    ck_assert_msg(strstr(e.msg, "does not follow prompt 3 + one per step"), "%s", e.msg);
    static const struct {
        int32_t pos[3];
        float prob[3], tail;
        const char *needle;
    } badm[] = {
        {{2, 1, 1}, {0.5f, 0.25f, 0.125f}, 0.125f, "position 1 appears twice"},
        {{3, 1, 0}, {0.5f, 0.25f, 0.125f}, 0.125f, "position 3, prob 0.5) outside [0, ctx_len 3)"},
        {{2, 1, 0}, {0.125f, 0.25f, 0.5f}, 0.125f, "not in descending probability order"},
        {{0, 1, 2}, {1.0f, 1.0f, 1.0f}, 0.0f, "sum to 3"},
        {{1, 0, 2}, {0.25f, 0.25f, 0.25f}, 0.25f, "ties by ascending position"},
    };
    for (size_t i = 0; i < sizeof badm / sizeof *badm; i++) {
        ck_assert_int_eq(
            sfi_trace_add_topm(w, 0, 0, 0, 0, badm[i].pos, badm[i].prob, 3, badm[i].tail, &e),
            SFI_ERANGE);
        ck_assert_msg(strstr(e.msg, badm[i].needle), "%zu: %s", i, e.msg);
    }
    int32_t far_sel[2] = {0, 3};
    ck_assert_int_eq(sfi_trace_add_selection(w, 0, 0, 0, 0, far_sel, 2, 0.5f, 0.0f, &e),
                     SFI_EINVAL);
    ck_assert_msg(strstr(e.msg, "position 3 is not inside the step's context of 3"), "%s", e.msg);
    int32_t okp[3] = {2, 0, 1};
    float okq[3] = {0.5f, 0.25f, 0.25f};
    ck_assert_int_eq(sfi_trace_add_topm(w, 0, 0, 0, 0, okp, okq, 3, 0.0f, &e), SFI_OK);
    ck_assert_int_eq(sfi_trace_finish(w, &e), SFI_OK);
    m.level = SFI_TRACE_FULL;
    m.top_m = 0;
    ck_assert_int_eq(sfi_trace_create(path, &m, SFI_TRACE_OVERWRITE, 0, &w, &e), SFI_EINVAL);
}
END_TEST

/* Opens path expecting failure with `code`, and a message naming the file
 * and containing `needle`. */
static void expect_open_fails(const char *p, sfi_status code, const char *needle)
{
    sfi_trace *t = NULL;
    sfi_error e;
    sfi_status st = sfi_trace_open(p, &t, &e);
    if (st == SFI_OK) {
        /* Damage past the header shows when the rows are read. */
        st = sfi_trace_check(t, &e);
        sfi_trace_close(t);
    }
    ck_assert_msg(st == code, "expected %s, got %s: %s", sfi_status_name(code), sfi_status_name(st),
                  st ? e.msg : "");
    ck_assert_msg(strstr(e.msg, p) != NULL, "message does not name the file: %s", e.msg);
    if (needle)
        ck_assert_msg(strstr(e.msg, needle) != NULL, "message '%s' lacks '%s'", e.msg, needle);
}

static void sql_on(const char *p, const char *sql)
{
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(p, &db), SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, msg ? msg : "");
    sqlite3_close(db);
}

/* A good one-request trace dir/name, damaged by `sql`, must fail to open
 * with `code` and a message containing `needle`. */
static void expect_damage_fails(const char *dir, const char *name, const char *sql, sfi_status code,
                                const char *needle)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_tokens_trace(p, 1, 10, 0, 1);
    sql_on(p, sql);
    expect_open_fails(p, code, needle);
}

START_TEST(reader_refuses_bad_files)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/missing.db", dir);
    expect_open_fails(p, SFI_ENOTFOUND, NULL);
    snprintf(p, sizeof p, "%s/empty.db", dir);
    sfi_test_write_file(p, "", 0);
    expect_open_fails(p, SFI_EFORMAT, "empty");
    snprintf(p, sizeof p, "%s/text.db", dir);
    const char *txt =
        "this is not a database, just some text that is long enough to have a header...\n"
        "more text more text more text\n";
    sfi_test_write_file(p, txt, strlen(txt));
    expect_open_fails(p, SFI_EFORMAT, "not an SQLite database");
    snprintf(p, sizeof p, "%s/foreign.db", dir);
    sql_on(p, "CREATE TABLE x(a); INSERT INTO x VALUES(1);");
    expect_open_fails(p, SFI_EFORMAT, "not an sfi trace");

    /* Newer major version: EVERSION with an upgrade hint. */
    expect_damage_fails(dir, "newer.db", "PRAGMA user_version=2;", SFI_EVERSION, "newer");

    /* A trace claiming 10^12 steps: refused before allocating. */
    snprintf(p, sizeof p, "%s/absurd.db", dir);
    write_tokens_trace(p, 1, 10, 0, 1);
    sql_on(p, "UPDATE requests SET n_steps = 1000000000000;");
    expect_open_fails(p, SFI_EFORMAT, "impossible");
    sql_on(p, "UPDATE requests SET n_steps = 100000;");
    expect_open_fails(p, SFI_EFORMAT, "impossible");
    sql_on(p, "UPDATE requests SET n_steps = 9;");
    expect_open_fails(p, SFI_EFORMAT, "n_steps");

    /* Blob size disagreeing with its count. */
    expect_damage_fails(dir, "blob.db", "UPDATE requests SET prompt = substr(prompt, 1, 7);",
                        SFI_EFORMAT, "bytes");

    /* Values out of range, wrong types, missing meta. */
    expect_damage_fails(dir, "kind.db", "UPDATE steps SET kind = 9 WHERE step = 3;", SFI_EFORMAT,
                        "step 3");
    expect_damage_fails(dir, "type.db", "UPDATE steps SET token = 'abc' WHERE step = 4;",
                        SFI_EFORMAT, "not an integer");
    expect_damage_fails(dir, "meta.db", "DELETE FROM meta WHERE key = 'level';", SFI_EFORMAT,
                        "level");
    expect_damage_fails(dir, "meta2.db", "UPDATE meta SET value = '-3' WHERE key = 'n_layers';",
                        SFI_EFORMAT, "n_layers");
    expect_damage_fails(dir, "table.db", "DROP TABLE topm;", SFI_EFORMAT, "topm");
    expect_damage_fails(dir, "ctx.db", "UPDATE steps SET ctx_len = 3 WHERE step = 5;", SFI_EFORMAT,
                        "ctx_len");

    /* Issue 20: a directory was "empty file", a FIFO hung, a locked trace
     * was "corrupt, truncated or not an sfi trace?". */
    snprintf(p, sizeof p, "%s/adir", dir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    expect_open_fails(p, SFI_EIO, "is a directory, not an sfi trace");
    snprintf(p, sizeof p, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    expect_open_fails(p, SFI_EIO, "not a regular file");
    snprintf(p, sizeof p, "%s/locked.db", dir);
    write_tokens_trace(p, 1, 10, 0, 1);
    int sync_pipe[2];
    ck_assert_int_eq(pipe(sync_pipe), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        sqlite3 *h;
        char c = 'x';
        if (sqlite3_open(p, &h) != SQLITE_OK ||
            sqlite3_exec(h, "BEGIN EXCLUSIVE; UPDATE meta SET value = value;", NULL, NULL, NULL) !=
                SQLITE_OK)
            c = 'e';
        if (write(sync_pipe[1], &c, 1) != 1)
            _exit(1);
        sleep(30); /* until killed */
        _exit(0);
    }
    char c = 0;
    ck_assert_int_eq(read(sync_pipe[0], &c, 1), 1);
    ck_assert_int_eq(c, 'x');
    sfi_trace *t = NULL;
    sfi_error e;
    ck_assert_int_eq(sfi_trace_open(p, &t, &e), SFI_EIO);
    ck_assert_msg(strstr(e.msg, "locked") && !strstr(e.msg, "corrupt"), "%s", e.msg);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(sync_pipe[0]);
    close(sync_pipe[1]);
    ck_assert_msg(sfi_trace_open(p, &t, &e) == SFI_OK, "%s", e.msg);
    sfi_trace_close(t);
}
END_TEST

/* Truncation and overwritten pages of a larger trace: an error naming the
 * file, never a crash or a success. */
START_TEST(reader_survives_truncation_and_garbage)
{
    write_tokens_trace(path, 4, 3000, 0, 1);
    size_t len;
    char *data = sfi_test_read_file(path, &len);
    ck_assert_ptr_nonnull(data);
    ck_assert_uint_gt(len, 8 * 4096);
    char p[4200];
    const size_t cuts[] = {50, 100, 4096, len / 3, len / 2, len - 4096};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        snprintf(p, sizeof p, "%s/trunc%zu.db", dir, i);
        sfi_test_write_file(p, data, cuts[i]);
        sfi_trace *t;
        sfi_error e;
        sfi_status st = sfi_trace_open(p, &t, &e);
        if (st == SFI_OK) {
            st = sfi_trace_check(t, &e);
            sfi_trace_close(t);
        }
        ck_assert_msg(st != SFI_OK, "truncated at %zu accepted", cuts[i]);
        ck_assert_msg(strstr(e.msg, p) != NULL, "%s", e.msg);
    }
    /* Garbage over whole pages in the middle (pseudo-random, fixed seed). */
    uint32_t x = 12345;
    for (int trial = 0; trial < 6; trial++) {
        char *copy = malloc(len);
        memcpy(copy, data, len);
        size_t page = 1 + (size_t)trial * ((len / 4096 - 2) / 6);
        for (size_t b = page * 4096; b < (page + 1) * 4096; b++) {
            x = x * 1103515245u + 12345u;
            copy[b] = (char)(x >> 16);
        }
        snprintf(p, sizeof p, "%s/garbage%d.db", dir, trial);
        sfi_test_write_file(p, copy, len);
        free(copy);
        sfi_trace *t;
        sfi_error e;
        sfi_status st = sfi_trace_open(p, &t, &e);
        if (st == SFI_OK) {
            st = sfi_trace_check(t, &e);
            sfi_trace_close(t);
        }
        ck_assert_msg(st != SFI_OK, "garbage page %zu accepted", page);
        ck_assert_msg(strstr(e.msg, p) != NULL, "%s", e.msg);
    }
    free(data);
}
END_TEST

/* A writer killed with SIGKILL mid-run: the file opens, holds exactly the
 * committed steps (a multiple of commit_every, all contiguous and with the
 * right contents) and says complete = 0. */
START_TEST(killed_writer_leaves_committed_steps)
{
    const int every = 100;
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        sfi_trace_meta m;
        meta_small(&m, SFI_TRACE_TOKENS);
        sfi_trace_writer *w;
        sfi_error e;
        if (sfi_trace_create(path, &m, SFI_TRACE_OVERWRITE, every, &w, &e) != SFI_OK)
            _exit(3);
        int32_t prompt[10] = {0};
        if (sfi_trace_add_request(w, prompt, 10, NULL, &e) != SFI_OK)
            _exit(4);
        for (int64_t i = 0;; i++) {
            int32_t tok;
            sfi_step_kind k;
            sfi_step_reason r;
            synth(i, &tok, &k, &r);
            if (sfi_trace_append_step(w, 0, i, (int32_t)(11 + i), tok, k, r, &e) != SFI_OK)
                _exit(5);
            if (i == 5000)
                (void)!write(fds[1], "x", 1); /* several commits done: tell the parent */
        }
    }
    close(fds[1]);
    char c;
    ck_assert_int_eq(read(fds[0], &c, 1), 1);
    close(fds[0]);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    sfi_trace *t;
    sfi_error e;
    ck_assert_msg(sfi_trace_open(path, &t, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(sfi_trace_complete(t), 0);
    int64_t n = sfi_trace_n_steps(t);
    ck_assert_int_ge(n, 5000);
    ck_assert_int_eq(n % every, 0);
    sfi_trace_steps s;
    ck_assert_msg(sfi_trace_read_steps(t, 0, &s, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(s.n, n);
    for (int64_t i = 0; i < n; i++) {
        int32_t tok;
        sfi_step_kind k;
        sfi_step_reason r;
        synth(i, &tok, &k, &r);
        ck_assert_int_eq(s.token[i], tok);
        ck_assert_int_eq(s.kind[i], k);
    }
    sfi_trace_steps_free(&s);
    ck_assert_msg(sfi_trace_check(t, &e) == SFI_OK, "%s", e.msg);
    sfi_trace_close(t);
}
END_TEST

/* Issue 20.3: --trace replaced whatever was at its path (a checkpoint, a
 * prompt, another run's trace being written, a database under another
 * program's lock). Only an sfi trace nobody writes or locks, or an empty
 * file, is replaced. */
static void expect_not_replaced(const char *p, const char *needle)
{
    sfi_trace_meta m;
    meta_small(&m, SFI_TRACE_TOKENS);
    sfi_trace_writer *w = NULL;
    sfi_error e;
    ck_assert_int_eq(sfi_trace_create(p, &m, SFI_TRACE_OVERWRITE, 0, &w, &e), SFI_EIO);
    ck_assert_ptr_null(w);
    ck_assert_msg(strstr(e.msg, p) && strstr(e.msg, needle), "%s", e.msg);
    ck_assert_int_eq(sfi_trace_replaceable(p, &e), SFI_EIO);
}

static void write_small_trace(const char *p, int steps)
{
    sfi_trace_meta m;
    meta_small(&m, SFI_TRACE_TOKENS);
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_msg(sfi_trace_create(p, &m, SFI_TRACE_OVERWRITE, 0, &w, &e) == SFI_OK, "%s", e.msg);
    int32_t prompt[1] = {1};
    ck_assert_int_eq(sfi_trace_add_request(w, prompt, 1, NULL, &e), SFI_OK);
    for (int i = 0; i < steps; i++) {
        int32_t tok;
        sfi_step_kind k;
        sfi_step_reason r;
        synth(i, &tok, &k, &r);
        ck_assert_int_eq(sfi_trace_append_step(w, 0, i, 2 + i, tok, k, r, &e), SFI_OK);
    }
    ck_assert_int_eq(sfi_trace_finish(w, &e), SFI_OK);
}

static int64_t steps_in(const char *p)
{
    sfi_trace *t;
    sfi_error e;
    ck_assert_msg(sfi_trace_open(p, &t, &e) == SFI_OK, "%s", e.msg);
    int64_t n = sfi_trace_n_steps(t);
    sfi_trace_close(t);
    return n;
}

START_TEST(replaces_only_unused_sfi_traces)
{
    char p[4200], q[4200];
    /* Not a trace: a checkpoint-like file, a prompt, another database. */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ck_assert_int_eq(sfi_test_write_file(p, "\x08\0\0\0\0\0\0\0{}      ", 16), 0);
    expect_not_replaced(p, "exists and is not an sfi trace; not replacing it");
    snprintf(p, sizeof p, "%s/p.txt", dir);
    ck_assert_int_eq(sfi_test_write_file(p, "The cat sat.\n", 13), 0);
    expect_not_replaced(p, "is not an sfi trace");
    char *t = sfi_test_read_file(p, NULL);
    ck_assert_str_eq(t, "The cat sat.\n");
    free(t);
    snprintf(p, sizeof p, "%s/other.db", dir);
    sqlite3 *db;
    ck_assert_int_eq(sqlite3_open(p, &db), SQLITE_OK);
    ck_assert_int_eq(
        sqlite3_exec(db, "CREATE TABLE x(a); INSERT INTO x VALUES(1);", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    expect_not_replaced(p, "an SQLite database that is not an sfi trace");
    /* A directory, a FIFO, a dangling link. */
    expect_not_replaced(dir, "not a regular file");
    snprintf(p, sizeof p, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    expect_not_replaced(p, "not a regular file");
    snprintf(p, sizeof p, "%s/dangling.db", dir);
    ck_assert_int_eq(symlink("nowhere.db", p), 0);
    expect_not_replaced(p, "a dangling symbolic link");
    /* Replaced: an empty file, a finished trace, a trace through a link
     * (the link stays). */
    snprintf(p, sizeof p, "%s/empty.db", dir);
    ck_assert_int_eq(sfi_test_write_file(p, "", 0), 0);
    write_small_trace(p, 3);
    ck_assert_int_eq(steps_in(p), 3);
    write_small_trace(p, 5);
    ck_assert_int_eq(steps_in(p), 5);
    snprintf(q, sizeof q, "%s/link.db", dir);
    ck_assert_int_eq(symlink("empty.db", q), 0);
    write_small_trace(q, 7);
    struct stat sb;
    ck_assert_int_eq(lstat(q, &sb), 0);
    ck_assert(S_ISLNK(sb.st_mode));
    ck_assert_int_eq(steps_in(p), 7);
    /* A trace another writer is recording: refused; the first writer
     * keeps every step. */
    sfi_trace_meta m;
    meta_small(&m, SFI_TRACE_TOKENS);
    sfi_trace_writer *w;
    sfi_error e;
    ck_assert_int_eq(sfi_trace_create(path, &m, SFI_TRACE_OVERWRITE, 1, &w, &e), SFI_OK);
    int32_t prompt[1] = {1};
    ck_assert_int_eq(sfi_trace_add_request(w, prompt, 1, NULL, &e), SFI_OK);
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 0, 2, 5, SFI_STEP_SLOW, SFI_REASON_FIRST, &e),
                     SFI_OK);
    ck_assert_int_eq(sfi_trace_flush(w, &e), SFI_OK);
    expect_not_replaced(path, "locked: another sfi process is recording this trace");
    ck_assert_int_eq(sfi_trace_append_step(w, 0, 1, 3, 6, SFI_STEP_FAST, SFI_REASON_NONE, &e),
                     SFI_OK);
    ck_assert_int_eq(sfi_trace_finish(w, &e), SFI_OK);
    ck_assert_int_eq(steps_in(path), 2);
    /* A trace under another program's exclusive lock: refused. */
    int sync_pipe[2];
    ck_assert_int_eq(pipe(sync_pipe), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        sqlite3 *h;
        char c = 'x';
        if (sqlite3_open(path, &h) != SQLITE_OK ||
            sqlite3_exec(h, "BEGIN EXCLUSIVE", NULL, NULL, NULL) != SQLITE_OK)
            c = 'e';
        if (write(sync_pipe[1], &c, 1) != 1)
            _exit(1);
        sleep(30); /* until killed */
        _exit(0);
    }
    char c = 0;
    ck_assert_int_eq(read(sync_pipe[0], &c, 1), 1);
    ck_assert_int_eq(c, 'x');
    expect_not_replaced(path, "locked by another program");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(sync_pipe[0]);
    close(sync_pipe[1]);
    ck_assert_int_eq(steps_in(path), 2);
    /* Without the overwrite flag nothing is replaced. */
    ck_assert_int_eq(sfi_trace_create(path, &m, 0, 0, &w, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "exists (not overwriting a trace)"));
    /* A trace the user may not write stays (as root: checked as nobody). */
    char sub[4200], ro[4300];
    snprintf(sub, sizeof sub, "%s/ro", dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    ck_assert_int_eq(chmod(dir, 0711), 0); /* nobody passes through */
    snprintf(ro, sizeof ro, "%s/t.db", sub);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (geteuid() == 0 &&
            (chown(sub, 65534, 65534) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
            _exit(3);
        write_small_trace(ro, 2);
        if (chmod(ro, 0444) != 0)
            _exit(4);
        sfi_trace_writer *w2 = NULL;
        sfi_error e2;
        if (sfi_trace_create(ro, &m, SFI_TRACE_OVERWRITE, 0, &w2, &e2) != SFI_EIO ||
            !strstr(e2.msg, "Permission denied"))
            _exit(5);
        _exit(steps_in(ro) == 2 ? 0 : 6);
    }
    int ws;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child status %d", ws);
}
END_TEST

START_TEST(levels_parse)
{
    sfi_trace_level l;
    sfi_error e;
    ck_assert_int_eq(sfi_trace_level_parse("summary", &l, &e), SFI_OK);
    ck_assert_int_eq(l, SFI_TRACE_SUMMARY);
    ck_assert_int_eq(sfi_trace_level_parse("most", &l, &e), SFI_EINVAL);
    ck_assert_str_eq(sfi_trace_level_name(SFI_TRACE_FULL), "full");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, tokens_round_trip);
    tcase_add_test(tc, full_round_trip);
    tcase_add_test(tc, writer_refuses_bad_arguments);
    tcase_add_test(tc, reader_refuses_bad_files);
    tcase_add_test(tc, reader_survives_truncation_and_garbage);
    tcase_add_test(tc, killed_writer_leaves_committed_steps);
    tcase_add_test(tc, levels_parse);
    tcase_add_test(tc, replaces_only_unused_sfi_traces);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
