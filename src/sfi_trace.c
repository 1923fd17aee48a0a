/* Decode traces in SQLite (sfi-trace(5)): writer, reader, validation.
 *
 * Design notes:
 * - One row per decode step in a WITHOUT ROWID table keyed (request, step):
 *   appends are in key order, so inserts stay at ~1.5M rows/s, and the
 *   table stays queryable with plain SQL.
 * - The writer keeps one transaction open and commits at step boundaries
 *   (every commit_every steps), so a step and the records added after it
 *   share a transaction and a killed writer loses only uncommitted steps.
 * - The reader trusts nothing: every count a file claims is checked against
 *   fixed limits and against what the file's size could hold before any
 *   allocation, and every value read is range-checked. */
#include <config.h>

#include "sfi_trace.h"
#include "sfi_digest.h"
#include "sfi_params.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Shared helpers                                                      */

const char *sfi_trace_level_name(sfi_trace_level l)
{
    switch (l) {
    case SFI_TRACE_TOKENS: return "tokens";
    case SFI_TRACE_SUMMARY: return "summary";
    case SFI_TRACE_FULL: return "full";
    }
    return "?";
}

sfi_status sfi_trace_level_parse(const char *name, sfi_trace_level *l, sfi_error *err)
{
    static const sfi_trace_level all[] = {SFI_TRACE_TOKENS, SFI_TRACE_SUMMARY, SFI_TRACE_FULL};
    for (size_t i = 0; i < 3; i++)
        if (name && !strcmp(name, sfi_trace_level_name(all[i]))) {
            *l = all[i];
            return SFI_OK;
        }
    return sfi_error_set(err, SFI_EINVAL, "trace level '%s': expected tokens, summary or full",
                         name ? name : "(null)");
}

void sfi_trace_meta_init(sfi_trace_meta *m)
{
    memset(m, 0, sizeof *m);
    m->level = SFI_TRACE_TOKENS;
    m->topm_heads = SFI_TRACE_HEADS_QUERY;
}

static const char *schema_sql =
    "CREATE TABLE meta(key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);"
    "CREATE TABLE requests(id INTEGER PRIMARY KEY, n_prompt INTEGER NOT NULL,"
    " prompt BLOB NOT NULL, n_steps INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE steps(request INTEGER NOT NULL, step INTEGER NOT NULL,"
    " ctx_len INTEGER NOT NULL, token INTEGER NOT NULL, kind INTEGER NOT NULL,"
    " reason INTEGER NOT NULL, PRIMARY KEY(request, step)) WITHOUT ROWID;"
    "CREATE TABLE selections(request INTEGER NOT NULL, step INTEGER NOT NULL,"
    " layer INTEGER NOT NULL, kv_head INTEGER NOT NULL, n_selected INTEGER NOT NULL,"
    " selected BLOB NOT NULL, captured_mass REAL NOT NULL, lambda REAL NOT NULL,"
    " UNIQUE(request, step, layer, kv_head));"
    "CREATE TABLE fast_mass(request INTEGER NOT NULL, step INTEGER NOT NULL,"
    " layer INTEGER NOT NULL, kv_head INTEGER NOT NULL, mass REAL NOT NULL,"
    " PRIMARY KEY(request, step, layer, kv_head)) WITHOUT ROWID;"
    "CREATE TABLE topm(request INTEGER NOT NULL, step INTEGER NOT NULL,"
    " layer INTEGER NOT NULL, head INTEGER NOT NULL, m INTEGER NOT NULL,"
    " positions BLOB NOT NULL, probs BLOB NOT NULL, tail_mass REAL NOT NULL,"
    " UNIQUE(request, step, layer, head));"
    "CREATE TABLE snapshots(request INTEGER NOT NULL, step INTEGER NOT NULL,"
    " layer INTEGER NOT NULL, kind TEXT NOT NULL, rows INTEGER NOT NULL,"
    " cols INTEGER NOT NULL, data BLOB NOT NULL, UNIQUE(request, step, layer, kind));";

static const char *const table_names[] = {"meta",      "requests", "steps",    "selections",
                                          "fast_mass", "topm",     "snapshots"};
#define N_TABLES (sizeof table_names / sizeof table_names[0])

static int is_little_endian(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

/* Blobs are little-endian on disk; on a big-endian host swap in place. */
static void swap32(void *p, size_t n)
{
    if (is_little_endian())
        return;
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++, b += 4) {
        uint8_t t0 = b[0], t1 = b[1];
        b[0] = b[3];
        b[1] = b[2];
        b[2] = t1;
        b[3] = t0;
    }
}

static int valid_kind_reason(int kind, int reason, int64_t step)
{
    switch (kind) {
    case SFI_STEP_PREFILL: return reason == SFI_REASON_PROMPT && step == 0;
    case SFI_STEP_FAST: return reason == SFI_REASON_NONE;
    case SFI_STEP_SLOW:
        return reason == SFI_REASON_FIRST || reason == SFI_REASON_TRIGGER ||
               reason == SFI_REASON_TMAX || reason == SFI_REASON_INTERVAL ||
               reason == SFI_REASON_ALWAYS;
    }
    return 0;
}

/* One definition, for the writer and every reader, of what sfi-trace(5)
 * allows in steps and records. */

/* Decoding appends one token per step; a step never sees fewer positions
 * than the prompt had. ctx0: ctx_len of step 0. */
static int step_ctx_follows(int64_t n_prompt, int64_t ctx0, int64_t step, int64_t ctx_len)
{
    return ctx_len >= n_prompt && ctx_len == ctx0 + step;
}

static int by_int32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* A top-M record: positions distinct and inside [0, ctx); probabilities in
 * [0,1], descending (ties by ascending position), summing with the tail to
 * 1. where: "topm of request R step S layer L head H". */
static sfi_status topm_contents(const char *path, const char *where, const int32_t *pos,
                                const float *prob, int64_t n, double tail, int64_t ctx,
                                sfi_error *err)
{
    if (!(tail >= 0.0 && tail <= 1.0))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: tail mass %g outside [0,1]", path, where,
                             tail);
    double sum = tail;
    for (int64_t i = 0; i < n; i++) {
        if (pos[i] < 0 || pos[i] >= ctx || !(prob[i] >= 0.0f && prob[i] <= 1.0f))
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: %s: entry %lld (position %d, prob %g) "
                                 "outside [0, ctx_len %lld) x [0,1]",
                                 path, where, (long long)i, pos[i], (double)prob[i],
                                 (long long)ctx);
        if (i && (prob[i] > prob[i - 1] || (prob[i] == prob[i - 1] && pos[i] < pos[i - 1])))
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: %s is not in descending probability "
                                 "order (ties by ascending position) at entry %lld",
                                 path, where, (long long)i);
        sum += prob[i];
    }
    if (fabs(sum - 1.0) > 1e-3)
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s: probabilities + tail sum to %g, not 1",
                             path, where, sum);
    if (n < 2)
        return SFI_OK;
    /* Duplicates: a sorted copy (records are small). */
    int32_t *c = malloc((size_t)n * sizeof *c);
    if (!c)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    memcpy(c, pos, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, by_int32);
    sfi_status st = SFI_OK;
    for (int64_t i = 1; !st && i < n; i++)
        if (c[i] == c[i - 1])
            st = sfi_error_set(err, SFI_EFORMAT, "%s: %s: position %d appears twice", path, where,
                               c[i]);
    free(c);
    return st;
}

/* A selected set: strictly ascending positions inside [0, ctx). */
static sfi_status selection_contents(const char *path, const char *where, const int32_t *sel,
                                     int64_t n, int64_t ctx, sfi_error *err)
{
    for (int64_t i = 0; i < n; i++) {
        if (sel[i] < 0 || (i && sel[i] <= sel[i - 1]))
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: %s is not ascending non-negative "
                                 "positions",
                                 path, where);
        if (sel[i] >= ctx)
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: %s: position %d is not inside the step's "
                                 "context of %lld",
                                 path, where, sel[i], (long long)ctx);
    }
    return SFI_OK;
}

/* ------------------------------------------------------------------ */
/* Writer                                                              */

enum { ST_REQ, ST_STEP, ST_STEP_MULTI, ST_SEL, ST_FAST, ST_TOPM, ST_SNAP, ST_NSTEPS, ST_COUNT };

/* Steps are buffered and inserted BATCH at a time with one multi-row
 * INSERT: per-statement overhead, not the B-tree, dominates single-row
 * inserts, and batching roughly doubles the write rate. */
#define BATCH 128

typedef struct {
    int64_t req, step;
    int32_t ctx_len, token;
    int kind, reason;
} step_row;

struct sfi_trace_writer {
    sqlite3 *db;
    char *path;
    sfi_trace_meta meta;
    int commit_every;
    int pending;         /* steps in the open transaction */
    step_row buf[BATCH]; /* steps not yet handed to SQLite */
    int n_buf;
    int in_txn;
    int failed; /* a previous call failed: refuse further writes */
    sqlite3_stmt *st[ST_COUNT];
    int64_t n_requests;
    int64_t *next_step; /* [n_requests] */
    uint8_t *dirty;     /* [n_requests]: n_steps to update at commit */
    int32_t *n_prompt;  /* [n_requests] */
    int32_t *ctx0;      /* [n_requests]: ctx_len of step 0 (step s has ctx0 + s) */
    int64_t cap_requests;
    void *scratch; /* byte-swapping buffer on big-endian hosts */
    size_t scratch_cap;
    int lock_fd; /* holds flock(LOCK_EX) on the file while we write it;
                             closed only after the SQLite connection (closing
                             any descriptor of a file drops the process's
                             POSIX locks on it, SQLite's included) */
};

static sfi_status wsql(sfi_trace_writer *w, sfi_error *err, const char *what)
{
    w->failed = 1;
    int code = sqlite3_errcode(w->db);
    return sfi_error_set(err, code == SQLITE_FULL || code == SQLITE_IOERR ? SFI_EIO : SFI_EIO,
                         "%s: %s: %s", w->path, what, sqlite3_errmsg(w->db));
}

static sfi_status wexec(sfi_trace_writer *w, const char *sql, sfi_error *err)
{
    if (sqlite3_exec(w->db, sql, NULL, NULL, NULL) == SQLITE_OK)
        return SFI_OK;
    /* Name the statement briefly: the schema is a screenful of SQL. */
    char what[48];
    size_t n = strcspn(sql, ";(");
    snprintf(what, sizeof what, "%.*s%s", (int)(n < 40 ? n : 40), sql,
             sql[n] || n > 40 ? " ..." : "");
    return wsql(w, err, what);
}

static sfi_status put_meta(sfi_trace_writer *w, const char *key, const char *value, sfi_error *err)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(w->db, "INSERT OR REPLACE INTO meta(key, value) VALUES(?, ?)", -1, &s,
                           NULL) != SQLITE_OK)
        return wsql(w, err, "meta");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, value ? value : "", -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return wsql(w, err, "meta");
    return SFI_OK;
}

static sfi_status put_meta_int(sfi_trace_writer *w, const char *key, long long v, sfi_error *err)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return put_meta(w, key, buf, err);
}

static sfi_status begin(sfi_trace_writer *w, sfi_error *err)
{
    if (w->in_txn)
        return SFI_OK;
    sfi_status s = wexec(w, "BEGIN", err);
    if (s == SFI_OK)
        w->in_txn = 1;
    return s;
}

static sfi_status flush_buf(sfi_trace_writer *w, sfi_error *err)
{
    int i = 0;
    if (w->n_buf == BATCH) {
        sqlite3_stmt *s = w->st[ST_STEP_MULTI];
        for (int k = 0; k < BATCH; k++) {
            const step_row *r = &w->buf[k];
            sqlite3_bind_int64(s, 6 * k + 1, r->req);
            sqlite3_bind_int64(s, 6 * k + 2, r->step);
            sqlite3_bind_int(s, 6 * k + 3, r->ctx_len);
            sqlite3_bind_int(s, 6 * k + 4, r->token);
            sqlite3_bind_int(s, 6 * k + 5, r->kind);
            sqlite3_bind_int(s, 6 * k + 6, r->reason);
        }
        int rc = sqlite3_step(s);
        sqlite3_reset(s);
        if (rc != SQLITE_DONE)
            return wsql(w, err, "steps");
        i = BATCH;
    }
    for (; i < w->n_buf; i++) {
        const step_row *r = &w->buf[i];
        sqlite3_stmt *s = w->st[ST_STEP];
        sqlite3_bind_int64(s, 1, r->req);
        sqlite3_bind_int64(s, 2, r->step);
        sqlite3_bind_int(s, 3, r->ctx_len);
        sqlite3_bind_int(s, 4, r->token);
        sqlite3_bind_int(s, 5, r->kind);
        sqlite3_bind_int(s, 6, r->reason);
        int rc = sqlite3_step(s);
        sqlite3_reset(s);
        if (rc != SQLITE_DONE)
            return wsql(w, err, "steps");
    }
    w->n_buf = 0;
    return SFI_OK;
}

static sfi_status commit(sfi_trace_writer *w, sfi_error *err)
{
    if (!w->in_txn)
        return SFI_OK;
    sfi_status fs = flush_buf(w, err);
    if (fs)
        return fs;
    for (int64_t r = 0; r < w->n_requests; r++) {
        if (!w->dirty[r])
            continue;
        sqlite3_stmt *s = w->st[ST_NSTEPS];
        sqlite3_bind_int64(s, 1, w->next_step[r]);
        sqlite3_bind_int64(s, 2, r);
        int rc = sqlite3_step(s);
        sqlite3_reset(s);
        if (rc != SQLITE_DONE)
            return wsql(w, err, "requests.n_steps");
        w->dirty[r] = 0;
    }
    sfi_status st = wexec(w, "COMMIT", err);
    if (st != SFI_OK)
        return st;
    w->in_txn = 0;
    w->pending = 0;
    return SFI_OK;
}

static void writer_free(sfi_trace_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(w->st[i]);
    sqlite3_close(w->db);
    if (w->lock_fd >= 0)
        close(w->lock_fd);
    free(w->path);
    free(w->next_step);
    free(w->dirty);
    free(w->n_prompt);
    free(w->ctx0);
    free(w->scratch);
    free(w);
}

/* Free-text meta values are printed by `trace info`: no control
 * characters (a terminal escape in a hostile file would reach the user's
 * terminal) and valid UTF-8. */
static sfi_status meta_text(const char *path, const char *key, const char *v, sfi_error *err)
{
    const unsigned char *u = (const unsigned char *)v;
    for (size_t i = 0; u[i];) {
        unsigned c = u[i];
        size_t n = c < 0x80             ? 1
                   : (c & 0xe0) == 0xc0 ? 2
                   : (c & 0xf0) == 0xe0 ? 3
                   : (c & 0xf8) == 0xf0 ? 4
                                        : 0;
        int bad = n == 0 || (n == 1 && (c < 0x20 || c == 0x7f)) || (n == 2 && c < 0xc2) ||
                  (n == 4 && c > 0xf4);
        for (size_t k = 1; !bad && k < n; k++)
            bad = (u[i + k] & 0xc0) != 0x80;
        if (bad)
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: meta %s: byte %zu is a control "
                                 "character or not UTF-8",
                                 path, key, i);
        i += n;
    }
    return SFI_OK;
}

/* The meta strings every writer stores and every reader accepts (one
 * definition for both sides): free text, the policy, model_config a JSON
 * object, params SFI parameters within the ranges of --param. */
static sfi_status meta_strings(const char *path, const sfi_trace_meta *m, sfi_error *err)
{
    const char *policy = m->policy ? m->policy : "";
    sfi_status st;
    if ((st = meta_text(path, "tool", m->tool ? m->tool : "", err)) ||
        (st = meta_text(path, "tool_version", m->tool_version ? m->tool_version : "", err)) ||
        (st = meta_text(path, "tokenizer", m->tokenizer ? m->tokenizer : "", err)) ||
        (st = meta_text(path, "policy", policy, err)))
        return st;
    sfi_trigger_kind tk;
    if (*policy && strcmp(policy, "dense") && sfi_trigger_policy_parse(policy, &tk, NULL) != SFI_OK)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: meta policy '%.40s' is not a trigger policy "
                             "(sfi, tmax, boundary, interval, always, never) or dense",
                             path, policy);
    const char *mcj = m->model_config_json && *m->model_config_json ? m->model_config_json : "{}";
    json_error_t je;
    json_t *mc = json_loads(mcj, JSON_REJECT_DUPLICATES, &je);
    int obj = json_is_object(mc);
    json_decref(mc);
    if (!obj)
        return sfi_error_set(err, SFI_EFORMAT, "%s: meta model_config is not a JSON object%s%s",
                             path, mc ? "" : ": ", mc ? "" : je.text);
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_error pe;
    if (sfi_params_from_json(&prm, m->params_json && *m->params_json ? m->params_json : "{}",
                             "meta params", &pe) != SFI_OK)
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s", path, pe.msg);
    return SFI_OK;
}

static sfi_status check_meta_for_write(const char *path, const sfi_trace_meta *m, sfi_error *err)
{
    if (m->level != SFI_TRACE_TOKENS && m->level != SFI_TRACE_SUMMARY && m->level != SFI_TRACE_FULL)
        return sfi_error_set(err, SFI_EINVAL, "%s: level %d is not tokens, summary or full", path,
                             (int)m->level);
    if (m->n_vocab < 0 || m->n_layers < 0 || m->n_heads < 0 || m->n_kv_heads < 0 ||
        m->head_dim < 0 || m->top_m < 0)
        return sfi_error_set(err, SFI_EINVAL, "%s: negative model shape in trace meta", path);
    if (m->n_layers > SFI_TRACE_MAX_LAYERS || m->n_heads > SFI_TRACE_MAX_HEADS ||
        m->n_kv_heads > SFI_TRACE_MAX_HEADS || m->head_dim > SFI_TRACE_MAX_HEAD_DIM ||
        m->top_m > SFI_TRACE_MAX_TOP_M)
        return sfi_error_set(err, SFI_ERANGE, "%s: model shape beyond the trace limits", path);
    if (m->level >= SFI_TRACE_SUMMARY && (m->n_layers < 1 || m->n_kv_heads < 1 || m->n_heads < 1))
        return sfi_error_set(err, SFI_EINVAL, "%s: level %s needs n_layers, n_heads and n_kv_heads",
                             path, sfi_trace_level_name(m->level));
    if (m->n_heads > 0 && m->n_kv_heads > 0 && m->n_heads % m->n_kv_heads)
        return sfi_error_set(err, SFI_EINVAL, "%s: n_heads %d is not a multiple of n_kv_heads %d",
                             path, m->n_heads, m->n_kv_heads);
    if (m->level == SFI_TRACE_FULL && (m->top_m < 1 || m->head_dim < 1))
        return sfi_error_set(err, SFI_EINVAL, "%s: level full needs top_m >= 1 and head_dim", path);
    if (m->topm_heads != SFI_TRACE_HEADS_QUERY && m->topm_heads != SFI_TRACE_HEADS_KV)
        return sfi_error_set(err, SFI_EINVAL, "%s: bad topm_heads", path);
    /* What the readers would refuse is refused here, as a caller's error. */
    sfi_status st = meta_strings(path, m, err);
    if (st && err)
        err->code = SFI_EINVAL;
    return st ? SFI_EINVAL : SFI_OK;
}

static void remove_db_files(const char *path)
{
    size_t n = strlen(path) + 8;
    char *p = malloc(n);
    if (p) {
        snprintf(p, n, "%s-wal", path);
        unlink(p);
        snprintf(p, n, "%s-shm", path);
        unlink(p);
        snprintf(p, n, "%s-journal", path);
        unlink(p);
        free(p);
    }
    unlink(path);
}

/* shown: the path as the user gave it; path: the regular file it names. */
static sfi_status replaceable(const char *shown, const char *path, sfi_error *err)
{
    /* Replacing is a write: a trace the user may not write stays. */
    if (access(path, W_OK) != 0)
        return sfi_error_set(err, SFI_EIO, "%s: cannot replace: %s", shown, strerror(errno));
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return sfi_error_set(err, SFI_EIO, "%s: cannot open: %s", shown, strerror(errno));
    /* A writer of ours holds this for as long as it records. */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        return e == EWOULDBLOCK
                   ? sfi_error_set(err, SFI_EIO,
                                   "%s: locked: another sfi process is recording "
                                   "this trace; not replacing it",
                                   shown)
                   : sfi_error_set(err, SFI_EIO, "%s: cannot lock: %s", shown, strerror(e));
    }
    unsigned char hdr[16];
    ssize_t n = pread(fd, hdr, sizeof hdr, 0);
    sfi_status st = SFI_OK;
    if (n < 0) {
        st = sfi_error_set(err, SFI_EIO, "%s: read error: %s", shown, strerror(errno));
    } else if (n == 0) {
        /* An empty file holds nothing to lose. */
    } else if (n < (ssize_t)sizeof hdr || memcmp(hdr, "SQLite format 3", 16)) {
        st = sfi_error_set(err, SFI_EIO,
                           "%s: exists and is not an sfi trace; not replacing it "
                           "(remove it or choose another name)",
                           shown);
    } else {
        /* An SQLite file: an sfi trace (application_id, also when it still
         * sits in the WAL), and not under another program's lock. */
        sqlite3 *db = NULL;
        int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL);
        int id = 0;
        sqlite3_stmt *q = NULL;
        if (rc == SQLITE_OK) {
            sqlite3_busy_timeout(db, 0);
            rc = sqlite3_prepare_v2(db, "PRAGMA application_id", -1, &q, NULL);
        }
        if (rc == SQLITE_OK) {
            rc = sqlite3_step(q);
            if (rc == SQLITE_ROW) {
                id = sqlite3_column_int(q, 0);
                rc = SQLITE_OK;
            }
        }
        sqlite3_finalize(q);
        if (rc == SQLITE_OK && id == SFI_TRACE_APPLICATION_ID)
            rc = sqlite3_exec(db, "BEGIN EXCLUSIVE; ROLLBACK;", NULL, NULL, NULL);
        if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
            st = sfi_error_set(err, SFI_EIO,
                               "%s: locked by another program (database is "
                               "locked); not replacing it",
                               shown);
        else if (rc != SQLITE_OK)
            st = sfi_error_set(err, SFI_EIO,
                               "%s: exists and cannot be read as an sfi trace "
                               "(%s); not replacing it",
                               shown, sqlite3_errstr(rc));
        else if (id != SFI_TRACE_APPLICATION_ID)
            st = sfi_error_set(err, SFI_EIO,
                               "%s: an SQLite database that is not an sfi "
                               "trace; not replacing it",
                               shown);
        sqlite3_close(db);
    }
    close(fd); /* after SQLite's connection: see lock_fd */
    return st;
}

/* Resolves a symbolic link (the trace replaces the file it names; the link
 * stays) and applies the rule of sfi_trace_replaceable. *real: malloc'd. */
static sfi_status target_of(const char *path, int must_be_absent, char **real, int *exists,
                            sfi_error *err)
{
    *real = NULL;
    *exists = 0;
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno != ENOENT)
            return sfi_error_set(err, SFI_EIO, "%s: %s", path, strerror(errno));
        if (!(*real = strdup(path)))
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
        return SFI_OK;
    }
    if (S_ISLNK(sb.st_mode)) {
        if (!(*real = realpath(path, NULL)))
            return errno == ENOENT
                       ? sfi_error_set(err, SFI_EIO,
                                       "%s: a dangling symbolic link; not "
                                       "writing a trace through it",
                                       path)
                       : sfi_error_set(err, SFI_EIO, "%s: cannot follow the symbolic link: %s",
                                       path, strerror(errno));
        if (stat(*real, &sb) != 0) {
            sfi_status st = sfi_error_set(err, SFI_EIO, "%s: %s", path, strerror(errno));
            free(*real);
            *real = NULL;
            return st;
        }
    } else if (!(*real = strdup(path))) {
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    *exists = 1;
    sfi_status st = SFI_OK;
    if (must_be_absent)
        st = sfi_error_set(err, SFI_EIO, "%s: exists (not overwriting a trace)", path);
    else if (!S_ISREG(sb.st_mode))
        st = sfi_error_set(err, SFI_EIO,
                           "%s: exists and is not a regular file; a trace is "
                           "an SQLite database and cannot be written %s",
                           path, S_ISDIR(sb.st_mode) ? "over a directory" : "to a device or FIFO");
    else
        st = replaceable(path, *real, err);
    if (st) {
        free(*real);
        *real = NULL;
    }
    return st;
}

sfi_status sfi_trace_replaceable(const char *path, sfi_error *err)
{
    if (!path || !*path)
        return sfi_error_set(err, SFI_EINVAL, "empty trace file name");
    char *real;
    int exists;
    sfi_status st = target_of(path, 0, &real, &exists, err);
    free(real);
    return st;
}

sfi_status sfi_trace_create(const char *path, const sfi_trace_meta *meta, unsigned flags,
                            int commit_every, sfi_trace_writer **out, sfi_error *err)
{
    *out = NULL;
    sfi_status st = check_meta_for_write(path, meta, err);
    if (st != SFI_OK)
        return st;
    if (commit_every < 0)
        return sfi_error_set(err, SFI_EINVAL, "%s: commit_every %d < 0", path, commit_every);
    char *real;
    int exists;
    if ((st = target_of(path, !(flags & SFI_TRACE_OVERWRITE), &real, &exists, err)) != SFI_OK)
        return st;
    if (exists)
        remove_db_files(real);
    sfi_trace_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        free(real);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    w->lock_fd = -1;
    w->meta = *meta;
    /* The strings stay the caller's; we only need them during create. */
    w->meta.tool = w->meta.tool_version = w->meta.model_config_json = NULL;
    w->meta.tokenizer = w->meta.params_json = w->meta.policy = NULL;
    w->commit_every = commit_every ? commit_every : 4096;
    if (sqlite3_open_v2(real, &w->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_EXCLUSIVE,
                        NULL) != SQLITE_OK) {
        st = sfi_error_set(err, SFI_EIO, "%s: cannot create: %s", path,
                           w->db ? sqlite3_errmsg(w->db) : "out of memory");
        writer_free(w);
        free(real);
        return st;
    }
    /* Ours until the writer closes: see replaceable(). */
    w->lock_fd = open(real, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (w->lock_fd < 0 || flock(w->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        st =
            sfi_error_set(err, SFI_EIO, "%s: cannot lock the new trace: %s", path, strerror(errno));
        goto fail;
    }
    /* application_id before WAL mode: it then sits in the file's header
     * from the start, not only in the WAL. */
    char pragmas[256];
    snprintf(pragmas, sizeof pragmas,
             "PRAGMA application_id=%d; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
             SFI_TRACE_APPLICATION_ID);
    if ((st = wexec(w, pragmas, err)) != SFI_OK || (st = begin(w, err)) != SFI_OK ||
        (st = wexec(w, schema_sql, err)) != SFI_OK)
        goto fail;
    char created[32];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d", SFI_TRACE_SCHEMA_MAJOR, SFI_TRACE_SCHEMA_MINOR);
    if ((st = put_meta(w, "schema_version", ver, err)) ||
        (st = put_meta(w, "tool", meta->tool, err)) ||
        (st = put_meta(w, "tool_version", meta->tool_version, err)) ||
        (st = put_meta(w, "model_config",
                       meta->model_config_json && *meta->model_config_json ? meta->model_config_json
                                                                           : "{}",
                       err)) ||
        (st = put_meta(w, "tokenizer", meta->tokenizer, err)) ||
        (st = put_meta(w, "params",
                       meta->params_json && *meta->params_json ? meta->params_json : "{}", err)) ||
        (st = put_meta(w, "policy", meta->policy, err)) ||
        (st = put_meta(w, "level", sfi_trace_level_name(meta->level), err)) ||
        (st = put_meta(w, "created", created, err)) || (st = put_meta(w, "complete", "0", err)) ||
        (st = put_meta_int(w, "n_vocab", meta->n_vocab, err)) ||
        (st = put_meta_int(w, "n_layers", meta->n_layers, err)) ||
        (st = put_meta_int(w, "n_heads", meta->n_heads, err)) ||
        (st = put_meta_int(w, "n_kv_heads", meta->n_kv_heads, err)) ||
        (st = put_meta_int(w, "head_dim", meta->head_dim, err)) ||
        (st = put_meta_int(w, "top_m", meta->top_m, err)) ||
        (st = put_meta(w, "topm_heads", meta->topm_heads == SFI_TRACE_HEADS_KV ? "kv" : "query",
                       err)))
        goto fail;
    char uv[64];
    snprintf(uv, sizeof uv, "PRAGMA user_version=%d;", SFI_TRACE_SCHEMA_MAJOR);
    if ((st = wexec(w, uv, err)) != SFI_OK || (st = commit(w, err)) != SFI_OK)
        goto fail;
    static const char *const sql[ST_COUNT] = {
        "INSERT INTO requests(id, n_prompt, prompt, n_steps) VALUES(?, ?, ?, 0)",
        "INSERT INTO steps VALUES(?, ?, ?, ?, ?, ?)",
        NULL, /* ST_STEP_MULTI, built below */
        "INSERT INTO selections VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
        "INSERT INTO fast_mass VALUES(?, ?, ?, ?, ?)",
        "INSERT INTO topm VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
        "INSERT INTO snapshots VALUES(?, ?, ?, ?, ?, ?, ?)",
        "UPDATE requests SET n_steps = ? WHERE id = ?",
    };
    char multi[32 + BATCH * 16];
    size_t off = (size_t)snprintf(multi, sizeof multi, "INSERT INTO steps VALUES");
    for (int k = 0; k < BATCH; k++)
        off += (size_t)snprintf(multi + off, sizeof multi - off, "%s(?,?,?,?,?,?)", k ? "," : "");
    for (int i = 0; i < ST_COUNT; i++)
        if (sqlite3_prepare_v2(w->db, sql[i] ? sql[i] : multi, -1, &w->st[i], NULL) != SQLITE_OK) {
            st = wsql(w, err, "prepare");
            goto fail;
        }
    if ((st = begin(w, err)) != SFI_OK)
        goto fail;
    free(real);
    *out = w;
    return SFI_OK;
fail:
    writer_free(w);
    remove_db_files(real);
    free(real);
    return st;
}

/* A blob of n 32-bit little-endian values: on little-endian hosts the
 * caller's array itself. */
static const void *le32(sfi_trace_writer *w, const void *src, size_t n)
{
    if (is_little_endian())
        return src;
    if (w->scratch_cap < n * 4) {
        void *p = realloc(w->scratch, n * 4);
        if (!p)
            return NULL;
        w->scratch = p;
        w->scratch_cap = n * 4;
    }
    memcpy(w->scratch, src, n * 4);
    swap32(w->scratch, n);
    return w->scratch;
}

static sfi_status wcheck(sfi_trace_writer *w, sfi_error *err)
{
    if (w->failed)
        return sfi_error_set(err, SFI_EIO, "%s: writer failed earlier; trace left incomplete",
                             w->path);
    return SFI_OK;
}

sfi_status sfi_trace_add_request(sfi_trace_writer *w, const int32_t *prompt, int32_t n_prompt,
                                 int64_t *id, sfi_error *err)
{
    sfi_status st = wcheck(w, err);
    if (st)
        return st;
    if (n_prompt < 0 || n_prompt > SFI_TRACE_MAX_TOKENS_PER_REQUEST || (n_prompt && !prompt))
        return sfi_error_set(err, SFI_EINVAL, "%s: bad prompt length %d", w->path, n_prompt);
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (w->meta.n_vocab > 0 && prompt[i] >= w->meta.n_vocab))
            return sfi_error_set(err, SFI_ERANGE, "%s: prompt token %d = %d outside [0, %d)",
                                 w->path, i, prompt[i], w->meta.n_vocab);
    if (w->n_requests == w->cap_requests) {
        int64_t cap = w->cap_requests ? 2 * w->cap_requests : 64;
        int64_t *ns = realloc(w->next_step, cap * sizeof *ns);
        if (!ns)
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
        w->next_step = ns;
        uint8_t *d = realloc(w->dirty, cap);
        if (!d)
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
        w->dirty = d;
        int32_t *np = realloc(w->n_prompt, cap * sizeof *np);
        if (!np)
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
        w->n_prompt = np;
        int32_t *c0 = realloc(w->ctx0, cap * sizeof *c0);
        if (!c0)
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
        w->ctx0 = c0;
        w->cap_requests = cap;
    }
    if ((st = begin(w, err)) != SFI_OK)
        return st;
    const void *blob = n_prompt ? le32(w, prompt, (size_t)n_prompt) : "";
    if (!blob)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
    sqlite3_stmt *s = w->st[ST_REQ];
    sqlite3_bind_int64(s, 1, w->n_requests);
    sqlite3_bind_int(s, 2, n_prompt);
    sqlite3_bind_blob(s, 3, blob, n_prompt * 4, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return wsql(w, err, "requests");
    w->next_step[w->n_requests] = 0;
    w->dirty[w->n_requests] = 0;
    w->n_prompt[w->n_requests] = n_prompt;
    w->ctx0[w->n_requests] = 0;
    if (id)
        *id = w->n_requests;
    w->n_requests++;
    return SFI_OK;
}

static sfi_status check_step_args(sfi_trace_writer *w, int64_t req, int64_t step, int32_t ctx_len,
                                  int32_t token, int kind, int reason, sfi_error *err)
{
    if (req < 0 || req >= w->n_requests)
        return sfi_error_set(err, SFI_EINVAL, "%s: request %lld does not exist", w->path,
                             (long long)req);
    if (step != w->next_step[req])
        return sfi_error_set(err, SFI_EINVAL, "%s: request %lld: step %lld appended, expected %lld",
                             w->path, (long long)req, (long long)step,
                             (long long)w->next_step[req]);
    if (step >= SFI_TRACE_MAX_TOKENS_PER_REQUEST)
        return sfi_error_set(err, SFI_ERANGE, "%s: request %lld: more than %d steps", w->path,
                             (long long)req, SFI_TRACE_MAX_TOKENS_PER_REQUEST);
    if (ctx_len < 1)
        return sfi_error_set(err, SFI_EINVAL, "%s: step %lld: ctx_len %d < 1", w->path,
                             (long long)step, ctx_len);
    if (!step_ctx_follows(w->n_prompt[req], step ? w->ctx0[req] : ctx_len, step, ctx_len))
        return sfi_error_set(err, SFI_EINVAL,
                             "%s: request %lld step %lld: ctx_len %d does not "
                             "follow prompt %d + one per step",
                             w->path, (long long)req, (long long)step, ctx_len, w->n_prompt[req]);
    if (token < 0 || (w->meta.n_vocab > 0 && token >= w->meta.n_vocab))
        return sfi_error_set(err, SFI_ERANGE, "%s: step %lld: token %d outside [0, %d)", w->path,
                             (long long)step, token, w->meta.n_vocab);
    if (!valid_kind_reason(kind, reason, step))
        return sfi_error_set(err, SFI_EINVAL, "%s: step %lld: kind %d with reason %d is not valid",
                             w->path, (long long)step, kind, reason);
    return SFI_OK;
}

static sfi_status insert_step(sfi_trace_writer *w, int64_t req, int64_t step, int32_t ctx_len,
                              int32_t token, int kind, int reason, sfi_error *err)
{
    sfi_status st;
    if (w->pending >= w->commit_every && ((st = commit(w, err)) != SFI_OK))
        return st;
    if ((st = begin(w, err)) != SFI_OK)
        return st;
    if (w->n_buf == BATCH && (st = flush_buf(w, err)) != SFI_OK)
        return st;
    step_row *r = &w->buf[w->n_buf++];
    r->req = req;
    r->step = step;
    r->ctx_len = ctx_len;
    r->token = token;
    r->kind = kind;
    r->reason = reason;
    if (step == 0)
        w->ctx0[req] = ctx_len;
    w->next_step[req] = step + 1;
    w->dirty[req] = 1;
    w->pending++;
    return SFI_OK;
}

sfi_status sfi_trace_append_step(sfi_trace_writer *w, int64_t req, int64_t step, int32_t ctx_len,
                                 int32_t token, sfi_step_kind kind, sfi_step_reason reason,
                                 sfi_error *err)
{
    sfi_status st = wcheck(w, err);
    if (st || (st = check_step_args(w, req, step, ctx_len, token, (int)kind, (int)reason, err)))
        return st;
    return insert_step(w, req, step, ctx_len, token, (int)kind, (int)reason, err);
}

sfi_status sfi_trace_append_steps(sfi_trace_writer *w, int64_t req, int64_t first_step, int64_t n,
                                  const int32_t *ctx_len, const int32_t *token, const uint8_t *kind,
                                  const uint8_t *reason, sfi_error *err)
{
    sfi_status st = wcheck(w, err);
    if (st)
        return st;
    if (n < 0)
        return sfi_error_set(err, SFI_EINVAL, "%s: negative step count", w->path);
    for (int64_t i = 0; i < n; i++) {
        if ((st = check_step_args(w, req, first_step + i, ctx_len[i], token[i], kind[i], reason[i],
                                  err)) ||
            (st = insert_step(w, req, first_step + i, ctx_len[i], token[i], kind[i], reason[i],
                              err)))
            return st;
    }
    return SFI_OK;
}

static sfi_status check_record(sfi_trace_writer *w, sfi_trace_level need, const char *what,
                               int64_t req, int64_t step, int layer, int head, int n_heads,
                               sfi_error *err)
{
    sfi_status st = wcheck(w, err);
    if (st)
        return st;
    if (w->meta.level < need)
        return sfi_error_set(err, SFI_EINVAL, "%s: %s records need level %s, trace is %s", w->path,
                             what, sfi_trace_level_name(need), sfi_trace_level_name(w->meta.level));
    if (req < 0 || req >= w->n_requests || step < 0 || step >= w->next_step[req])
        return sfi_error_set(err, SFI_EINVAL, "%s: %s: request %lld step %lld not appended yet",
                             w->path, what, (long long)req, (long long)step);
    if (layer < 0 || layer >= w->meta.n_layers || head < 0 || head >= n_heads)
        return sfi_error_set(err, SFI_ERANGE, "%s: %s: layer %d head %d outside %d x %d", w->path,
                             what, layer, head, w->meta.n_layers, n_heads);
    return begin(w, err);
}

sfi_status sfi_trace_add_selection(sfi_trace_writer *w, int64_t req, int64_t step, int layer,
                                   int kv_head, const int32_t *selected, int32_t n_selected,
                                   float captured_mass, float lambda, sfi_error *err)
{
    sfi_status st = check_record(w, SFI_TRACE_SUMMARY, "selection", req, step, layer, kv_head,
                                 w->meta.n_kv_heads, err);
    if (st)
        return st;
    if (n_selected < 0 || n_selected > SFI_TRACE_MAX_TOKENS_PER_REQUEST ||
        (n_selected && !selected))
        return sfi_error_set(err, SFI_EINVAL, "%s: selection size %d", w->path, n_selected);
    char where[160];
    snprintf(where, sizeof where, "selection of request %lld step %lld layer %d head %d",
             (long long)req, (long long)step, layer, kv_head);
    if ((st = selection_contents(w->path, where, selected, n_selected, w->ctx0[req] + step, err)))
        return err ? (err->code = SFI_EINVAL) : SFI_EINVAL;
    if (!(captured_mass >= 0.0f && captured_mass <= 1.0f + 1e-3f) ||
        !(lambda >= 0.0f && lambda <= 1.0f))
        return sfi_error_set(err, SFI_ERANGE, "%s: selection mass %g or lambda %g outside [0,1]",
                             w->path, (double)captured_mass, (double)lambda);
    const void *blob = n_selected ? le32(w, selected, (size_t)n_selected) : "";
    if (!blob)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
    sqlite3_stmt *s = w->st[ST_SEL];
    sqlite3_bind_int64(s, 1, req);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_int(s, 3, layer);
    sqlite3_bind_int(s, 4, kv_head);
    sqlite3_bind_int(s, 5, n_selected);
    sqlite3_bind_blob(s, 6, blob, n_selected * 4, SQLITE_STATIC);
    sqlite3_bind_double(s, 7, captured_mass);
    sqlite3_bind_double(s, 8, lambda);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? SFI_OK : wsql(w, err, "selections");
}

sfi_status sfi_trace_add_fast_mass(sfi_trace_writer *w, int64_t req, int64_t step, int layer,
                                   int kv_head, float mass, sfi_error *err)
{
    sfi_status st = check_record(w, SFI_TRACE_SUMMARY, "fast_mass", req, step, layer, kv_head,
                                 w->meta.n_kv_heads, err);
    if (st)
        return st;
    if (!(mass >= 0.0f && mass <= 1.0f + 1e-3f))
        return sfi_error_set(err, SFI_ERANGE, "%s: fast mass %g outside [0,1]", w->path,
                             (double)mass);
    sqlite3_stmt *s = w->st[ST_FAST];
    sqlite3_bind_int64(s, 1, req);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_int(s, 3, layer);
    sqlite3_bind_int(s, 4, kv_head);
    sqlite3_bind_double(s, 5, mass);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? SFI_OK : wsql(w, err, "fast_mass");
}

sfi_status sfi_trace_add_topm(sfi_trace_writer *w, int64_t req, int64_t step, int layer, int head,
                              const int32_t *pos, const float *prob, int32_t m, float tail_mass,
                              sfi_error *err)
{
    int nh = w->meta.topm_heads == SFI_TRACE_HEADS_KV ? w->meta.n_kv_heads : w->meta.n_heads;
    sfi_status st = check_record(w, SFI_TRACE_FULL, "topm", req, step, layer, head, nh, err);
    if (st)
        return st;
    if (m < 0 || m > w->meta.top_m || (m && (!pos || !prob)))
        return sfi_error_set(err, SFI_EINVAL, "%s: top-M count %d outside [0, %d]", w->path, m,
                             w->meta.top_m);
    char where[160];
    snprintf(where, sizeof where, "topm of request %lld step %lld layer %d head %d", (long long)req,
             (long long)step, layer, head);
    if ((st = topm_contents(w->path, where, pos, prob, m, tail_mass, w->ctx0[req] + step, err)))
        return err ? (err->code = SFI_ERANGE) : SFI_ERANGE;
    sqlite3_stmt *s = w->st[ST_TOPM];
    sqlite3_bind_int64(s, 1, req);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_int(s, 3, layer);
    sqlite3_bind_int(s, 4, head);
    sqlite3_bind_int(s, 5, m);
    /* Positions and probabilities share the scratch buffer on big-endian
     * hosts, so bind each as a private copy there. */
    const void *b = m ? le32(w, pos, (size_t)m) : "";
    if (!b)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
    sqlite3_bind_blob(s, 6, b, m * 4, is_little_endian() ? SQLITE_STATIC : SQLITE_TRANSIENT);
    b = m ? le32(w, prob, (size_t)m) : "";
    if (!b)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
    sqlite3_bind_blob(s, 7, b, m * 4, SQLITE_STATIC);
    sqlite3_bind_double(s, 8, tail_mass);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? SFI_OK : wsql(w, err, "topm");
}

sfi_status sfi_trace_add_snapshot(sfi_trace_writer *w, int64_t req, int64_t step, int layer,
                                  char kind, int32_t rows, int32_t cols, const float *data,
                                  sfi_error *err)
{
    sfi_status st = check_record(w, SFI_TRACE_FULL, "snapshot", req, step, layer, 0, 1, err);
    if (st)
        return st;
    if (kind != 'q' && kind != 'k' && kind != 'v' && kind != 'a')
        return sfi_error_set(err, SFI_EINVAL, "%s: snapshot kind '%c' is not q, k, v or a", w->path,
                             kind);
    if (rows < 1 || cols < 1 || (int64_t)rows * cols > INT32_MAX / 4 || !data)
        return sfi_error_set(err, SFI_EINVAL, "%s: snapshot shape %d x %d", w->path, rows, cols);
    size_t n = (size_t)rows * (size_t)cols;
    const void *b = le32(w, data, n);
    if (!b)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", w->path);
    char k[2] = {kind, 0};
    sqlite3_stmt *s = w->st[ST_SNAP];
    sqlite3_bind_int64(s, 1, req);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_int(s, 3, layer);
    sqlite3_bind_text(s, 4, k, 1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 5, rows);
    sqlite3_bind_int(s, 6, cols);
    sqlite3_bind_blob(s, 7, b, (int)(n * 4), SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    return rc == SQLITE_DONE ? SFI_OK : wsql(w, err, "snapshots");
}

sfi_status sfi_trace_put_meta(sfi_trace_writer *w, const char *key, const char *value,
                              sfi_error *err)
{
    static const char *const reserved[] = {
        "schema_version", "tool",       "tool_version", "model_config", "tokenizer", "params",
        "policy",         "level",      "created",      "complete",     "n_vocab",   "n_layers",
        "n_heads",        "n_kv_heads", "head_dim",     "top_m",        "topm_heads"};
    sfi_status st = wcheck(w, err);
    if (st)
        return st;
    if (!key || !*key || !value)
        return sfi_error_set(err, SFI_EINVAL, "%s: meta key and value needed", w->path);
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (!strcmp(key, reserved[i]))
            return sfi_error_set(err, SFI_EINVAL, "%s: meta key '%s' is reserved", w->path, key);
    if ((st = begin(w, err)))
        return st;
    return put_meta(w, key, value, err);
}

sfi_status sfi_trace_flush(sfi_trace_writer *w, sfi_error *err)
{
    sfi_status st = wcheck(w, err);
    if (st || (st = commit(w, err)))
        return st;
    return begin(w, err);
}

sfi_status sfi_trace_finish(sfi_trace_writer *w, sfi_error *err)
{
    sfi_status st = wcheck(w, err);
    if (!st)
        st = begin(w, err);
    if (!st)
        st = put_meta(w, "complete", "1", err);
    if (!st)
        st = commit(w, err);
    for (int i = 0; i < ST_COUNT; i++) {
        sqlite3_finalize(w->st[i]);
        w->st[i] = NULL;
    }
    /* A finished trace is one self-contained file (no -wal/-shm), so it
     * can be copied, committed to git and opened on read-only media. */
    if (!st)
        st = wexec(w, "PRAGMA journal_mode=DELETE", err);
    if (!st && sqlite3_close(w->db) != SQLITE_OK)
        st = sfi_error_set(err, SFI_EIO, "%s: close: %s", w->path, sqlite3_errmsg(w->db));
    else if (!st)
        w->db = NULL;
    writer_free(w);
    return st;
}

void sfi_trace_writer_close(sfi_trace_writer *w)
{
    if (!w)
        return;
    if (!w->failed)
        commit(w, NULL);
    else if (w->in_txn)
        sqlite3_exec(w->db, "ROLLBACK", NULL, NULL, NULL);
    writer_free(w);
}

/* ------------------------------------------------------------------ */
/* Reader                                                              */

struct sfi_trace {
    sqlite3 *db;
    char *path;
    sfi_trace_meta meta;
    char *strs[7]; /* owned copies of the meta strings */
    char created[40];
    int complete;
    int schema_minor;
    int64_t file_bytes; /* database + WAL: bounds what counts can be true */
    int64_t n_requests, n_steps, n_sel, n_fast, n_topm, n_snap;
    sqlite3_stmt *q_steps, *q_sel, *q_fast, *q_topm, *q_snap, *q_req;
};

static sfi_status rsql(sfi_trace *t, sfi_error *err, const char *what)
{
    int code = sqlite3_errcode(t->db) & 0xff;
    const char *msg = sqlite3_errmsg(t->db);
    /* Say what the user can do: a lock and a missing permission are not
     * damage to the file. */
    if (code == SQLITE_BUSY || code == SQLITE_LOCKED)
        return sfi_error_set(err, SFI_EIO,
                             "%s: %s: %s (another program holds it locked; try "
                             "again when it is done)",
                             t->path, what, msg);
    if (code == SQLITE_CANTOPEN || code == SQLITE_READONLY || code == SQLITE_PERM ||
        code == SQLITE_AUTH) {
        size_t n = strlen(t->path) + 5;
        char *wal = malloc(n);
        int has_wal = 0;
        if (wal) {
            snprintf(wal, n, "%s-wal", t->path);
            has_wal = access(wal, F_OK) == 0;
            free(wal);
        }
        if (has_wal)
            return sfi_error_set(err, SFI_EIO,
                                 "%s: %s: %s (the trace has a -wal file, left by "
                                 "a writer that did not finish: reading it needs a writable "
                                 "directory for SQLite's -shm file; copy the trace and its -wal "
                                 "file somewhere writable)",
                                 t->path, what, msg);
        return sfi_error_set(err, SFI_EIO, "%s: %s: %s", t->path, what, msg);
    }
    if (code == SQLITE_IOERR || code == SQLITE_NOMEM || code == SQLITE_FULL)
        return sfi_error_set(err, code == SQLITE_NOMEM ? SFI_ENOMEM : SFI_EIO, "%s: %s: %s",
                             t->path, what, msg);
    return sfi_error_set(err, SFI_EFORMAT, "%s: %s: %s (corrupt, truncated or not an sfi trace?)",
                         t->path, what, msg);
}

static sfi_status query_int64(sfi_trace *t, const char *sql, int64_t *v, sfi_error *err)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(t->db, sql, -1, &s, NULL) != SQLITE_OK)
        return rsql(t, err, sql);
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW) {
        sfi_status st = rsql(t, err, sql);
        sqlite3_finalize(s);
        return st;
    }
    *v = sqlite3_column_type(s, 0) == SQLITE_INTEGER ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_finalize(s);
    return SFI_OK;
}

static int64_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (int64_t)sb.st_size : 0;
}

/* Parses a decimal integer meta value within [lo, hi]. */
static sfi_status meta_int(sfi_trace *t, const char *key, const char *v, long lo, long hi, int *out,
                           sfi_error *err)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: meta %s: '%.40s' is not an integer in [%ld, %ld]", t->path, key,
                             v, lo, hi);
    *out = (int)x;
    return SFI_OK;
}

/* "YYYY-MM-DDTHH:MM:SSZ", what every writer stores. */
static sfi_status meta_created(sfi_trace *t, const char *v, sfi_error *err)
{
    int Y, M, D, h, m, sec, n = 0;
    if (strlen(v) != 20 ||
        sscanf(v, "%4d-%2d-%2dT%2d:%2d:%2dZ%n", &Y, &M, &D, &h, &m, &sec, &n) != 6 || n != 20 ||
        M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60 || Y < 1970)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: meta created '%.40s' is not an ISO 8601 UTC "
                             "time (YYYY-MM-DDTHH:MM:SSZ)",
                             t->path, v);
    for (int i = 0; i < 20; i++)
        if ((i == 4 || i == 7)     ? v[i] != '-'
            : (i == 13 || i == 16) ? v[i] != ':'
            : i == 10              ? v[i] != 'T'
            : i == 19              ? v[i] != 'Z'
                                   : (v[i] < '0' || v[i] > '9'))
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: meta created '%.40s' is not an ISO 8601 "
                                 "UTC time (YYYY-MM-DDTHH:MM:SSZ)",
                                 t->path, v);
    return SFI_OK;
}

/* "all" or ascending comma-separated layers in [0, n_layers). */
static sfi_status meta_layers(sfi_trace *t, const char *key, const char *v, sfi_error *err)
{
    if (!strcmp(v, "all"))
        return SFI_OK;
    const char *p = v;
    long prev = -1;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || *p == '-' || *p == '+' || *p == ' ' || x <= prev ||
            x >= t->meta.n_layers || (*end && (*end != ',' || !end[1])))
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: meta %s '%.40s' is not \"all\" or "
                                 "ascending layers in [0, %d) separated by commas",
                                 t->path, key, v, t->meta.n_layers);
        prev = x;
        p = *end ? end + 1 : end;
    }
    if (prev < 0)
        return sfi_error_set(err, SFI_EFORMAT, "%s: meta %s is empty", t->path, key);
    return SFI_OK;
}

/* The meta values read_meta keeps as strings, checked once the shape is
 * known. */
static sfi_status check_meta_values(sfi_trace *t, sfi_error *err)
{
    const sfi_trace_meta *m = &t->meta;
    sfi_status st;
    if ((st = meta_strings(t->path, m, err)) || (st = meta_created(t, t->created, err)))
        return st;
    static const char *const layer_keys[] = {"topm_layers", "layers_recorded"};
    for (int i = 0; i < 2; i++) {
        char *v = NULL;
        sfi_error ge;
        st = sfi_trace_get_meta_value(t, layer_keys[i], &v, &ge);
        if (st == SFI_ENOTFOUND)
            continue;
        if (st)
            return sfi_error_set(err, st, "%s", ge.msg);
        st = meta_layers(t, layer_keys[i], v, err);
        free(v);
        if (st)
            return st;
    }
    return SFI_OK;
}

static sfi_status read_meta(sfi_trace *t, sfi_error *err)
{
    static const char *const str_keys[7] = {"tool",   "tool_version", "model_config",  "tokenizer",
                                            "params", "policy",       "schema_version"};
    static const char *const required[] = {"schema_version", "level",    "complete",  "created",
                                           "n_vocab",        "n_layers", "n_heads",   "n_kv_heads",
                                           "head_dim",       "top_m",    "topm_heads"};
    int seen_req[sizeof required / sizeof required[0]] = {0};
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(t->db, "SELECT key, value FROM meta", -1, &s, NULL) != SQLITE_OK)
        return rsql(t, err, "meta");
    sfi_status st = SFI_OK;
    int rc;
    while (st == SFI_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (sqlite3_column_type(s, 0) != SQLITE_TEXT || sqlite3_column_type(s, 1) != SQLITE_TEXT) {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: meta: key or value is not text", t->path);
            break;
        }
        const char *k = (const char *)sqlite3_column_text(s, 0);
        const char *v = (const char *)sqlite3_column_text(s, 1);
        if (!k || !v) {
            st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", t->path);
            break;
        }
        for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
            if (!strcmp(k, required[i]))
                seen_req[i] = 1;
        for (int i = 0; i < 7; i++)
            if (!strcmp(k, str_keys[i])) {
                free(t->strs[i]);
                if (!(t->strs[i] = strdup(v)))
                    st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", t->path);
            }
        int x = 0;
        if (!strcmp(k, "level")) {
            sfi_trace_level l = SFI_TRACE_TOKENS;
            if (sfi_trace_level_parse(v, &l, NULL) != SFI_OK)
                st = sfi_error_set(err, SFI_EFORMAT,
                                   "%s: meta level '%.40s' is not tokens, summary or full", t->path,
                                   v);
            else
                t->meta.level = l;
        } else if (!strcmp(k, "complete")) {
            st = meta_int(t, k, v, 0, 1, &t->complete, err);
        } else if (!strcmp(k, "created")) {
            snprintf(t->created, sizeof t->created, "%s", v);
        } else if (!strcmp(k, "n_vocab")) {
            st = meta_int(t, k, v, 0, INT32_MAX, &x, err);
            t->meta.n_vocab = x;
        } else if (!strcmp(k, "n_layers")) {
            st = meta_int(t, k, v, 0, SFI_TRACE_MAX_LAYERS, &t->meta.n_layers, err);
        } else if (!strcmp(k, "n_heads")) {
            st = meta_int(t, k, v, 0, SFI_TRACE_MAX_HEADS, &t->meta.n_heads, err);
        } else if (!strcmp(k, "n_kv_heads")) {
            st = meta_int(t, k, v, 0, SFI_TRACE_MAX_HEADS, &t->meta.n_kv_heads, err);
        } else if (!strcmp(k, "head_dim")) {
            st = meta_int(t, k, v, 0, SFI_TRACE_MAX_HEAD_DIM, &t->meta.head_dim, err);
        } else if (!strcmp(k, "top_m")) {
            st = meta_int(t, k, v, 0, SFI_TRACE_MAX_TOP_M, &t->meta.top_m, err);
        } else if (!strcmp(k, "topm_heads")) {
            if (!strcmp(v, "query"))
                t->meta.topm_heads = SFI_TRACE_HEADS_QUERY;
            else if (!strcmp(v, "kv"))
                t->meta.topm_heads = SFI_TRACE_HEADS_KV;
            else
                st = sfi_error_set(err, SFI_EFORMAT,
                                   "%s: meta topm_heads '%.40s' is not query or kv", t->path, v);
        }
    }
    if (st == SFI_OK && rc != SQLITE_DONE)
        st = rsql(t, err, "meta");
    sqlite3_finalize(s);
    if (st)
        return st;
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!seen_req[i])
            return sfi_error_set(err, SFI_EFORMAT, "%s: meta: key '%s' is missing", t->path,
                                 required[i]);
    /* schema_version "MAJOR.MINOR": the major must match user_version. */
    int major = 0, minor = 0;
    char extra;
    if (sscanf(t->strs[6], "%d.%d%c", &major, &minor, &extra) != 2 || minor < 0)
        return sfi_error_set(err, SFI_EFORMAT, "%s: meta schema_version '%.40s' is not MAJOR.MINOR",
                             t->path, t->strs[6]);
    if (major != SFI_TRACE_SCHEMA_MAJOR)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: meta schema_version %d.%d disagrees with user_version", t->path,
                             major, minor);
    t->schema_minor = minor;
    t->meta.tool = t->strs[0] ? t->strs[0] : "";
    t->meta.tool_version = t->strs[1] ? t->strs[1] : "";
    t->meta.model_config_json = t->strs[2] ? t->strs[2] : "{}";
    t->meta.tokenizer = t->strs[3] ? t->strs[3] : "";
    t->meta.params_json = t->strs[4] ? t->strs[4] : "{}";
    t->meta.policy = t->strs[5] ? t->strs[5] : "";
    const sfi_trace_meta *m = &t->meta;
    if (m->level >= SFI_TRACE_SUMMARY && (m->n_layers < 1 || m->n_heads < 1 || m->n_kv_heads < 1))
        return sfi_error_set(err, SFI_EFORMAT, "%s: meta: level %s without the model shape",
                             t->path, sfi_trace_level_name(m->level));
    if (m->n_heads > 0 && m->n_kv_heads > 0 && m->n_heads % m->n_kv_heads)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: meta: n_heads %d not a multiple of n_kv_heads %d", t->path,
                             m->n_heads, m->n_kv_heads);
    if (m->level == SFI_TRACE_FULL && (m->top_m < 1 || m->head_dim < 1))
        return sfi_error_set(err, SFI_EFORMAT, "%s: meta: level full without top_m/head_dim",
                             t->path);
    return check_meta_values(t, err);
}

void sfi_trace_close(sfi_trace *t)
{
    if (!t)
        return;
    sqlite3_finalize(t->q_steps);
    sqlite3_finalize(t->q_sel);
    sqlite3_finalize(t->q_fast);
    sqlite3_finalize(t->q_topm);
    sqlite3_finalize(t->q_snap);
    sqlite3_finalize(t->q_req);
    sqlite3_close(t->db);
    for (int i = 0; i < 7; i++)
        free(t->strs[i]);
    free(t->path);
    free(t);
}

sfi_status sfi_trace_open(const char *path, sfi_trace **out, sfi_error *err)
{
    *out = NULL;
    /* Look at the file ourselves first: SQLite's messages for a missing,
     * empty or foreign file do not say what the user did wrong. */
    /* O_NONBLOCK: a FIFO must not hang us; it is refused below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return sfi_error_set(err, errno == ENOENT ? SFI_ENOTFOUND : SFI_EIO, "%s: %s", path,
                             strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int dir = fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode);
        close(fd);
        return sfi_error_set(err, SFI_EIO,
                             dir ? "%s: is a directory, not an sfi trace"
                                 : "%s: not a regular file, so not an sfi trace "
                                   "(a trace is an SQLite database file)",
                             path);
    }
    char hdr[100];
    ssize_t rd = pread(fd, hdr, sizeof hdr, 0);
    close(fd);
    size_t got = rd > 0 ? (size_t)rd : 0;
    if (rd < 0)
        return sfi_error_set(err, SFI_EIO, "%s: read error: %s", path, strerror(errno));
    if (got == 0)
        return sfi_error_set(err, SFI_EFORMAT, "%s: empty file, not an sfi trace", path);
    if (got < sizeof hdr || memcmp(hdr, "SQLite format 3", 16))
        return sfi_error_set(err, SFI_EFORMAT, "%s: not an SQLite database, so not an sfi trace",
                             path);
    sfi_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    sfi_status st;
    sfi_trace_meta_init(&t->meta);
    if (sqlite3_open_v2(path, &t->db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        st = sfi_error_set(err, SFI_EIO, "%s: cannot open: %s", path,
                           t->db ? sqlite3_errmsg(t->db) : "out of memory");
        goto fail;
    }
    /* A corrupt file must fail queries, never loop or crash. */
    sqlite3_exec(t->db, "PRAGMA cell_size_check=ON", NULL, NULL, NULL);
    int64_t app = 0, uv = 0;
    if ((st = query_int64(t, "PRAGMA application_id", &app, err)) ||
        (st = query_int64(t, "PRAGMA user_version", &uv, err)))
        goto fail;
    if (app != SFI_TRACE_APPLICATION_ID) {
        st = sfi_error_set(err, SFI_EFORMAT,
                           "%s: an SQLite database but not an sfi trace (application_id 0x%llx)",
                           path, (unsigned long long)app);
        goto fail;
    }
    if (uv > SFI_TRACE_SCHEMA_MAJOR) {
        st = sfi_error_set(err, SFI_EVERSION,
                           "%s: trace schema version %lld is newer than this sfi reads (%d); "
                           "upgrade sfi",
                           path, (long long)uv, SFI_TRACE_SCHEMA_MAJOR);
        goto fail;
    }
    if (uv < 1) {
        st = sfi_error_set(err, SFI_EFORMAT, "%s: trace schema version %lld is not valid", path,
                           (long long)uv);
        goto fail;
    }
    for (size_t i = 0; i < N_TABLES; i++) {
        char sql[128];
        int64_t n = 0;
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='%s'",
                 table_names[i]);
        if ((st = query_int64(t, sql, &n, err)))
            goto fail;
        if (n != 1) {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: table '%s' is missing", path, table_names[i]);
            goto fail;
        }
    }
    if ((st = read_meta(t, err)))
        goto fail;
    size_t n = strlen(path) + 5;
    char *wal = malloc(n);
    if (!wal) {
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    snprintf(wal, n, "%s-wal", path);
    t->file_bytes = file_size(path) + file_size(wal);
    free(wal);
    if ((st = query_int64(t, "SELECT count(*) FROM requests", &t->n_requests, err)) ||
        (st = query_int64(t, "SELECT count(*) FROM steps", &t->n_steps, err)) ||
        (st = query_int64(t, "SELECT count(*) FROM selections", &t->n_sel, err)) ||
        (st = query_int64(t, "SELECT count(*) FROM fast_mass", &t->n_fast, err)) ||
        (st = query_int64(t, "SELECT count(*) FROM topm", &t->n_topm, err)) ||
        (st = query_int64(t, "SELECT count(*) FROM snapshots", &t->n_snap, err)))
        goto fail;
    if (t->meta.level < SFI_TRACE_SUMMARY && (t->n_sel || t->n_fast)) {
        st = sfi_error_set(err, SFI_EFORMAT, "%s: level %s but summary records present", path,
                           sfi_trace_level_name(t->meta.level));
        goto fail;
    }
    if (t->meta.level < SFI_TRACE_FULL && (t->n_topm || t->n_snap)) {
        st = sfi_error_set(err, SFI_EFORMAT, "%s: level %s but full records present", path,
                           sfi_trace_level_name(t->meta.level));
        goto fail;
    }
    if (sqlite3_prepare_v2(t->db,
                           "SELECT step, ctx_len, token, kind, reason FROM steps WHERE request = ? "
                           "ORDER BY step",
                           -1, &t->q_steps, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(t->db, "SELECT n_prompt, prompt, n_steps FROM requests WHERE id = ?", -1,
                           &t->q_req, NULL) != SQLITE_OK ||
        /* Records carry their step's ctx_len (NULL for an orphan record,
         * which check reports as such): positions must lie below it. */
        sqlite3_prepare_v2(t->db,
                           "SELECT x.n_selected, x.selected, x.captured_mass, x.lambda, "
                           "(SELECT s.ctx_len FROM steps s WHERE s.request = x.request AND "
                           "s.step = x.step) FROM selections x "
                           "WHERE x.request = ? AND x.step = ? AND x.layer = ? AND x.kv_head = ?",
                           -1, &t->q_sel, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(
            t->db,
            "SELECT mass FROM fast_mass WHERE request = ? AND step = ? AND layer = ? "
            "AND kv_head = ?",
            -1, &t->q_fast, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(t->db,
                           "SELECT x.m, x.positions, x.probs, x.tail_mass, "
                           "(SELECT s.ctx_len FROM steps s WHERE s.request = x.request AND "
                           "s.step = x.step) FROM topm x WHERE x.request = ? AND "
                           "x.step = ? AND x.layer = ? AND x.head = ?",
                           -1, &t->q_topm, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(t->db,
                           "SELECT rows, cols, data FROM snapshots WHERE request = ? AND step = ? "
                           "AND layer = ? AND kind = ?",
                           -1, &t->q_snap, NULL) != SQLITE_OK) {
        st = rsql(t, err, "prepare");
        goto fail;
    }
    *out = t;
    return SFI_OK;
fail:
    sfi_trace_close(t);
    return st;
}

sfi_status sfi_trace_get_meta_value(sfi_trace *t, const char *key, char **value, sfi_error *err)
{
    *value = NULL;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(t->db, "SELECT value FROM meta WHERE key = ?", -1, &s, NULL) !=
        SQLITE_OK)
        return rsql(t, err, "meta");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(s);
    sfi_status st = SFI_OK;
    if (rc == SQLITE_DONE)
        st = sfi_error_set(err, SFI_ENOTFOUND, "%s: meta key '%s' is absent", t->path, key);
    else if (rc != SQLITE_ROW)
        st = rsql(t, err, "meta");
    else if (sqlite3_column_type(s, 0) != SQLITE_TEXT)
        st = sfi_error_set(err, SFI_EFORMAT, "%s: meta %s is not text", t->path, key);
    else if (!(*value = strdup((const char *)sqlite3_column_text(s, 0))))
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", t->path);
    sqlite3_finalize(s);
    return st;
}

const sfi_trace_meta *sfi_trace_get_meta(const sfi_trace *t)
{
    return &t->meta;
}
const char *sfi_trace_path(const sfi_trace *t)
{
    return t->path;
}
int sfi_trace_complete(const sfi_trace *t)
{
    return t->complete;
}
const char *sfi_trace_created(const sfi_trace *t)
{
    return t->created;
}
int sfi_trace_schema_minor(const sfi_trace *t)
{
    return t->schema_minor;
}
int64_t sfi_trace_n_requests(const sfi_trace *t)
{
    return t->n_requests;
}
int64_t sfi_trace_n_steps(const sfi_trace *t)
{
    return t->n_steps;
}
int64_t sfi_trace_n_selections(const sfi_trace *t)
{
    return t->n_sel;
}
int64_t sfi_trace_n_fast_mass(const sfi_trace *t)
{
    return t->n_fast;
}
int64_t sfi_trace_n_topm(const sfi_trace *t)
{
    return t->n_topm;
}
int64_t sfi_trace_n_snapshots(const sfi_trace *t)
{
    return t->n_snap;
}

/* A count the file claims must fit the limit and be storable in the file:
 * every element costs at least `bytes_each` bytes on disk. */
static sfi_status plausible(sfi_trace *t, const char *what, int64_t n, int64_t limit,
                            int64_t bytes_each, sfi_error *err)
{
    if (n < 0 || n > limit || n * bytes_each > t->file_bytes + 4096)
        return sfi_error_set(err, SFI_EFORMAT,
                             "%s: %s claims %lld entries, impossible for this file (limit %lld, "
                             "%lld bytes)",
                             t->path, what, (long long)n, (long long)limit,
                             (long long)t->file_bytes);
    return SFI_OK;
}

/* Copies a blob of n int32/float32 values, checking its size. */
static sfi_status blob32(sfi_trace *t, sqlite3_stmt *s, int col, int64_t n, void *dst,
                         const char *what, sfi_error *err)
{
    if (sqlite3_column_type(s, col) != SQLITE_BLOB &&
        !(n == 0 && sqlite3_column_bytes(s, col) == 0))
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s is not a blob", t->path, what);
    const void *b = sqlite3_column_blob(s, col);
    int64_t bytes = sqlite3_column_bytes(s, col);
    if (bytes != n * 4)
        return sfi_error_set(err, SFI_EFORMAT, "%s: %s holds %lld bytes, expected %lld", t->path,
                             what, (long long)bytes, (long long)(n * 4));
    if (n) {
        if (!b)
            return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", t->path);
        memcpy(dst, b, (size_t)n * 4);
        swap32(dst, (size_t)n);
    }
    return SFI_OK;
}

static int col_int(sqlite3_stmt *s, int col, int64_t *v)
{
    if (sqlite3_column_type(s, col) != SQLITE_INTEGER)
        return 0;
    *v = sqlite3_column_int64(s, col);
    return 1;
}

static int col_real(sqlite3_stmt *s, int col, double *v)
{
    int ty = sqlite3_column_type(s, col);
    if (ty != SQLITE_FLOAT && ty != SQLITE_INTEGER)
        return 0;
    *v = sqlite3_column_double(s, col);
    return 1;
}

sfi_status sfi_trace_read_request(sfi_trace *t, int64_t i, sfi_trace_request *rq, sfi_error *err)
{
    memset(rq, 0, sizeof *rq);
    if (i < 0 || i >= t->n_requests)
        return sfi_error_set(err, SFI_EINVAL, "%s: request %lld outside [0, %lld)", t->path,
                             (long long)i, (long long)t->n_requests);
    sqlite3_stmt *s = t->q_req;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, i);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(s);
        return sfi_error_set(err, SFI_EFORMAT, "%s: request ids are not 0..%lld (id %lld missing)",
                             t->path, (long long)t->n_requests - 1, (long long)i);
    }
    if (rc != SQLITE_ROW) {
        sfi_status st = rsql(t, err, "requests");
        sqlite3_reset(s);
        return st;
    }
    int64_t np = 0, ns = 0;
    sfi_status st = SFI_OK;
    if (!col_int(s, 0, &np) || !col_int(s, 2, &ns))
        st = sfi_error_set(err, SFI_EFORMAT, "%s: request %lld: n_prompt/n_steps not integers",
                           t->path, (long long)i);
    if (!st)
        st = plausible(t, "request prompt", np, SFI_TRACE_MAX_TOKENS_PER_REQUEST, 4, err);
    if (!st)
        st = plausible(t, "request n_steps", ns, SFI_TRACE_MAX_TOKENS_PER_REQUEST, 4, err);
    if (!st) {
        rq->prompt = malloc(np ? (size_t)np * 4 : 1);
        if (!rq->prompt)
            st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", t->path);
    }
    if (!st)
        st = blob32(t, s, 1, np, rq->prompt, "request prompt", err);
    for (int64_t k = 0; !st && k < np; k++)
        if (rq->prompt[k] < 0 || (t->meta.n_vocab > 0 && rq->prompt[k] >= t->meta.n_vocab))
            st = sfi_error_set(err, SFI_EFORMAT,
                               "%s: request %lld: prompt token %lld = %d outside "
                               "[0, %d)",
                               t->path, (long long)i, (long long)k, rq->prompt[k], t->meta.n_vocab);
    sqlite3_reset(s);
    if (st) {
        sfi_trace_request_free(rq);
        return st;
    }
    rq->id = i;
    rq->n_prompt = (int32_t)np;
    rq->n_steps = ns;
    return SFI_OK;
}

void sfi_trace_request_free(sfi_trace_request *rq)
{
    if (!rq)
        return;
    free(rq->prompt);
    memset(rq, 0, sizeof *rq);
}

void sfi_trace_steps_free(sfi_trace_steps *s)
{
    if (!s)
        return;
    free(s->ctx_len);
    free(s->token);
    free(s->kind);
    free(s->reason);
    memset(s, 0, sizeof *s);
}

sfi_status sfi_trace_read_steps(sfi_trace *t, int64_t req, sfi_trace_steps *out, sfi_error *err)
{
    memset(out, 0, sizeof *out);
    sfi_trace_request rq;
    sfi_status st = sfi_trace_read_request(t, req, &rq, err);
    if (st)
        return st;
    int64_t n = rq.n_steps;
    sfi_trace_request_free(&rq);
    size_t cap = n ? (size_t)n : 1;
    out->ctx_len = malloc(cap * 4);
    out->token = malloc(cap * 4);
    out->kind = malloc(cap);
    out->reason = malloc(cap);
    if (!out->ctx_len || !out->token || !out->kind || !out->reason) {
        sfi_trace_steps_free(out);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for %lld steps", t->path,
                             (long long)n);
    }
    sqlite3_stmt *s = t->q_steps;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, req);
    int64_t i = 0;
    int rc;
    const int64_t nv = t->meta.n_vocab;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t step, ctx, tok, kind, reason;
        if (!col_int(s, 0, &step) || !col_int(s, 1, &ctx) || !col_int(s, 2, &tok) ||
            !col_int(s, 3, &kind) || !col_int(s, 4, &reason)) {
            st = sfi_error_set(err, SFI_EFORMAT,
                               "%s: request %lld step %lld: a column is not an "
                               "integer",
                               t->path, (long long)req, (long long)i);
            break;
        }
        if (i >= n || step != i) {
            st =
                sfi_error_set(err, SFI_EFORMAT,
                              "%s: request %lld: step %lld found where step %lld was expected "
                              "(requests.n_steps = %lld)",
                              t->path, (long long)req, (long long)step, (long long)i, (long long)n);
            break;
        }
        if (ctx < 1 || ctx > INT32_MAX || tok < 0 || tok > INT32_MAX || (nv > 0 && tok >= nv) ||
            !valid_kind_reason((int)kind, (int)reason, step) || kind > 2 || reason > 6) {
            st = sfi_error_set(err, SFI_EFORMAT,
                               "%s: request %lld step %lld: ctx_len %lld, token %lld, kind %lld, "
                               "reason %lld out of range",
                               t->path, (long long)req, (long long)step, (long long)ctx,
                               (long long)tok, (long long)kind, (long long)reason);
            break;
        }
        out->ctx_len[i] = (int32_t)ctx;
        out->token[i] = (int32_t)tok;
        out->kind[i] = (uint8_t)kind;
        out->reason[i] = (uint8_t)reason;
        i++;
    }
    if (!st && rc != SQLITE_DONE)
        st = rsql(t, err, "steps");
    if (!st && i != n)
        st = sfi_error_set(err, SFI_EFORMAT,
                           "%s: request %lld: %lld steps stored, n_steps says %lld", t->path,
                           (long long)req, (long long)i, (long long)n);
    sqlite3_reset(s);
    if (st) {
        sfi_trace_steps_free(out);
        return st;
    }
    out->n = n;
    return SFI_OK;
}

static void bind_key(sqlite3_stmt *s, int64_t req, int64_t step, int layer, int head)
{
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, req);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_int(s, 3, layer);
    sqlite3_bind_int(s, 4, head);
}

/* Steps the keyed query: SFI_OK with a row, ENOTFOUND, or an error. */
static sfi_status step_key(sfi_trace *t, sqlite3_stmt *s, const char *what, int64_t req,
                           int64_t step, int layer, int head, sfi_error *err)
{
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        return SFI_OK;
    if (rc == SQLITE_DONE)
        return sfi_error_set(err, SFI_ENOTFOUND,
                             "%s: no %s record for request %lld step %lld "
                             "layer %d head %d",
                             t->path, what, (long long)req, (long long)step, layer, head);
    return rsql(t, err, what);
}

/* The ctx_len a record's query carried (column col): the positions a record
 * may name lie below it; an orphan record (no step) allows none. */
static int64_t step_ctx(sqlite3_stmt *s, int col)
{
    return sqlite3_column_type(s, col) == SQLITE_INTEGER ? sqlite3_column_int64(s, col) : 0;
}

sfi_status sfi_trace_read_selection(sfi_trace *t, int64_t req, int64_t step, int layer, int kv_head,
                                    int32_t **selected, int32_t *n_selected, float *captured_mass,
                                    float *lambda, sfi_error *err)
{
    *selected = NULL;
    *n_selected = 0;
    sqlite3_stmt *s = t->q_sel;
    bind_key(s, req, step, layer, kv_head);
    sfi_status st = step_key(t, s, "selection", req, step, layer, kv_head, err);
    int64_t n = 0;
    double mass = 0, lam = 0;
    if (!st && (!col_int(s, 0, &n) || !col_real(s, 2, &mass) || !col_real(s, 3, &lam)))
        st = sfi_error_set(err, SFI_EFORMAT, "%s: selection: bad column types", t->path);
    if (!st)
        st = plausible(t, "selection", n, SFI_TRACE_MAX_TOKENS_PER_REQUEST, 4, err);
    if (!st && (!(mass >= 0.0 && mass <= 1.001) || !(lam >= 0.0 && lam <= 1.0)))
        st = sfi_error_set(err, SFI_EFORMAT,
                           "%s: selection of step %lld layer %d head %d: mass %g "
                           "or lambda %g outside [0,1]",
                           t->path, (long long)step, layer, kv_head, mass, lam);
    int32_t *sel = NULL;
    if (!st && !(sel = malloc(n ? (size_t)n * 4 : 1)))
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", t->path);
    if (!st)
        st = blob32(t, s, 1, n, sel, "selection", err);
    if (!st) {
        char where[160];
        snprintf(where, sizeof where, "selection of request %lld step %lld layer %d head %d",
                 (long long)req, (long long)step, layer, kv_head);
        st = selection_contents(t->path, where, sel, n, step_ctx(s, 4), err);
    }
    sqlite3_reset(s);
    if (st) {
        free(sel);
        return st;
    }
    *selected = sel;
    *n_selected = (int32_t)n;
    *captured_mass = (float)mass;
    *lambda = (float)lam;
    return SFI_OK;
}

sfi_status sfi_trace_read_fast_mass(sfi_trace *t, int64_t req, int64_t step, int layer, int kv_head,
                                    float *mass, sfi_error *err)
{
    sqlite3_stmt *s = t->q_fast;
    bind_key(s, req, step, layer, kv_head);
    sfi_status st = step_key(t, s, "fast_mass", req, step, layer, kv_head, err);
    double m = 0;
    if (!st && (!col_real(s, 0, &m) || !(m >= 0.0 && m <= 1.001)))
        st = sfi_error_set(err, SFI_EFORMAT,
                           "%s: fast_mass of step %lld layer %d head %d is not in "
                           "[0,1]",
                           t->path, (long long)step, layer, kv_head);
    sqlite3_reset(s);
    if (!st)
        *mass = (float)m;
    return st;
}

sfi_status sfi_trace_read_topm(sfi_trace *t, int64_t req, int64_t step, int layer, int head,
                               int32_t *pos, float *prob, int32_t *m, float *tail_mass,
                               sfi_error *err)
{
    /* Every reader (trace check, the analyzer, a user's program) gets a
     * record only after the same checks: sfi-trace(5), table topm. */
    sqlite3_stmt *s = t->q_topm;
    bind_key(s, req, step, layer, head);
    sfi_status st = step_key(t, s, "topm", req, step, layer, head, err);
    int64_t n = 0;
    double tail = 0;
    char where[160];
    snprintf(where, sizeof where, "topm of request %lld step %lld layer %d head %d", (long long)req,
             (long long)step, layer, head);
    if (!st && (!col_int(s, 0, &n) || !col_real(s, 3, &tail)))
        st = sfi_error_set(err, SFI_EFORMAT, "%s: %s: bad column types", t->path, where);
    if (!st && (n < 0 || n > t->meta.top_m))
        st = sfi_error_set(err, SFI_EFORMAT, "%s: %s: m = %lld outside [0, top_m = %d]", t->path,
                           where, (long long)n, t->meta.top_m);
    if (!st)
        st = blob32(t, s, 1, n, pos, "topm positions", err);
    if (!st)
        st = blob32(t, s, 2, n, prob, "topm probs", err);
    if (!st)
        st = topm_contents(t->path, where, pos, prob, n, tail, step_ctx(s, 4), err);
    sqlite3_reset(s);
    if (!st) {
        *m = (int32_t)n;
        *tail_mass = (float)tail;
    }
    return st;
}

sfi_status sfi_trace_read_snapshot(sfi_trace *t, int64_t req, int64_t step, int layer, char kind,
                                   float **data, int32_t *rows, int32_t *cols, sfi_error *err)
{
    *data = NULL;
    sqlite3_stmt *s = t->q_snap;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, req);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_int(s, 3, layer);
    char k[2] = {kind, 0};
    sqlite3_bind_text(s, 4, k, 1, SQLITE_TRANSIENT);
    sfi_status st = step_key(t, s, "snapshot", req, step, layer, kind, err);
    int64_t r = 0, c = 0;
    if (!st && (!col_int(s, 0, &r) || !col_int(s, 1, &c) || r < 1 || c < 1 || r > INT32_MAX ||
                c > SFI_TRACE_MAX_HEAD_DIM))
        st = sfi_error_set(err, SFI_EFORMAT, "%s: snapshot shape is not valid", t->path);
    if (!st)
        st = plausible(t, "snapshot", r * c, INT32_MAX / 4, 4, err);
    float *d = NULL;
    if (!st && !(d = malloc((size_t)(r * c) * 4)))
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", t->path);
    if (!st)
        st = blob32(t, s, 2, r * c, d, "snapshot", err);
    sqlite3_reset(s);
    if (st) {
        free(d);
        return st;
    }
    *data = d;
    *rows = (int32_t)r;
    *cols = (int32_t)c;
    return SFI_OK;
}

/* sfi_trace_check's phases, each a class of the file's promises. */

/* SQLite's own integrity check. */
static sfi_status check_integrity(sfi_trace *t, sfi_error *err)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(t->db, "PRAGMA integrity_check(1)", -1, &s, NULL) != SQLITE_OK)
        return rsql(t, err, "integrity_check");
    sfi_status st = SFI_OK;
    if (sqlite3_step(s) != SQLITE_ROW)
        st = rsql(t, err, "integrity_check");
    else {
        const char *r = (const char *)sqlite3_column_text(s, 0);
        if (!r || strcmp(r, "ok"))
            st = sfi_error_set(err, SFI_EFORMAT, "%s: SQLite integrity check: %s", t->path,
                               r ? r : "failed");
    }
    sqlite3_finalize(s);
    return st;
}

/* Every request's steps read back, their contexts growing one per step,
 * and no step outside a request. */
static sfi_status check_requests(sfi_trace *t, sfi_error *err)
{
    sfi_status st;
    int64_t total = 0;
    for (int64_t r = 0; r < t->n_requests; r++) {
        sfi_trace_request rq;
        if ((st = sfi_trace_read_request(t, r, &rq, err)))
            return st;
        int32_t np = rq.n_prompt;
        sfi_trace_request_free(&rq);
        sfi_trace_steps sv;
        if ((st = sfi_trace_read_steps(t, r, &sv, err)))
            return st;
        for (int64_t i = 0; i < sv.n; i++) {
            /* Decoding appends one token per step; a step never sees
             * fewer positions than the prompt had. */
            if (!step_ctx_follows(np, sv.ctx_len[0], i, sv.ctx_len[i])) {
                st = sfi_error_set(err, SFI_EFORMAT,
                                   "%s: request %lld step %lld: ctx_len %d does not follow "
                                   "prompt %d + one per step",
                                   t->path, (long long)r, (long long)i, sv.ctx_len[i], np);
                break;
            }
        }
        total += sv.n;
        sfi_trace_steps_free(&sv);
        if (st)
            return st;
    }
    if (total != t->n_steps)
        return sfi_error_set(err, SFI_EFORMAT, "%s: %lld steps belong to no request", t->path,
                             (long long)(t->n_steps - total));
    return SFI_OK;
}

/* Every record refers to a stored step. */
static sfi_status check_orphans(sfi_trace *t, sfi_error *err)
{
    static const char *const orphans[] = {"selections", "fast_mass", "topm", "snapshots"};
    for (size_t i = 0; i < 4; i++) {
        char sql[256];
        int64_t n = 0;
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM %s x WHERE NOT EXISTS (SELECT 1 FROM steps s WHERE "
                 "s.request = x.request AND s.step = x.step)",
                 orphans[i]);
        sfi_status st = query_int64(t, sql, &n, err);
        if (st)
            return st;
        if (n)
            return sfi_error_set(err, SFI_EFORMAT, "%s: %lld %s records refer to no stored step",
                                 t->path, (long long)n, orphans[i]);
    }
    return SFI_OK;
}

/* Every record lies inside the model shape of meta. */
static sfi_status check_shapes(sfi_trace *t, sfi_error *err)
{
    const sfi_trace_meta *m = &t->meta;
    int nh_topm = m->topm_heads == SFI_TRACE_HEADS_KV ? m->n_kv_heads : m->n_heads;
    struct {
        const char *sql;
        const char *what;
    } shape[4];
    char q[4][256];
    snprintf(q[0], 256,
             "SELECT count(*) FROM selections WHERE layer < 0 OR layer >= %d OR kv_head < 0 OR "
             "kv_head >= %d",
             m->n_layers, m->n_kv_heads);
    snprintf(q[1], 256,
             "SELECT count(*) FROM fast_mass WHERE layer < 0 OR layer >= %d OR kv_head < 0 OR "
             "kv_head >= %d",
             m->n_layers, m->n_kv_heads);
    snprintf(q[2], 256,
             "SELECT count(*) FROM topm WHERE layer < 0 OR layer >= %d OR head < 0 OR head >= %d",
             m->n_layers, nh_topm);
    snprintf(q[3], 256,
             "SELECT count(*) FROM snapshots WHERE layer < 0 OR layer >= %d OR kind NOT IN "
             "('q','k','v','a')",
             m->n_layers);
    shape[0].sql = q[0];
    shape[0].what = "selections";
    shape[1].sql = q[1];
    shape[1].what = "fast_mass";
    shape[2].sql = q[2];
    shape[2].what = "topm";
    shape[3].sql = q[3];
    shape[3].what = "snapshots";
    for (int i = 0; i < 4; i++) {
        int64_t n = 0;
        sfi_status st = query_int64(t, shape[i].sql, &n, err);
        if (st)
            return st;
        if (n && i == 2)
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: %lld topm records lie outside the model "
                                 "shape in meta (layer < %d, head < %d: topm_heads is %s)",
                                 t->path, (long long)n, m->n_layers, nh_topm,
                                 m->topm_heads == SFI_TRACE_HEADS_KV ? "kv" : "query");
        if (n)
            return sfi_error_set(err, SFI_EFORMAT,
                                 "%s: %lld %s records lie outside the model shape "
                                 "in meta",
                                 t->path, (long long)n, shape[i].what);
    }
    return SFI_OK;
}

/* The records below are read through the validating readers. */
static sfi_status check_selections(sfi_trace *t, sfi_error *err)
{
    sqlite3_stmt *it;
    if (sqlite3_prepare_v2(t->db, "SELECT request, step, layer, kv_head FROM selections", -1, &it,
                           NULL) != SQLITE_OK)
        return rsql(t, err, "selections");
    sfi_status st = SFI_OK;
    int rc;
    while (!st && (rc = sqlite3_step(it)) == SQLITE_ROW) {
        int32_t *sel, n;
        float mass, lam;
        st = sfi_trace_read_selection(t, sqlite3_column_int64(it, 0), sqlite3_column_int64(it, 1),
                                      sqlite3_column_int(it, 2), sqlite3_column_int(it, 3), &sel,
                                      &n, &mass, &lam, err);
        if (!st)
            free(sel);
    }
    if (!st && rc != SQLITE_DONE)
        st = rsql(t, err, "selections");
    sqlite3_finalize(it);
    return st;
}

static sfi_status check_fast_mass(sfi_trace *t, sfi_error *err)
{
    sqlite3_stmt *it;
    if (sqlite3_prepare_v2(t->db, "SELECT request, step, layer, kv_head FROM fast_mass", -1, &it,
                           NULL) != SQLITE_OK)
        return rsql(t, err, "fast_mass");
    sfi_status st = SFI_OK;
    int rc;
    while (!st && (rc = sqlite3_step(it)) == SQLITE_ROW) {
        float mass;
        st = sfi_trace_read_fast_mass(t, sqlite3_column_int64(it, 0), sqlite3_column_int64(it, 1),
                                      sqlite3_column_int(it, 2), sqlite3_column_int(it, 3), &mass,
                                      err);
    }
    if (!st && rc != SQLITE_DONE)
        st = rsql(t, err, "fast_mass");
    sqlite3_finalize(it);
    return st;
}

static sfi_status check_topm(sfi_trace *t, sfi_error *err)
{
    if (!t->n_topm)
        return SFI_OK;
    const sfi_trace_meta *m = &t->meta;
    int32_t *pos = malloc((size_t)m->top_m * 4);
    float *prob = malloc((size_t)m->top_m * 4);
    if (!pos || !prob) {
        free(pos);
        free(prob);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", t->path);
    }
    sqlite3_stmt *it;
    if (sqlite3_prepare_v2(t->db, "SELECT request, step, layer, head FROM topm", -1, &it, NULL) !=
        SQLITE_OK) {
        free(pos);
        free(prob);
        return rsql(t, err, "topm");
    }
    sfi_status st = SFI_OK;
    int rc;
    while (!st && (rc = sqlite3_step(it)) == SQLITE_ROW) {
        int32_t n;
        float tail;
        st = sfi_trace_read_topm(t, sqlite3_column_int64(it, 0), sqlite3_column_int64(it, 1),
                                 sqlite3_column_int(it, 2), sqlite3_column_int(it, 3), pos, prob,
                                 &n, &tail, err);
    }
    if (!st && rc != SQLITE_DONE)
        st = rsql(t, err, "topm");
    sqlite3_finalize(it);
    free(pos);
    free(prob);
    return st;
}

static sfi_status check_snapshots(sfi_trace *t, sfi_error *err)
{
    sqlite3_stmt *it;
    if (sqlite3_prepare_v2(t->db, "SELECT request, step, layer, kind FROM snapshots", -1, &it,
                           NULL) != SQLITE_OK)
        return rsql(t, err, "snapshots");
    sfi_status st = SFI_OK;
    int rc;
    while (!st && (rc = sqlite3_step(it)) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(it, 3);
        float *d;
        int32_t r, c;
        st = sfi_trace_read_snapshot(t, sqlite3_column_int64(it, 0), sqlite3_column_int64(it, 1),
                                     sqlite3_column_int(it, 2), k ? k[0] : '?', &d, &r, &c, err);
        if (!st)
            free(d);
    }
    if (!st && rc != SQLITE_DONE)
        st = rsql(t, err, "snapshots");
    sqlite3_finalize(it);
    return st;
}

/* Full validation: integrity, then every row of every table. */
sfi_status sfi_trace_check(sfi_trace *t, sfi_error *err)
{
    sfi_status st;
    if ((st = check_integrity(t, err)) || (st = check_requests(t, err)) ||
        (st = check_orphans(t, err)) || (st = check_shapes(t, err)) ||
        (st = check_selections(t, err)) || (st = check_fast_mass(t, err)) ||
        (st = check_topm(t, err)) || (st = check_snapshots(t, err)))
        return st;
    return SFI_OK;
}

int sfi_trace_tokenizer_matches(const char *meta_tokenizer, const char *dir)
{
    const char *key = "vocab.json sha256:";
    const char *h = meta_tokenizer ? strstr(meta_tokenizer, key) : NULL;
    if (!h || !dir)
        return -1;
    h += strlen(key);
    size_t n = strspn(h, "0123456789abcdef");
    if (n != SFI_DIGEST_HEX_LEN)
        return -1;
    size_t dl = strlen(dir) + sizeof "/vocab.json";
    char *path = malloc(dl);
    if (!path)
        return -1;
    snprintf(path, dl, "%s/vocab.json", dir);
    char hex[SFI_DIGEST_HEX_LEN + 1];
    int r = sfi_digest_file_hex(path, hex, NULL) == SFI_OK ? !strncmp(hex, h, n) : -1;
    free(path);
    return r;
}
