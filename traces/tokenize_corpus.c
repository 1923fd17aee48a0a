/* tokenize_corpus: real text files -> a tokens-level decode trace
 * (sfi-trace(5)), so the trigger statistics of real text can be replayed.
 *
 * Each document (a FILE, or all FILEs joined with --concat) is tokenized
 * with a Hugging Face byte-level BPE tokenizer (src/sfi_tokenizer.h). A
 * request's prompt is its first --prompt tokens; the rest are decode steps,
 * teacher-forced: step t feeds token d[P-1+t] (the last prompt token at
 * t = 0), attends over ctx_len = P + t positions and "produces" d[P+t].
 * Step kinds come from ref/sfi_state.h's trigger policy, the same code
 * sfi-ref decodes with, fed the previous token x_{t-1} = d[P-1+t].
 *
 * The trace is written to OUT.tmp-PID and renamed to OUT on success, so a
 * failed or killed run never leaves a half-written OUT. OUT itself follows
 * the trace rule of sfi_trace_replaceable: only an sfi trace nobody is
 * writing (or an empty file) is replaced. */
#include <config.h>

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sfi_params.h"
#include "sfi_state.h"
#include "sfi_tokenizer.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: tokenize_corpus --tokenizer DIR --out OUT.db [options] FILE...\n\n"
                 "Turns text files into a tokens-level SFI decode trace (sfi-trace(5)).\n"
                 "Each FILE is one document and one request: its first --prompt tokens are\n"
                 "the prompt, the following tokens are decode steps whose slow/fast kinds\n"
                 "come from the trigger policy.\n\n"
                 "options:\n"
                 "  --tokenizer DIR     Hugging Face tokenizer directory (vocab.json, merges.txt)\n"
                 "  --out FILE          trace to write (an existing sfi trace is replaced;\n"
                 "                      any other file is refused)\n"
                 "  --prompt N          prompt tokens per request (default 8192)\n"
                 "  --steps N           at most N decode steps per request (default: the rest)\n"
                 "  --concat            join all FILEs (blank line between) into one document\n"
                 "  --windows           cut each document into consecutive windows of\n"
                 "                      prompt + steps tokens, one request each (needs --steps)\n"
                 "  --max-requests N    stop after N requests (default: no limit)\n"
                 "  --policy NAME       trigger policy: sfi, tmax, boundary, interval, always,\n"
                 "                      never (default sfi)\n"
                 "  --interval N        period of the interval policy (default 64)\n"
                 "  --param KEY=VALUE   an SFI parameter (e.g. T_max=64, trigger_chars=.?!)\n"
                 "  -h, --help          this help\n\n"
                 "Documents shorter than prompt + 1 tokens are skipped (noted on stderr).\n");
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "tokenize_corpus: %s: '%s' is not an integer in [%ld, %ld]\n", opt, s, lo,
                hi);
        return 0;
    }
    *out = v;
    return 1;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tokenize_corpus: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fprintf(stderr, "tokenize_corpus: %s: out of memory\n", path);
            fclose(f);
            return NULL;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "tokenize_corpus: %s: read error\n", path);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* "sha256:HEX" of a file's bytes into out (65 + 7 chars), "" if unreadable. */
static void sha256_file(const char *path, char *out, size_t n)
{
    out[0] = '\0';
    size_t len;
    FILE *probe = fopen(path, "rb");
    if (!probe)
        return;
    fclose(probe);
    char *data = read_all(path, &len);
    if (!data)
        return;
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) == 1 && mdlen == 32) {
        int off = snprintf(out, n, "sha256:");
        for (int i = 0; i < 32 && off + 2 < (int)n; i++)
            off += snprintf(out + off, n - (size_t)off, "%02x", md[i]);
    }
    free(data);
}

typedef struct {
    sfi_trace_writer *w;
    sfi_trigger_kind trig;
    const sfi_params *prm;
    const uint8_t *is_trigger;
    int32_t n_vocab;
    int interval;
    long prompt, steps;
    int windows;
    long max_requests;
    long n_requests;
    int64_t n_steps, n_slow;
} ctx;

/* One request from tokens ids[0..n) (n > prompt). */
static int emit(ctx *c, const int32_t *ids, size_t n, const char *name)
{
    sfi_error e;
    int64_t id;
    if (sfi_trace_add_request(c->w, ids, (int32_t)c->prompt, &id, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s: %s\n", name, e.msg);
        return 0;
    }
    sfi_trigger_policy tp;
    sfi_trigger_policy_init(&tp, c->trig, c->prm, c->is_trigger, c->n_vocab, c->interval);
    size_t n_steps = n - (size_t)c->prompt;
    if (c->steps > 0 && n_steps > (size_t)c->steps)
        n_steps = (size_t)c->steps;
    for (size_t t = 0; t < n_steps; t++) {
        sfi_step_reason reason;
        int32_t prev = ids[c->prompt - 1 + (long)t];
        sfi_step_kind kind = sfi_trigger_next(&tp, prev, &reason);
        if (sfi_trace_append_step(c->w, id, (int64_t)t, (int32_t)(c->prompt + (long)t),
                                  ids[c->prompt + (long)t], kind, reason, &e) != SFI_OK) {
            fprintf(stderr, "tokenize_corpus: %s: %s\n", name, e.msg);
            return 0;
        }
        c->n_slow += kind == SFI_STEP_SLOW;
    }
    c->n_steps += (int64_t)n_steps;
    c->n_requests++;
    return 1;
}

/* Requests of one document; returns 0 on error. */
static int document(ctx *c, const sfi_tokenizer *tok, const char *text, size_t len,
                    const char *name)
{
    int32_t *ids;
    size_t n;
    sfi_error e;
    if (sfi_tokenizer_encode(tok, text, len, &ids, &n, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s: %s\n", name, e.msg);
        return 0;
    }
    int ok = 1;
    if (n <= (size_t)c->prompt) {
        fprintf(stderr,
                "tokenize_corpus: %s: %zu tokens, not more than the prompt (%ld): skipped\n", name,
                n, c->prompt);
    } else if (!c->windows) {
        if (c->max_requests <= 0 || c->n_requests < c->max_requests)
            ok = emit(c, ids, n, name);
    } else {
        size_t win = (size_t)(c->prompt + c->steps);
        for (size_t off = 0; ok && off + win <= n; off += win) {
            if (c->max_requests > 0 && c->n_requests >= c->max_requests)
                break;
            ok = emit(c, ids + off, win, name);
        }
    }
    free(ids);
    return ok;
}

int main(int argc, char **argv)
{
    const char *tok_dir = NULL, *out = NULL, *policy = "sfi";
    long prompt = 8192, steps = 0, max_requests = 0, interval = 64;
    int concat = 0, windows = 0;
    sfi_params prm;
    sfi_params_default(&prm);
    sfi_error e;
    int first_file = argc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--concat")) {
            concat = 1;
        } else if (!strcmp(a, "--windows")) {
            windows = 1;
        } else if (a[0] == '-' && a[1] == '-' && !has_val) {
            fprintf(stderr, "tokenize_corpus: %s needs a value (or is unknown)\n", a);
            return 2;
        } else if (!strcmp(a, "--tokenizer")) {
            tok_dir = argv[++i];
        } else if (!strcmp(a, "--out")) {
            out = argv[++i];
        } else if (!strcmp(a, "--policy")) {
            policy = argv[++i];
        } else if (!strcmp(a, "--prompt")) {
            if (!parse_int(a, argv[++i], 1, SFI_TRACE_MAX_TOKENS_PER_REQUEST, &prompt))
                return 2;
        } else if (!strcmp(a, "--steps")) {
            if (!parse_int(a, argv[++i], 1, SFI_TRACE_MAX_TOKENS_PER_REQUEST, &steps))
                return 2;
        } else if (!strcmp(a, "--max-requests")) {
            if (!parse_int(a, argv[++i], 1, 1L << 30, &max_requests))
                return 2;
        } else if (!strcmp(a, "--interval")) {
            if (!parse_int(a, argv[++i], 1, 1L << 30, &interval))
                return 2;
        } else if (!strcmp(a, "--param")) {
            if (sfi_params_set(&prm, argv[++i], "--param", &e) != SFI_OK) {
                fprintf(stderr, "tokenize_corpus: %s\n", e.msg);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tokenize_corpus: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            first_file = i;
            break;
        }
    }
    if (!tok_dir || !out || first_file >= argc) {
        fprintf(stderr, "tokenize_corpus: --tokenizer, --out and at least one FILE are needed\n");
        usage(stderr);
        return 2;
    }
    if (windows && !steps) {
        fprintf(stderr, "tokenize_corpus: --windows needs --steps\n");
        return 2;
    }
    sfi_trigger_kind trig;
    if (sfi_trigger_policy_parse(policy, &trig, &e) != SFI_OK ||
        sfi_params_validate(&prm, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s\n", e.msg);
        return 2;
    }
    /* Before the tokenizer loads: a refused --out fails at once. */
    if (sfi_trace_replaceable(out, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s\n", e.msg);
        return 1;
    }
    sfi_tokenizer *tok;
    if (sfi_tokenizer_load(tok_dir, &tok, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s\n", e.msg);
        return 1;
    }
    const sfi_vocab *vocab = sfi_tokenizer_vocab(tok);
    sfi_trigger_set ts;
    if (sfi_trigger_set_build(vocab, prm.trigger_chars, &ts, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s\n", e.msg);
        sfi_tokenizer_free(tok);
        return 1;
    }
    /* Tokenizer identity: directory name plus the hashes of its files. */
    char h_vocab[80], h_merges[80], identity[1024], path[4096];
    snprintf(path, sizeof path, "%s/vocab.json", tok_dir);
    sha256_file(path, h_vocab, sizeof h_vocab);
    snprintf(path, sizeof path, "%s/merges.txt", tok_dir);
    sha256_file(path, h_merges, sizeof h_merges);
    const char *base = strrchr(tok_dir, '/');
    base = base && base[1] ? base + 1 : tok_dir;
    snprintf(identity, sizeof identity, "%s; vocab.json %s; merges.txt %s; n_vocab %d", base,
             h_vocab, h_merges, (int)sfi_vocab_size(vocab));
    char *params_json = sfi_params_to_json(&prm);

    size_t tmp_n = strlen(out) + 32;
    char *tmp = malloc(tmp_n);
    if (!tmp || !params_json) {
        fprintf(stderr, "tokenize_corpus: out of memory\n");
        free(tmp);
        free(params_json);
        sfi_trigger_set_free(&ts);
        sfi_tokenizer_free(tok);
        return 1;
    }
    snprintf(tmp, tmp_n, "%s.tmp-%ld", out, (long)getpid());
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "tokenize_corpus";
    m.tool_version = PACKAGE_VERSION;
    m.model_config_json = "{}";
    m.tokenizer = identity;
    m.params_json = params_json;
    m.policy = sfi_trigger_kind_name(trig);
    m.level = SFI_TRACE_TOKENS;
    m.n_vocab = sfi_vocab_size(vocab);
    ctx c = {0};
    c.trig = trig;
    c.prm = &prm;
    c.is_trigger = ts.is_trigger;
    c.n_vocab = ts.n_vocab;
    c.interval = (int)interval;
    c.prompt = prompt;
    c.steps = steps;
    c.windows = windows;
    c.max_requests = max_requests;
    int rc = 1;
    if (sfi_trace_create(tmp, &m, SFI_TRACE_OVERWRITE, 0, &c.w, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s\n", e.msg);
        goto done;
    }
    int ok = 1;
    if (concat) {
        char *all = NULL;
        size_t n_all = 0;
        for (int i = first_file; ok && i < argc; i++) {
            size_t len;
            char *t = read_all(argv[i], &len);
            char *na = t ? realloc(all, n_all + len + 2) : NULL;
            if (!na) {
                ok = 0;
                free(t);
                break;
            }
            all = na;
            if (n_all) {
                memcpy(all + n_all, "\n\n", 2);
                n_all += 2;
            }
            memcpy(all + n_all, t, len);
            n_all += len;
            free(t);
        }
        if (ok)
            ok = document(&c, tok, all ? all : "", n_all, "(concatenated files)");
        free(all);
    } else {
        for (int i = first_file; ok && i < argc; i++) {
            size_t len;
            char *t = read_all(argv[i], &len);
            ok = t && document(&c, tok, t, len, argv[i]);
            free(t);
        }
    }
    if (ok && c.n_requests == 0) {
        fprintf(stderr, "tokenize_corpus: no document is longer than the prompt (%ld tokens)\n",
                prompt);
        ok = 0;
    }
    if (!ok) {
        sfi_trace_writer_close(c.w);
        goto done;
    }
    if (sfi_trace_finish(c.w, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s\n", e.msg);
        goto done;
    }
    /* Once more: a writer may have started on OUT meanwhile. */
    if (sfi_trace_replaceable(out, &e) != SFI_OK) {
        fprintf(stderr, "tokenize_corpus: %s\n", e.msg);
        goto done;
    }
    if (rename(tmp, out) != 0) {
        fprintf(stderr, "tokenize_corpus: %s: cannot rename to %s: %s\n", tmp, out,
                strerror(errno));
        goto done;
    }
    printf("%s: %ld requests, %lld steps, %lld slow (fraction %.4f)\n", out, c.n_requests,
           (long long)c.n_steps, (long long)c.n_slow,
           c.n_steps ? (double)c.n_slow / (double)c.n_steps : 0.0);
    rc = 0;
done:
    if (rc) {
        unlink(tmp);
        char side[4200];
        snprintf(side, sizeof side, "%s-wal", tmp);
        unlink(side);
        snprintf(side, sizeof side, "%s-shm", tmp);
        unlink(side);
    }
    free(tmp);
    free(params_json);
    sfi_trigger_set_free(&ts);
    sfi_tokenizer_free(tok);
    return rc;
}
