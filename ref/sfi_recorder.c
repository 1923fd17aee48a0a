/* The sfi-ref run trace recorder (see sfi_recorder.h for the mapping of
 * decode events onto the trace). */
#include <config.h>

#include "sfi_recorder.h"
#include "sfi_io.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sfi_io.h"
#include "sfi_params.h"
#include "sfi_policies.h"
#include "sfi_state.h"

void sfi_recorder_opts_default(sfi_recorder_opts *o)
{
    o->path = NULL;
    o->level = SFI_TRACE_TOKENS;
    o->top_m = 4096;
    o->layers = NULL;
    o->qk = 0;
    o->calib = NULL;
    o->given = 0;
    o->tokenizer_dir = NULL;
}

sfi_status sfi_recorder_opts_check(const sfi_recorder_opts *o, sfi_error *err)
{
    static const char *const names[] = {"--trace-level", "--trace-top-m", "--trace-layers"};
    if (!o->path) {
        for (int k = 0; k < 3; k++)
            if (o->given & (1u << k))
                return sfi_error_set(err, SFI_EINVAL,
                                     "%s needs --trace FILE (nothing is "
                                     "recorded without it)",
                                     names[k]);
        if (o->qk)
            return sfi_error_set(err, SFI_EINVAL,
                                 "--trace-qk%s needs --trace FILE (nothing "
                                 "is recorded without it)",
                                 o->qk > 1 ? "v" : "");
        if (o->calib)
            return sfi_error_set(err, SFI_EINVAL,
                                 "--trace-calib needs --trace FILE (nothing "
                                 "is recorded without it)");
        return SFI_OK;
    }
    if (o->qk && o->level != SFI_TRACE_FULL)
        return sfi_error_set(err, SFI_EINVAL, "--trace-qk%s needs --trace-level full",
                             o->qk > 1 ? "v" : "");
    if ((o->given & SFI_RECORDER_GIVEN_TOP_M) && o->level != SFI_TRACE_FULL)
        return sfi_error_set(err, SFI_EINVAL,
                             "--trace-top-m applies to the full level only "
                             "(add --trace-level full)");
    if ((o->given & SFI_RECORDER_GIVEN_LAYERS) && o->level == SFI_TRACE_TOKENS)
        return sfi_error_set(err, SFI_EINVAL,
                             "--trace-layers applies to the summary and full "
                             "levels (the tokens level has no per-layer records)");
    return SFI_OK;
}

const char *sfi_recorder_usage(void)
{
    return "      --trace FILE       record the run into the SQLite trace FILE\n"
           "                         (sfi-trace(5)); an existing FILE is replaced\n"
           "                         only when it is an sfi trace no one is writing\n"
           "      --trace-level L    tokens (default), summary (selected sets, captured\n"
           "                         mass, lambda*, fast-step mass) or full (also the\n"
           "                         top-M dense attention of every step)\n"
           "      --trace-top-m M    M of the full level's top-M records (default 4096)\n"
           "      --trace-layers L   summary/full: keep the per-layer records of these\n"
           "                         layers only (comma-separated, e.g. 0,5,9; default\n"
           "                         all)\n"
           "      --trace-qk         full: also every step's query, the prompt's last 32\n"
           "                         queries and accumulated attention, and the key cache\n"
           "                         at the last step (sfi-sim analyze then runs every\n"
           "                         policy on real queries and keys)\n"
           "      --trace-qkv        --trace-qk and the value cache (output error)\n"
           "      --trace-calib F    store the Kascade/FASA calibration F (sfi-ref\n"
           "                         calibrate) in the trace's meta\n";
}

/* Parses "0,5,9" into mask[n_layers] (NULL mask: only check syntax). */
static int parse_layers(const char *spec, uint8_t *mask, int n_layers)
{
    const char *p = spec;
    if (!*p)
        return 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v >= SFI_TRACE_MAX_LAYERS || (*end && *end != ','))
            return 0;
        if (mask) {
            if (v >= n_layers)
                return 0;
            mask[v] = 1;
        }
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p)
            return 0;
    }
    return 1;
}

int sfi_recorder_set_option(sfi_recorder_opts *o, const char *name, const char *v, sfi_error *err)
{
    /* Every message starts with the option, once. */
    if (!strcmp(name, "trace-level")) {
        o->given |= SFI_RECORDER_GIVEN_LEVEL;
        if (sfi_trace_level_parse(v, &o->level, err) == SFI_OK)
            return 1;
        sfi_error_prefix(err, "--trace-level");
        return -1;
    }
    if (!strcmp(name, "trace-top-m")) {
        char *end;
        errno = 0;
        long m = strtol(v, &end, 10);
        if (!*v || *end || errno || m < 1 || m > SFI_TRACE_MAX_TOP_M) {
            sfi_error_set(err, SFI_EINVAL, "--trace-top-m: '%s' is not an integer in [1, %d]", v,
                          SFI_TRACE_MAX_TOP_M);
            return -1;
        }
        o->top_m = (int)m;
        o->given |= SFI_RECORDER_GIVEN_TOP_M;
        return 1;
    }
    if (!strcmp(name, "trace-layers")) {
        if (!parse_layers(v, NULL, 0)) {
            sfi_error_set(err, SFI_EINVAL,
                          "--trace-layers: '%s' is not a comma-separated list "
                          "of layer numbers",
                          v);
            return -1;
        }
        o->layers = v;
        o->given |= SFI_RECORDER_GIVEN_LAYERS;
        return 1;
    }
    if (!strcmp(name, "trace-qk") || !strcmp(name, "trace-qkv")) {
        o->qk = name[8] == 'v' ? 2 : 1;
        return 1;
    }
    if (!strcmp(name, "trace-calib")) {
        if (!*v) {
            sfi_error_set(err, SFI_EINVAL, "--trace-calib: empty file name");
            return -1;
        }
        o->calib = v;
        return 1;
    }
    if (!strcmp(name, "trace")) {
        if (!*v) {
            sfi_error_set(err, SFI_EINVAL, "--trace: empty file name");
            return -1;
        }
        o->path = v;
        return 1;
    }
    return 0;
}

int sfi_recorder_parse_arg(sfi_recorder_opts *o, int argc, char **argv, int *i, sfi_error *err)
{
    static const char *const names[] = {"trace-level", "trace-top-m", "trace-layers", "trace-calib",
                                        "trace"};
    const char *a = argv[*i];
    if (strncmp(a, "--", 2))
        return 0;
    if (!strcmp(a, "--trace-qk") || !strcmp(a, "--trace-qkv")) {
        o->qk = a[10] == 'v' ? 2 : 1;
        *i += 1;
        return 1;
    }
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        size_t n = strlen(names[k]);
        if (strncmp(a + 2, names[k], n) || (a[2 + n] != '\0' && a[2 + n] != '='))
            continue;
        const char *v;
        int used;
        if (a[2 + n] == '=') {
            v = a + 3 + n;
            used = 1;
        } else if (*i + 1 < argc) {
            v = argv[*i + 1];
            used = 2;
        } else {
            sfi_error_set(err, SFI_EINVAL, "--%s needs a value", names[k]);
            return -1;
        }
        int r = sfi_recorder_set_option(o, names[k], v, err);
        if (r == 1)
            *i += used;
        return r;
    }
    return 0;
}

struct sfi_recorder {
    sfi_trace_writer *w;
    sfi_trace_level level;
    sfi_params prm;
    int sfi_mode;
    int L, H, KV, K, M;
    int64_t req;         /* current request, -1 before the first prefill */
    uint8_t *topm_layer; /* [L]: per-layer records kept for this layer */
    /* Current selected sets (summary fast-step mass needs them). */
    sfi_state st;
    int have_state;
    /* refresh_delay >= 2: a slow step's sets, in st from step + delay on */
    sfi_state pst;
    int pend_step;     /* -1: none pending */
    int32_t *fast_idx; /* [n_sink + K + n_recent] */
    /* Records of the step in progress, written at on_step. */
    uint8_t *have_sel;  /* [L] */
    int32_t *sel;       /* [L][KV][K] */
    int32_t *nsel;      /* [L][KV] */
    float *sel_mass;    /* [L][KV] */
    float *sel_lambda;  /* [L][KV] */
    uint8_t *have_fm;   /* [L] */
    float *fm;          /* [L][KV] */
    uint8_t *have_topm; /* [L] */
    int32_t *tpos;      /* [L][H][M] */
    float *tprob;       /* [L][H][M] */
    int32_t *tm;        /* [L][H] */
    float *ttail;       /* [L][H] */
    struct pp {
        float p;
        int32_t pos;
    } * sortbuf;
    size_t sortcap;
    /* --trace-qk */
    int qk, D;
    float *qbuf;     /* [L][H*D] the step's queries */
    uint8_t *have_q; /* [L] */
    float *tail;     /* [L][TAIL][H*D] ring of prompt queries by position */
    float *colsum;   /* [L][H][col_cap] accumulated prompt attention */
    int col_cap, n_prompt;
    float *kvbuf; /* head-major copy of a cache */
    size_t kvcap;
};

static void sha256_hex(const char *path, char *out, size_t n)
{
    snprintf(out, n, "(absent)");
    /* Only a regular file is hashed: opening a FIFO would wait forever. */
    struct stat sb;
    if (stat(path, &sb) != 0)
        return;
    if (!S_ISREG(sb.st_mode)) {
        snprintf(out, n, "(not a regular file)");
        return;
    }
    FILE *f = fopen(path, "rb");
    if (!f)
        return;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char buf[65536], md[32];
    unsigned int mdlen = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;
    size_t got;
    while (ok && (got = fread(buf, 1, sizeof buf, f)) > 0)
        ok = EVP_DigestUpdate(c, buf, got) == 1;
    ok = ok && !ferror(f) && EVP_DigestFinal_ex(c, md, &mdlen) == 1 && mdlen == 32;
    fclose(f);
    EVP_MD_CTX_free(c);
    if (!ok)
        return;
    int off = snprintf(out, n, "sha256:");
    for (int i = 0; i < 32 && off + 2 < (int)n; i++)
        off += snprintf(out + off, n - (size_t)off, "%02x", md[i]);
}

static void rec_free(sfi_recorder *r)
{
    if (!r)
        return;
    if (r->st.selected)
        sfi_state_free(&r->st);
    if (r->pst.selected)
        sfi_state_free(&r->pst);
    free(r->fast_idx);
    free(r->have_sel);
    free(r->sel);
    free(r->nsel);
    free(r->sel_mass);
    free(r->sel_lambda);
    free(r->have_fm);
    free(r->fm);
    free(r->have_topm);
    free(r->topm_layer);
    free(r->tpos);
    free(r->tprob);
    free(r->tm);
    free(r->ttail);
    free(r->sortbuf);
    free(r->qbuf);
    free(r->have_q);
    free(r->tail);
    free(r->colsum);
    free(r->kvbuf);
    free(r);
}

sfi_status sfi_recorder_open(const sfi_recorder_opts *o, const char *model_dir,
                             const sfi_model_config *cfg, const sfi_decode_opts *dopts,
                             sfi_recorder **out, sfi_error *err)
{
    *out = NULL;
    if (!o->path)
        return SFI_OK;
    sfi_recorder *r = calloc(1, sizeof *r);
    if (!r)
        return sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", o->path);
    r->level = o->level;
    r->prm = dopts->params;
    r->sfi_mode = dopts->mode == SFI_DECODE_SFI;
    r->L = cfg->num_hidden_layers;
    r->H = cfg->num_attention_heads;
    r->KV = cfg->num_key_value_heads;
    r->K = dopts->params.K;
    r->M = o->top_m;
    r->req = -1;
    r->pend_step = -1;
    sfi_status st = SFI_OK;
    size_t L = (size_t)r->L, H = (size_t)r->H, KV = (size_t)r->KV, K = (size_t)r->K,
           M = (size_t)r->M;
    if (r->level >= SFI_TRACE_SUMMARY) {
        r->have_sel = calloc(L, 1);
        r->sel = malloc(L * KV * K * 4);
        r->nsel = calloc(L * KV, 4);
        r->sel_mass = calloc(L * KV, 4);
        r->sel_lambda = calloc(L * KV, 4);
        r->have_fm = calloc(L, 1);
        r->fm = calloc(L * KV, 4);
        r->fast_idx = malloc(((size_t)r->prm.n_sink + K + (size_t)r->prm.n_recent + 1) * 4);
        if (!r->have_sel || !r->sel || !r->nsel || !r->sel_mass || !r->sel_lambda || !r->have_fm ||
            !r->fm || !r->fast_idx)
            st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for summary buffers", o->path);
        if (!st && r->sfi_mode)
            st = sfi_state_init(&r->st, r->L, r->KV, r->K, err);
        if (!st && r->sfi_mode && r->prm.refresh_delay >= 2)
            st = sfi_state_init(&r->pst, r->L, r->KV, r->K, err);
    }
    if (!st && r->level >= SFI_TRACE_FULL) {
        r->have_topm = calloc(L, 1);
        r->tpos = malloc(L * H * M * 4);
        r->tprob = malloc(L * H * M * 4);
        r->tm = calloc(L * H, 4);
        r->ttail = calloc(L * H, 4);
        if (!r->have_topm || !r->tpos || !r->tprob || !r->tm || !r->ttail)
            st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for %d x %d x top-%d buffers",
                               o->path, r->L, r->H, r->M);
    }
    r->qk = o->qk;
    r->D = cfg->head_dim;
    if (!st && r->qk && r->level < SFI_TRACE_FULL)
        st = sfi_error_set(err, SFI_EINVAL, "--trace-qk%s needs --trace-level full",
                           r->qk > 1 ? "v" : "");
    if (!st && r->qk) {
        size_t qd = H * (size_t)r->D;
        r->qbuf = malloc(L * qd * 4);
        r->have_q = calloc(L, 1);
        r->tail = malloc(L * SFI_RECORDER_QK_TAIL * qd * 4);
        if (!r->qbuf || !r->have_q || !r->tail)
            st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory for query buffers", o->path);
    }
    char *calib_text = NULL;
    if (!st && o->calib) {
        sfi_policy_calib cal;
        size_t n = 0;
        if (!(st = sfi_policy_calib_load(o->calib, &cal, err))) {
            if (cal.n_layers != r->L || cal.n_kv_heads != r->KV ||
                (cal.head_dim && cal.head_dim != cfg->head_dim))
                st = sfi_error_set(err, SFI_EINVAL,
                                   "--trace-calib %s: for %d layers x %d KV "
                                   "heads x head_dim %d, the model has %d x %d x %d",
                                   o->calib, cal.n_layers, cal.n_kv_heads, cal.head_dim, r->L,
                                   r->KV, cfg->head_dim);
            sfi_policy_calib_free(&cal);
        }
        if (!st)
            st =
                sfi_io_read(o->calib, (size_t)64 << 20, "policy calibration", &calib_text, &n, err);
    }
    if (!st && !(r->topm_layer = calloc(L ? L : 1, 1)))
        st = sfi_error_set(err, SFI_ENOMEM, "%s: out of memory", o->path);
    if (!st && !o->layers)
        memset(r->topm_layer, 1, L);
    else if (!st && !parse_layers(o->layers, r->topm_layer, r->L))
        st = sfi_error_set(err, SFI_EINVAL,
                           "--trace-layers: '%s' is not a list of layers in "
                           "[0, %d)",
                           o->layers, r->L);
    if (st) {
        free(calib_text);
        rec_free(r);
        return st;
    }
    /* Meta: the model's config.json text and tokenizer files' hashes. */
    char dir[4096], path[4200];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s", model_dir ? model_dir : ".");
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *config = NULL;
    size_t config_len = 0;
    /* The file sfi_qwen3_load already read; its limit again (it may have
     * changed since, or be a pipe: then it is simply not recorded). */
    if (sfi_io_read(path, 16u << 20, "a config.json", &config, &config_len, NULL) != SFI_OK ||
        memchr(config, '\0', config_len)) {
        free(config);
        config = NULL;
    }
    /* The tokenizer that produced the ids: --tokenizer DIR, else the model
     * directory. */
    const char *tdir = o->tokenizer_dir ? o->tokenizer_dir : dir;
    char hv[80], hm[80], tokid[400];
    snprintf(path, sizeof path, "%s/vocab.json", tdir);
    sha256_hex(path, hv, sizeof hv);
    snprintf(path, sizeof path, "%s/merges.txt", tdir);
    sha256_hex(path, hm, sizeof hm);
    if (o->tokenizer_dir)
        snprintf(tokid, sizeof tokid, "%.200s; vocab.json %s; merges.txt %s", tdir, hv, hm);
    else
        snprintf(tokid, sizeof tokid, "model directory; vocab.json %s; merges.txt %s", hv, hm);
    /* Meta text holds no control characters and only UTF-8 (sfi-trace(5));
     * a directory name may hold anything: '?' stands for such bytes. */
    for (unsigned char *u = (unsigned char *)tokid; *u; u++)
        if (*u < 0x20 || *u >= 0x7f)
            *u = '?';
    char *pjson = sfi_params_to_json(&dopts->params);
    sfi_trace_meta m;
    sfi_trace_meta_init(&m);
    m.tool = "sfi-ref";
    m.tool_version = PACKAGE_VERSION;
    m.model_config_json = config ? config : "{}";
    m.tokenizer = tokid;
    m.params_json = pjson ? pjson : "{}";
    m.policy = r->sfi_mode ? sfi_trigger_kind_name(dopts->trigger) : "dense";
    m.level = r->level;
    m.n_vocab = cfg->vocab_size;
    m.n_layers = r->L;
    m.n_heads = r->H;
    m.n_kv_heads = r->KV;
    m.head_dim = cfg->head_dim;
    m.top_m = r->level == SFI_TRACE_FULL ? r->M : 0;
    m.topm_heads = SFI_TRACE_HEADS_QUERY;
    /* commit_every 1: each step is committed when the next one starts,
     * and on_step flushes explicitly, so every finished step is durable. */
    st = sfi_trace_create(o->path, &m, SFI_TRACE_OVERWRITE, 1, &r->w, err);
    free(config);
    free(pjson);
    if (!st && r->level == SFI_TRACE_FULL)
        st = sfi_trace_put_meta(r->w, "topm_layers", o->layers ? o->layers : "all", err);
    if (!st && r->level >= SFI_TRACE_SUMMARY)
        st = sfi_trace_put_meta(r->w, "layers_recorded", o->layers ? o->layers : "all", err);
    if (!st && calib_text)
        st = sfi_trace_put_meta(r->w, "peer_calibration", calib_text, err);
    free(calib_text);
    if (!st)
        st = sfi_trace_flush(r->w, err);
    if (st) {
        sfi_trace_writer_close(r->w);
        rec_free(r);
        return st;
    }
    *out = r;
    return SFI_OK;
}

static sfi_status on_prefill(void *user, const sfi_decode_prefill_info *info, sfi_error *err)
{
    sfi_recorder *r = user;
    if (info->n_layers != r->L || info->n_heads != r->H || info->n_kv_heads != r->KV)
        return sfi_error_set(err, SFI_EINVAL,
                             "trace recorder: model shape %dx%dx%d differs from "
                             "the trace's %dx%dx%d",
                             info->n_layers, info->n_heads, info->n_kv_heads, r->L, r->H, r->KV);
    sfi_status st = sfi_trace_add_request(r->w, info->prompt, info->n_prompt, &r->req, err);
    if (st)
        return st;
    if (r->level >= SFI_TRACE_SUMMARY && r->sfi_mode && info->state) {
        const sfi_state *s = info->state;
        if (s->n_layers != r->L || s->n_kv_heads != r->KV || s->K != r->K)
            return sfi_error_set(err, SFI_EINVAL, "trace recorder: state shape differs");
        memcpy(r->st.selected, s->selected, (size_t)r->L * r->KV * r->K * 4);
        memcpy(r->st.n_selected, s->n_selected, (size_t)r->L * r->KV * sizeof(int));
        r->have_state = 1;
    }
    r->pend_step = -1;
    return SFI_OK;
}

/* Deferred refresh: the pending sets take effect at step pend_step +
 * refresh_delay (the decode loop's rule), before that step's attention. */
static void install_pending(sfi_recorder *r, int step)
{
    if (r->pend_step < 0 || step < r->pend_step + r->prm.refresh_delay)
        return;
    memcpy(r->st.selected, r->pst.selected, (size_t)r->L * r->KV * r->K * 4);
    memcpy(r->st.n_selected, r->pst.n_selected, (size_t)r->L * r->KV * sizeof(int));
    r->pend_step = -1;
}

static sfi_status on_slow_layer(void *user, const sfi_decode_slow_layer_info *info, sfi_error *err)
{
    sfi_recorder *r = user;
    if (r->level < SFI_TRACE_SUMMARY)
        return SFI_OK;
    install_pending(r, info->step);
    /* deferred sets wait (a later slow step's replace them) */
    sfi_state *cur = info->deferred && r->pst.selected ? &r->pst : &r->st;
    if (cur == &r->pst)
        r->pend_step = info->step;
    int l = info->layer;
    if (l >= 0 && l < r->L && !r->topm_layer[l]) {
        /* Not recorded, but the fast-step set of this layer still follows
         * the Selector (only recorded layers read it, so nothing else). */
        return SFI_OK;
    }
    if (l < 0 || l >= r->L || info->n_kv_heads != r->KV || info->K != r->K || info->n_heads != r->H)
        return sfi_error_set(err, SFI_EINVAL,
                             "trace recorder: slow-layer record of layer %d "
                             "has an unexpected shape",
                             l);
    int G = r->H / r->KV;
    for (int h = 0; h < r->KV; h++) {
        int n = info->n_selected[h];
        const int32_t *src = info->selected + (size_t)h * r->K;
        memcpy(r->sel + ((size_t)l * r->KV + h) * r->K, src, (size_t)n * 4);
        r->nsel[l * r->KV + h] = n;
        double mass = 0.0;
        for (int g = 0; g < G; g++)
            mass += info->captured_mass[h * G + g];
        r->sel_mass[l * r->KV + h] = (float)(mass / G);
        r->sel_lambda[l * r->KV + h] = info->lambda[h];
        if (r->sfi_mode) {
            memcpy(cur->selected + ((size_t)l * r->KV + h) * r->K, src, (size_t)n * 4);
            cur->n_selected[l * r->KV + h] = n;
        }
    }
    r->have_sel[l] = 1;
    return SFI_OK;
}

static int by_prob_desc(const void *a, const void *b)
{
    const struct pp *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static sfi_status on_attention(void *user, const sfi_decode_attention_info *info, sfi_error *err)
{
    sfi_recorder *r = user;
    int l = info->layer, n = info->n_ctx;
    if (l < 0 || l >= r->L || info->n_heads != r->H || n < 1)
        return sfi_error_set(err, SFI_EINVAL,
                             "trace recorder: attention record of layer %d has "
                             "an unexpected shape",
                             l);
    install_pending(r, info->step);
    if (r->level >= SFI_TRACE_FULL && r->topm_layer[l]) {
        if (r->sortcap < (size_t)n) {
            struct pp *nb = realloc(r->sortbuf, (size_t)n * sizeof *nb);
            if (!nb)
                return sfi_error_set(err, SFI_ENOMEM, "trace recorder: out of memory");
            r->sortbuf = nb;
            r->sortcap = (size_t)n;
        }
        int m = n < r->M ? n : r->M;
        for (int h = 0; h < r->H; h++) {
            const float *p = info->probs + (size_t)h * n;
            for (int i = 0; i < n; i++) {
                r->sortbuf[i].p = p[i];
                r->sortbuf[i].pos = i;
            }
            qsort(r->sortbuf, (size_t)n, sizeof *r->sortbuf, by_prob_desc);
            size_t base = ((size_t)l * r->H + h) * r->M;
            double sum = 0.0;
            for (int i = 0; i < m; i++) {
                r->tpos[base + i] = r->sortbuf[i].pos;
                r->tprob[base + i] = r->sortbuf[i].p;
                sum += r->sortbuf[i].p;
            }
            double tail = 1.0 - sum;
            r->tm[l * r->H + h] = m;
            r->ttail[l * r->H + h] = (float)(tail < 0.0 ? 0.0 : tail > 1.0 ? 1.0 : tail);
        }
        r->have_topm[l] = 1;
    }
    if (r->level >= SFI_TRACE_SUMMARY && info->kind == SFI_STEP_FAST && r->have_state &&
        r->topm_layer[l]) {
        int G = r->H / r->KV;
        for (int h = 0; h < r->KV; h++) {
            int ni = 0;
            sfi_state_fast_set(&r->st, &r->prm, l, h, n, r->fast_idx, &ni);
            double mass = 0.0;
            for (int g = 0; g < G; g++) {
                const float *p = info->probs + (size_t)(h * G + g) * n;
                for (int i = 0; i < ni; i++)
                    mass += p[r->fast_idx[i]];
            }
            mass /= G;
            r->fm[l * r->KV + h] = (float)(mass > 1.0 ? 1.0 : mass);
        }
        r->have_fm[l] = 1;
    }
    return SFI_OK;
}

/* The prompt's accumulated attention of layer l, [H][col_cap], grown to
 * hold n positions. */
static sfi_status colsum_fit(sfi_recorder *r, int n, sfi_error *err)
{
    if (n <= r->col_cap)
        return SFI_OK;
    int cap = r->col_cap ? r->col_cap : 1024;
    while (cap < n)
        cap *= 2;
    float *c = calloc((size_t)r->L * r->H * cap, sizeof(float));
    if (!c)
        return sfi_error_set(err, SFI_ENOMEM,
                             "trace recorder: out of memory for %d prompt "
                             "positions",
                             n);
    for (size_t i = 0; r->colsum && i < (size_t)r->L * r->H; i++)
        memcpy(c + i * cap, r->colsum + i * r->col_cap, sizeof(float) * (size_t)r->col_cap);
    free(r->colsum);
    r->colsum = c;
    r->col_cap = cap;
    return SFI_OK;
}

/* A layer's cache [n][KV][D] as the trace's head-major [KV][n][D]. */
static sfi_status write_cache(sfi_recorder *r, int64_t step, int l, char kind, const float *src,
                              int n, sfi_error *err)
{
    size_t need = (size_t)r->KV * n * r->D;
    if (need > r->kvcap) {
        float *b = realloc(r->kvbuf, need * sizeof(float));
        if (!b)
            return sfi_error_set(err, SFI_ENOMEM, "trace recorder: out of memory");
        r->kvbuf = b;
        r->kvcap = need;
    }
    for (int h = 0; h < r->KV; h++)
        for (int j = 0; j < n; j++)
            memcpy(r->kvbuf + ((size_t)h * n + j) * r->D, src + ((size_t)j * r->KV + h) * r->D,
                   sizeof(float) * (size_t)r->D);
    return sfi_trace_add_snapshot(r->w, r->req, step, l, kind, r->KV * n, r->D, r->kvbuf, err);
}

static sfi_status on_qk(void *user, const sfi_decode_qk_info *info, sfi_error *err)
{
    sfi_recorder *r = user;
    int l = info->layer;
    if (l < 0 || l >= r->L)
        return sfi_error_set(err, SFI_EINVAL, "trace recorder: query of layer %d", l);
    if (info->final) {
        /* The last step is appended: its caches, every step's prefix. */
        sfi_status st = write_cache(r, info->step, l, 'k', info->k, info->n_ctx, err);
        if (!st && r->qk > 1)
            st = write_cache(r, info->step, l, 'v', info->v, info->n_ctx, err);
        if (!st && l == r->L - 1)
            st = sfi_trace_flush(r->w, err);
        return st;
    }
    size_t qd = (size_t)r->H * r->D;
    if (info->step <= 0) {
        /* A prompt query: its attention joins the accumulated attention,
         * and it enters the ring of the prompt's last queries. */
        if (info->position == 0)
            r->n_prompt = 0;
        sfi_status st = colsum_fit(r, info->n_ctx, err);
        if (st)
            return st;
        sfi_policy_shape sh = {r->L, r->H, r->KV, r->D};
        sfi_policy_colsum_add(&sh, info->q, info->k, info->n_ctx,
                              r->colsum + (size_t)l * r->H * r->col_cap, r->col_cap);
        memcpy(r->tail + ((size_t)l * SFI_RECORDER_QK_TAIL +
                          (size_t)(info->position % SFI_RECORDER_QK_TAIL)) *
                             qd,
               info->q, qd * sizeof(float));
        if (info->step == 0)
            r->n_prompt = info->n_ctx;
        return SFI_OK;
    }
    memcpy(r->qbuf + (size_t)l * qd, info->q, qd * sizeof(float));
    r->have_q[l] = 1;
    return SFI_OK;
}

/* Step 0's query snapshots (the prompt's last queries) and accumulated
 * attention, then the prompt's buffers are cleared for the next request. */
static sfi_status write_prompt_qk(sfi_recorder *r, sfi_error *err)
{
    int n = r->n_prompt, W = n < SFI_RECORDER_QK_TAIL ? n : SFI_RECORDER_QK_TAIL;
    size_t qd = (size_t)r->H * r->D;
    float *m = malloc(sizeof(float) * (size_t)W * qd);
    float *a = malloc(sizeof(float) * (size_t)r->H * (n > 0 ? n : 1));
    sfi_status st =
        m && a ? SFI_OK : sfi_error_set(err, SFI_ENOMEM, "trace recorder: out of memory");
    for (int l = 0; !st && l < r->L; l++) {
        for (int w = 0; w < W; w++) {
            int pos = n - W + w;
            memcpy(m + (size_t)w * qd,
                   r->tail +
                       ((size_t)l * SFI_RECORDER_QK_TAIL + (size_t)(pos % SFI_RECORDER_QK_TAIL)) *
                           qd,
                   qd * sizeof(float));
        }
        st = sfi_trace_add_snapshot(r->w, r->req, 0, l, 'q', W * r->H, r->D, m, err);
        for (int h = 0; !st && h < r->H; h++)
            memcpy(a + (size_t)h * n, r->colsum + ((size_t)l * r->H + h) * r->col_cap,
                   sizeof(float) * (size_t)n);
        if (!st)
            st = sfi_trace_add_snapshot(r->w, r->req, 0, l, 'a', r->H, n, a, err);
    }
    free(m);
    free(a);
    if (r->colsum)
        memset(r->colsum, 0, sizeof(float) * (size_t)r->L * r->H * r->col_cap);
    return st;
}

static sfi_status on_step(void *user, const sfi_decode_step_info *info, sfi_error *err)
{
    sfi_recorder *r = user;
    if (r->req < 0)
        return sfi_error_set(err, SFI_EINVAL, "trace recorder: a step before any prefill");
    sfi_status st = sfi_trace_append_step(r->w, r->req, info->step, info->n_ctx, info->token,
                                          info->kind, info->reason, err);
    for (int l = 0; !st && l < r->L; l++) {
        if (r->have_sel && r->have_sel[l]) {
            for (int h = 0; !st && h < r->KV; h++) {
                size_t i = (size_t)l * r->KV + h;
                st = sfi_trace_add_selection(r->w, r->req, info->step, l, h, r->sel + i * r->K,
                                             r->nsel[i], r->sel_mass[i], r->sel_lambda[i], err);
            }
            r->have_sel[l] = 0;
        }
        if (r->have_fm && r->have_fm[l]) {
            for (int h = 0; !st && h < r->KV; h++)
                st = sfi_trace_add_fast_mass(r->w, r->req, info->step, l, h, r->fm[l * r->KV + h],
                                             err);
            r->have_fm[l] = 0;
        }
        if (r->have_topm && r->have_topm[l]) {
            for (int h = 0; !st && h < r->H; h++) {
                size_t i = (size_t)l * r->H + h;
                st = sfi_trace_add_topm(r->w, r->req, info->step, l, h, r->tpos + i * r->M,
                                        r->tprob + i * r->M, r->tm[i], r->ttail[i], err);
            }
            r->have_topm[l] = 0;
        }
        if (r->qk && info->step > 0 && r->have_q[l]) {
            st = sfi_trace_add_snapshot(r->w, r->req, info->step, l, 'q', r->H, r->D,
                                        r->qbuf + (size_t)l * r->H * r->D, err);
            r->have_q[l] = 0;
        }
    }
    if (!st && r->qk && info->step == 0) {
        if (r->n_prompt != info->n_ctx)
            return sfi_error_set(err, SFI_EINVAL,
                                 "trace recorder: --trace-qk saw a prompt of %d "
                                 "positions, step 0 has %d (a shared prefix is not observed)",
                                 r->n_prompt, info->n_ctx);
        st = write_prompt_qk(r, err);
    }
    if (!st)
        st = sfi_trace_flush(r->w, err);
    return st;
}

void sfi_recorder_observer(sfi_recorder *r, sfi_decode_observer *obs)
{
    memset(obs, 0, sizeof *obs);
    if (!r)
        return;
    obs->user = r;
    /* Dense attention on fast steps costs a dense pass per layer: only the
     * levels that record it ask for it. */
    obs->want_attention = r->level >= SFI_TRACE_SUMMARY;
    obs->on_prefill = on_prefill;
    obs->on_step = on_step;
    obs->on_slow_layer = on_slow_layer;
    obs->on_attention = on_attention;
    obs->want_qk = r->qk;
    obs->on_qk = on_qk;
}

sfi_status sfi_recorder_finish(sfi_recorder *r, sfi_error *err)
{
    if (!r)
        return SFI_OK;
    sfi_status st = sfi_trace_finish(r->w, err);
    r->w = NULL;
    rec_free(r);
    return st;
}

void sfi_recorder_abort(sfi_recorder *r)
{
    if (!r)
        return;
    sfi_trace_writer_close(r->w);
    rec_free(r);
}
