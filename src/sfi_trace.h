/* Decode traces: an SQLite 3 database (schema in sfi-trace(5)) written by
 * sfi-ref's recorder, traces/tokenize_corpus and traces/record_hf.py, and
 * read by sfi-sim and the analyzer.
 *
 * Levels (chosen at record time, each includes the ones before):
 *   tokens:  requests (prompt ids) and decode steps (context length, token,
 *            step kind and reason) -- enough to replay any trigger policy;
 *   summary: per slow step x layer x KV head the selected set, the attention
 *            mass it captured and lambda*; per step x layer x KV head the
 *            mass the fast-step set captured of the dense attention;
 *   full:    per step x layer x head the top-M positions and probabilities
 *            of the dense attention plus the tail mass, and optional
 *            query/key/value snapshots for chosen layers and steps.
 *
 * Crash safety: the writer commits whole steps in transactions (WAL), so a
 * killed writer leaves a valid file holding every committed step with
 * meta.complete = 0; sfi_trace_finish sets complete = 1.
 *
 * Step kinds and reasons are ref/sfi_state.h's enums, stored as integers.
 * Blobs are little-endian: int32 for positions and token ids, IEEE float32
 * for probabilities and snapshots. */
#ifndef SFI_TRACE_H
#define SFI_TRACE_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_state.h"

/* Schema major version (PRAGMA user_version). Readers refuse a file whose
 * major version is newer; minor versions only add optional tables/keys. */
#define SFI_TRACE_SCHEMA_MAJOR 1
#define SFI_TRACE_SCHEMA_MINOR 1
/* PRAGMA application_id of trace files: "SFIT". */
#define SFI_TRACE_APPLICATION_ID 0x53464954

/* Limits the reader enforces before allocating anything a file claims. */
#define SFI_TRACE_MAX_TOKENS_PER_REQUEST (1 << 28) /* prompt or steps */
#define SFI_TRACE_MAX_LAYERS 1024
#define SFI_TRACE_MAX_HEADS 1024
#define SFI_TRACE_MAX_HEAD_DIM 4096
#define SFI_TRACE_MAX_TOP_M (1 << 24)

typedef enum { SFI_TRACE_TOKENS = 0, SFI_TRACE_SUMMARY = 1, SFI_TRACE_FULL = 2 } sfi_trace_level;

/* "tokens", "summary", "full". */
const char *sfi_trace_level_name(sfi_trace_level l);
SFI_NODISCARD sfi_status sfi_trace_level_parse(const char *name, sfi_trace_level *l,
                                               sfi_error *err);

/* Which heads the full level's top-M records are indexed by. */
typedef enum {
    SFI_TRACE_HEADS_QUERY = 0, /* head = query head, 0..n_heads-1 */
    SFI_TRACE_HEADS_KV = 1     /* head = KV head; probabilities are the mean
                                  over the query heads of its group */
} sfi_trace_head_kind;

/* Everything stored in the meta table. Strings may be NULL (stored as "",
 * or "{}" for the JSON ones). The model shape fields are required (> 0) at
 * levels summary and full, and optional (0 = unknown) at tokens. */
typedef struct {
    const char *tool;              /* producing program, e.g. "sfi-ref" */
    const char *tool_version;      /* e.g. "0.1.0" */
    const char *model_config_json; /* Hugging Face config.json text */
    const char *tokenizer;         /* tokenizer identity, e.g. a name + sha256 */
    const char *params_json;       /* SFI parameters, sfi_params_to_json */
    const char *policy;            /* trigger policy name, e.g. "sfi" */
    sfi_trace_level level;
    int32_t n_vocab; /* tokens must lie in [0, n_vocab) when > 0 */
    int n_layers, n_heads, n_kv_heads, head_dim;
    int top_m; /* full: M of the top-M records */
    sfi_trace_head_kind topm_heads;
} sfi_trace_meta;

/* A meta struct with every field zero/NULL and level tokens. */
void sfi_trace_meta_init(sfi_trace_meta *m);

/* ------------------------------------------------------------------ */
/* Writer                                                              */

typedef struct sfi_trace_writer sfi_trace_writer;

/* Flags of sfi_trace_create. */
#define SFI_TRACE_OVERWRITE 1u /* replace an existing trace (else EIO) */

/* Whether a new trace may be written at path (SFI_OK) or why not: absent,
 * an empty regular file, or an sfi trace (application_id "SFIT") that no
 * other sfi writer is recording (flock) and no other program holds locked.
 * Anything else -- a checkpoint, a prompt, another program's database, a
 * directory, a device, a FIFO, a dangling symbolic link -- is refused with
 * a message. A symbolic link to a trace is followed (the link stays). */
SFI_NODISCARD sfi_status sfi_trace_replaceable(const char *path, sfi_error *err);

/* Creates path and writes the schema and meta (complete = 0) in one
 * transaction. With SFI_TRACE_OVERWRITE an existing file is replaced only
 * when sfi_trace_replaceable allows it. The writer holds an exclusive
 * flock on the file until it is closed, so a second writer is refused
 * while readers still read. commit_every: steps per transaction (0 =
 * 4096); 1 makes every appended step durable as soon as the next one
 * starts. */
SFI_NODISCARD sfi_status sfi_trace_create(const char *path, const sfi_trace_meta *meta,
                                          unsigned flags, int commit_every, sfi_trace_writer **out,
                                          sfi_error *err);

/* Adds a request with its prompt; *id receives its id (0, 1, 2, ...). */
SFI_NODISCARD sfi_status sfi_trace_add_request(sfi_trace_writer *w, const int32_t *prompt,
                                               int32_t n_prompt, int64_t *id, sfi_error *err);

/* Appends decode step `step` of request `req`. Steps of a request must be
 * appended in order 0, 1, 2, ...; ctx_len >= 1 is the cache length the step
 * attends over (current token included), token is the token the step
 * produced. Starts a new transaction when commit_every steps are pending,
 * so the summary/full records of a step added after it stay in the same
 * transaction as the step. */
SFI_NODISCARD sfi_status sfi_trace_append_step(sfi_trace_writer *w, int64_t req, int64_t step,
                                               int32_t ctx_len, int32_t token, sfi_step_kind kind,
                                               sfi_step_reason reason, sfi_error *err);

/* Bulk form: n steps first_step, first_step+1, ... of request req. */
SFI_NODISCARD sfi_status sfi_trace_append_steps(sfi_trace_writer *w, int64_t req,
                                                int64_t first_step, int64_t n,
                                                const int32_t *ctx_len, const int32_t *token,
                                                const uint8_t *kind, const uint8_t *reason,
                                                sfi_error *err);

/* Summary level: the selected set (ascending positions) that slow step
 * `step` chose for (layer, kv_head), the dense attention mass the managed
 * set captured at that step, and lambda*. */
SFI_NODISCARD sfi_status sfi_trace_add_selection(sfi_trace_writer *w, int64_t req, int64_t step,
                                                 int layer, int kv_head, const int32_t *selected,
                                                 int32_t n_selected, float captured_mass,
                                                 float lambda, sfi_error *err);

/* Summary level: mass of step `step`'s dense attention inside the fast-step
 * set of (layer, kv_head) (any step kind). */
SFI_NODISCARD sfi_status sfi_trace_add_fast_mass(sfi_trace_writer *w, int64_t req, int64_t step,
                                                 int layer, int kv_head, float mass,
                                                 sfi_error *err);

/* Full level: the m <= top_m largest dense attention probabilities of
 * (layer, head) at step `step`, in descending probability order, and the
 * mass outside them. */
SFI_NODISCARD sfi_status sfi_trace_add_topm(sfi_trace_writer *w, int64_t req, int64_t step,
                                            int layer, int head, const int32_t *pos,
                                            const float *prob, int32_t m, float tail_mass,
                                            sfi_error *err);

/* Full level, optional: a float32 row-major matrix [rows][cols] of layer
 * `layer` at step `step`. kind 'q': the step's query vectors, rows =
 * n_heads, cols = head_dim (post-RoPE); at a request's step 0, W * n_heads
 * rows may hold the last W prompt queries, oldest first (the step's own
 * last: the prompt observation); 'k'/'v': the key/value cache, rows =
 * n_kv_heads * ctx_len (head-major), cols = head_dim; 'a' (step 0): the
 * prompt's accumulated attention, rows = n_heads, cols = the prompt's
 * length, the sum over every prompt query of its causal softmax. */
SFI_NODISCARD sfi_status sfi_trace_add_snapshot(sfi_trace_writer *w, int64_t req, int64_t step,
                                                int layer, char kind, int32_t rows, int32_t cols,
                                                const float *data, sfi_error *err);

/* An extra meta key (schema minor additions, producer notes such as
 * "topm_layers"). The keys of sfi_trace_meta and schema_version, created,
 * complete are reserved (EINVAL). */
SFI_NODISCARD sfi_status sfi_trace_put_meta(sfi_trace_writer *w, const char *key, const char *value,
                                            sfi_error *err);

/* Commits what is pending (all steps so far become durable). */
SFI_NODISCARD sfi_status sfi_trace_flush(sfi_trace_writer *w, sfi_error *err);

/* Commits, sets complete = 1 and closes; frees w even on error. */
SFI_NODISCARD sfi_status sfi_trace_finish(sfi_trace_writer *w, sfi_error *err);

/* Commits what is pending and closes without marking complete (the file
 * stays a valid partial trace). NULL is allowed. */
void sfi_trace_writer_close(sfi_trace_writer *w);

/* ------------------------------------------------------------------ */
/* Reader                                                              */

typedef struct sfi_trace sfi_trace;

/* Opens read-only and validates the header: application id, schema
 * version (newer major => SFI_EVERSION), tables, meta values and counts.
 * A foreign, corrupt or truncated file gives SFI_EFORMAT with a message
 * naming the file. */
SFI_NODISCARD sfi_status sfi_trace_open(const char *path, sfi_trace **out, sfi_error *err);
void sfi_trace_close(sfi_trace *t);

/* Meta, valid while t is open (strings owned by t). */
const sfi_trace_meta *sfi_trace_get_meta(const sfi_trace *t);
const char *sfi_trace_path(const sfi_trace *t);
int sfi_trace_complete(const sfi_trace *t);        /* meta.complete */
const char *sfi_trace_created(const sfi_trace *t); /* ISO 8601 UTC */
int sfi_trace_schema_minor(const sfi_trace *t);

/* Any meta value by key (malloc'd copy); SFI_ENOTFOUND when absent. */
SFI_NODISCARD sfi_status sfi_trace_get_meta_value(sfi_trace *t, const char *key, char **value,
                                                  sfi_error *err);

int64_t sfi_trace_n_requests(const sfi_trace *t);
int64_t sfi_trace_n_steps(const sfi_trace *t); /* all requests */
/* Records present (0 at tokens level). */
int64_t sfi_trace_n_selections(const sfi_trace *t);
int64_t sfi_trace_n_fast_mass(const sfi_trace *t);
int64_t sfi_trace_n_topm(const sfi_trace *t);
int64_t sfi_trace_n_snapshots(const sfi_trace *t);

typedef struct {
    int64_t id;
    int32_t n_prompt;
    int32_t *prompt; /* malloc'd [n_prompt] */
    int64_t n_steps;
} sfi_trace_request;

/* Request number i (0 <= i < n_requests; ids are 0..n-1). */
SFI_NODISCARD sfi_status sfi_trace_read_request(sfi_trace *t, int64_t i, sfi_trace_request *rq,
                                                sfi_error *err);
void sfi_trace_request_free(sfi_trace_request *rq);

/* All steps of a request, in step order, as parallel arrays (malloc'd). */
typedef struct {
    int64_t n;
    int32_t *ctx_len;
    int32_t *token;
    uint8_t *kind;   /* sfi_step_kind */
    uint8_t *reason; /* sfi_step_reason */
} sfi_trace_steps;

SFI_NODISCARD sfi_status sfi_trace_read_steps(sfi_trace *t, int64_t req, sfi_trace_steps *s,
                                              sfi_error *err);
void sfi_trace_steps_free(sfi_trace_steps *s);

/* Summary level. A selection that is absent gives SFI_ENOTFOUND.
 * *selected is malloc'd [*n_selected]. */
SFI_NODISCARD sfi_status sfi_trace_read_selection(sfi_trace *t, int64_t req, int64_t step,
                                                  int layer, int kv_head, int32_t **selected,
                                                  int32_t *n_selected, float *captured_mass,
                                                  float *lambda, sfi_error *err);
SFI_NODISCARD sfi_status sfi_trace_read_fast_mass(sfi_trace *t, int64_t req, int64_t step,
                                                  int layer, int kv_head, float *mass,
                                                  sfi_error *err);

/* Full level. pos/prob must hold meta.top_m entries; *m receives the
 * count. Absent => SFI_ENOTFOUND. */
SFI_NODISCARD sfi_status sfi_trace_read_topm(sfi_trace *t, int64_t req, int64_t step, int layer,
                                             int head, int32_t *pos, float *prob, int32_t *m,
                                             float *tail_mass, sfi_error *err);

/* Full level, optional. *data is malloc'd [*rows * *cols]. */
SFI_NODISCARD sfi_status sfi_trace_read_snapshot(sfi_trace *t, int64_t req, int64_t step, int layer,
                                                 char kind, float **data, int32_t *rows,
                                                 int32_t *cols, sfi_error *err);

/* Whether DIR/vocab.json is the vocabulary a trace was recorded with, by
 * the "vocab.json sha256:HEX" its meta tokenizer holds (as sfi-ref,
 * tokenize_corpus and record_hf.py write it): 1 yes, 0 no, -1 unknown (no
 * hash recorded, or the file cannot be read). */
int sfi_trace_tokenizer_matches(const char *meta_tokenizer, const char *dir);

/* Reads and validates every row of every table (types, ranges, step
 * order, blob sizes, kinds/reasons, probabilities) -- what `sfi-sim trace
 * check` runs. Stops at the first problem. */
SFI_NODISCARD sfi_status sfi_trace_check(sfi_trace *t, sfi_error *err);

#endif
