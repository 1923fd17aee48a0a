/* The token stream of sfi-sim (see sfi_sim_stream.h). */
#include <config.h>

#include "sfi_sim_stream.h"

#include <glob.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_replay.h"
#include "sfi_state.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

#define SYNTH_TOKENS 65536
#define SYNTH_MEAN_SENTENCE 24.0


static sfi_status load_trigger_set(const char *dir, uint8_t **is_trigger, int32_t *n_vocab,
                                   const sfi_params *prm, sfi_error *err)
{
    sfi_vocab *v;
    sfi_status st = sfi_vocab_load(dir, &v, err);
    if (st)
        return st;
    sfi_trigger_set ts;
    st = sfi_trigger_set_build(v, prm->trigger_chars, &ts, err);
    sfi_vocab_free(v);
    if (st)
        return st;
    *is_trigger = ts.is_trigger;
    *n_vocab = ts.n_vocab;
    ts.is_trigger = NULL;
    sfi_trigger_set_free(&ts);
    return SFI_OK;
}

/* Appends every request's decode tokens of a trace. */
/* 1 when a trace's recorded step reasons tell, for every decode token but
 * the last of a request, whether it is in the trigger set that `prm`
 * defines: recorded under the sfi or boundary policy (whose step t >= 1 is
 * slow with reason "trigger" exactly when x_{t-1} is a trigger token, see
 * sfi_trigger_next) with the same trigger characters. */
static int reasons_reveal_triggers(const sfi_trace_meta *m, const sfi_params *prm)
{
    if (!m->policy || (strcmp(m->policy, "sfi") && strcmp(m->policy, "boundary")))
        return 0;
    sfi_params def;
    sfi_params_default(&def);
    const char *chars = def.trigger_chars;
    json_t *pj = m->params_json ? json_loads(m->params_json, 0, NULL) : NULL;
    json_t *tc = pj ? json_object_get(pj, "trigger_chars") : NULL;
    if (tc && json_is_string(tc))
        chars = json_string_value(tc);
    int same = !strcmp(chars, prm->trigger_chars);
    json_decref(pj);
    return same;
}

static sfi_status load_trace_tokens(const char *path, int32_t **tokens, uint8_t **flags,
                                    int *all_reveal, const sfi_params *prm, int64_t *n,
                                    sfi_sim_stream *rq, char *tok_id, size_t tok_cap,
                                    int *skipped, sfi_error *err)
{
    int64_t *n_req = &rq->n_requests;
    sfi_trace *t;
    sfi_status st = sfi_trace_open(path, &t, err);
    if (st)
        return st;
    /* Joined traces must share one vocabulary: the trigger set is one. */
    const char *tk = sfi_trace_get_meta(t)->tokenizer;
    if (!tk)
        tk = "";
    if (skipped && *n > 0 && strcmp(tk, tok_id)) {
        fprintf(stderr, "sfi-sim: %s: recorded with another tokenizer than the first trace; skipped\n",
                path);
        sfi_trace_close(t);
        (*skipped)++;
        return SFI_OK;
    }
    if (*n == 0)
        snprintf(tok_id, tok_cap, "%s", tk);
    int64_t nr = sfi_trace_n_requests(t), total = sfi_trace_n_steps(t);
    /* A killed or still running recorder's trace is valid but partial:
     * say so rather than price it as if it were the whole run. */
    if (!sfi_trace_complete(t))
        fprintf(stderr, "sfi-sim: note: %s is incomplete (its writer did not finish); using its "
                "%lld committed steps\n", path, (long long)total);
    if (total < 1) {
        sfi_trace_close(t);
        return sfi_error_set(err, SFI_EFORMAT, "%s: trace has no decode steps to replay", path);
    }
    int32_t *buf = realloc(*tokens, (size_t)(*n + total) * sizeof *buf);
    if (buf)
        *tokens = buf;
    uint8_t *fl = buf ? realloc(*flags, (size_t)(*n + total)) : NULL;
    if (!buf || !fl) {
        sfi_trace_close(t);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    *flags = fl;
    if (!reasons_reveal_triggers(sfi_trace_get_meta(t), prm))
        *all_reveal = 0;
    int32_t *rp = realloc(rq->req_prompt, (size_t)(*n_req + nr + 1) * sizeof *rp);
    if (rp)
        rq->req_prompt = rp;
    int64_t *rs = rp ? realloc(rq->req_steps, (size_t)(*n_req + nr + 1) * sizeof *rs) : NULL;
    if (!rs) {
        sfi_trace_close(t);
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", path);
    }
    rq->req_steps = rs;
    int64_t got = 0;
    for (int64_t r = 0; r < nr && !st; r++) {
        sfi_trace_request tr;
        st = sfi_trace_read_request(t, r, &tr, err);
        if (st)
            break;
        rp[*n_req + r] = tr.n_prompt;
        sfi_trace_request_free(&tr);
        sfi_trace_steps s;
        st = sfi_trace_read_steps(t, r, &s, err);
        if (st)
            break;
        rs[*n_req + r] = s.n;
        if (got + s.n > total) {
            st = sfi_error_set(err, SFI_EFORMAT, "%s: more steps than the trace's count", path);
        } else {
            memcpy(buf + *n + got, s.token, (size_t)s.n * sizeof *buf);
            /* Token i is a trigger iff step i+1 was slow for a trigger; the
             * request's last token is taken as none. */
            for (int64_t i = 0; i < s.n; i++)
                fl[*n + got + i] = i + 1 < s.n && s.reason[i + 1] == SFI_REASON_TRIGGER;
            got += s.n;
        }
        sfi_trace_steps_free(&s);
    }
    sfi_trace_close(t);
    if (st)
        return st;
    *n += got;
    *n_req += nr;
    return SFI_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

sfi_status sfi_sim_stream_load(const char *trace_opt, const char *tok_dir, int synthetic,
                               const sfi_params *prm, sfi_sim_stream *s, sfi_error *err)
{
    memset(s, 0, sizeof *s);
    char *paths[64];
    int n_paths = 0;
    glob_t g;
    int have_glob = 0;
    const char *env = getenv("SFI_TRACE");
    if (trace_opt) {
        paths[n_paths++] = (char *)trace_opt;
    } else if (!synthetic && env && env[0]) {
        paths[n_paths++] = (char *)env;
    } else if (!synthetic) {
        /* The bundled samples: sample-*.db if present, else every *.db of
         * traces/ (kjv-8k.db, ...). Only traces recorded with the same
         * tokenizer as the first one are joined (checked when loading). */
        const char *dirs[] = {SFI_SIM_SRCDIR "/traces", SFI_SIM_PKGDATADIR "/traces"};
        const char *pats[] = {"sample-*.db", "*.db"};
        for (int d = 0; d < 2 && !n_paths; d++)
            for (int k = 0; k < 2 && !n_paths; k++) {
                char pat[4096];
                snprintf(pat, sizeof pat, "%s/%s", dirs[d], pats[k]);
                if (have_glob)
                    globfree(&g);
                have_glob = 0;
                if (glob(pat, 0, NULL, &g) == 0) {
                    have_glob = 1;
                    for (size_t i = 0; i < g.gl_pathc && n_paths < 64; i++)
                        paths[n_paths++] = g.gl_pathv[i];
                    qsort(paths, (size_t)n_paths, sizeof *paths, cmp_str);
                }
            }
        if (!n_paths)
            fprintf(stderr,
                    "sfi-sim: no sample trace found (looked for *.db in %s/traces and "
                    "%s/traces; set SFI_TRACE or pass --trace): using a SYNTHETIC trigger "
                    "stream\n",
                    SFI_SIM_SRCDIR, SFI_SIM_PKGDATADIR);
    }
    sfi_status st = SFI_OK;
    if (n_paths) {
        int skipped = 0, used = 0, reveal = 1;
        uint8_t *flags = NULL;
        char tok_id[256] = "";
        for (int i = 0; i < n_paths && !st; i++) {
            int before = skipped;
            /* An explicit --trace or $SFI_TRACE is one file: no skipping. */
            st = load_trace_tokens(paths[i], &s->tokens, &flags, &reveal, prm, &s->n_tokens, s,
                                   tok_id, sizeof tok_id, n_paths > 1 ? &skipped : NULL, err);
            used += !st && skipped == before;
        }
        const char *how = "";
        if (!st && reveal && !tok_dir) {
            /* The recorded decisions already say which tokens are
             * triggers: replay a 0/1 stream and skip loading the 4 MB
             * vocabulary (same decisions through sfi_trigger_next). */
            for (int64_t i = 0; i < s->n_tokens; i++)
                s->tokens[i] = flags[i];
            s->is_trigger = malloc(2);
            if (!s->is_trigger) {
                st = sfi_error_set(err, SFI_ENOMEM, "out of memory");
            } else {
                s->is_trigger[0] = 0;
                s->is_trigger[1] = 1;
                s->n_vocab = 2;
                how = "; trigger tokens from its recorded decisions";
            }
        } else if (!st) {
            const char *dir = tok_dir ? tok_dir : SFI_SIM_SRCDIR "/tests/fixtures/qwen3-tokenizer";
            st = load_trigger_set(dir, &s->is_trigger, &s->n_vocab, prm, err);
            if (st)
                sfi_error_prefix(err, "trigger set (--tokenizer)");
            /* Sentence ends from another vocabulary than the trace's are
             * other token ids: say so (the meta names the recorded one). */
            else if (sfi_trace_tokenizer_matches(tok_id, dir) == 0)
                fprintf(stderr, "sfi-sim: note: %s/vocab.json is not the vocabulary %s was "
                        "recorded with (meta tokenizer: %.160s); its trigger tokens are "
                        "taken from %s all the same\n", dir, paths[0], tok_id, dir);
        }
        free(flags);
        if (!st) {
            char more[32] = "";
            if (used > 1)
                snprintf(more, sizeof more, " + %d more", used - 1);
            snprintf(s->label, sizeof s->label,
                     "trace %s%s (%lld requests, %lld decode tokens%s)", paths[0], more,
                     (long long)s->n_requests, (long long)s->n_tokens, how);
        }
        if (have_glob)
            globfree(&g);
        if (st)
            sfi_sim_stream_free(s);
        return st;
    }
    if (have_glob)
        globfree(&g);
    st = sfi_replay_synthetic(SYNTH_TOKENS, SYNTH_MEAN_SENTENCE, 1, &s->tokens, &s->is_trigger, err);
    if (st)
        return st;
    s->n_tokens = SYNTH_TOKENS;
    s->n_vocab = 2;
    snprintf(s->label, sizeof s->label,
             "SYNTHETIC trigger stream (mean sentence %.0f tokens; no trace)", SYNTH_MEAN_SENTENCE);
    return SFI_OK;
}

void sfi_sim_stream_free(sfi_sim_stream *s)
{
    if (!s)
        return;
    free(s->tokens);
    free(s->is_trigger);
    free(s->req_prompt);
    free(s->req_steps);
    memset(s, 0, sizeof *s);
}
