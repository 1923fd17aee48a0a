/* sfi-gpu run: the whole SFI decode loop on the GPU (the engine of
 * sfi_gpu_engine.h), with the command-line shape of sfi-ref run, plus
 * batching, bf16/f32/bit-exact kernels, trace replay, random-weight
 * presets, an in-process check against the reference and a benchmark
 * mode. See man sfi-gpu. */
#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cuda_runtime_api.h>

#include "sfi_decode.h"
#include "sfi_digest.h"
#include "sfi_gpu.h"
#include "sfi_gpu_cli.h"
#include "sfi_gpu_engine.h"
#include "sfi_gpu_verify.h"
#include "sfi_io.h"
#include "sfi_params.h"
#include "sfi_qwen3.h"
#include "sfi_state.h"
#include "sfi_tokenizer.h"
#include "sfi_trace.h"
#include "sfi_vocab.h"

#define CMD "sfi-gpu run"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-gpu run (--model DIR | --synthetic PRESET [--layers N] [--seed S])\n"
            "                   (--prompt TEXT | --prompt-file F | --prompt-ids F |\n"
            "                    --replay TRACE.db [--replay-ctx N])\n"
            "                   --max-new N [--batch B] [--mode sfi|dense] [--dtype bf16|f32]\n"
            "                   [--exact] [--param KEY=VALUE ...] [--params FILE]\n"
            "                   [--trigger POLICY] [--interval N] [--tokenizer DIR]\n"
            "                   [--stop-at-eos] [--json] [--check] [--bench] [--no-digest]\n"
            "                   [--no-graph] [--no-overlap] [--page N] [--prefill-chunk N]\n\n"
            "Greedy decoding on the GPU: prefill, then every step slow (dense attention,\n"
            "Selector refresh) or fast (sink + selected + recent) per request, decided on\n"
            "the device (--mode sfi), or dense every step (--mode dense). Output as\n"
            "sfi-ref run's (same JSON fields), per request.\n\n"
            "  -m, --model DIR        Hugging Face Qwen3 / Qwen3-MoE checkpoint directory\n"
            "      --synthetic NAME   random weights of a built-in preset's shape (sfi-sim\n"
            "                         presets), made on the GPU; --layers N keeps N layers,\n"
            "                         --seed S picks the weights (1)\n"
            "  -p, --prompt TEXT      prompt text (needs the tokenizer files)\n"
            "      --prompt-file F    prompt text read from file F\n"
            "      --prompt-ids F     decimal token ids, one request per line ('-': stdin);\n"
            "                         requests cycle through the lines up to --batch\n"
            "      --replay T.db      teacher-forced decoding of a trace's requests: the\n"
            "                         first --replay-ctx tokens (default: the recorded\n"
            "                         prompt) are the prompt, the tokens that follow them\n"
            "                         are fed back instead of the argmax\n"
            "  -n, --max-new N        steps per request (>= 1; step 0 is the prefill's)\n"
            "  -b, --batch B          requests decoded together (1..%d; default: the\n"
            "                         number of prompts)\n"
            "      --mode MODE        sfi (default) or dense\n"
            "      --dtype T          bf16 (default: weights and KV cache in bf16) or f32\n"
            "      --exact            f32 kernels that compute sfi-ref's scalar bits\n"
            "                         (slow; the digest then equals sfi-ref run's)\n"
            "  -P, --param KEY=VALUE  an SFI parameter (see sfi-ref(1)); --params FILE\n"
            "      --trigger POLICY   sfi (default), tmax, boundary, interval, always, never\n"
            "      --interval N       step interval of the interval policy (16)\n"
            "      --tokenizer DIR    vocab.json + merges.txt for the trigger set and text\n"
            "                         (default: the model directory)\n"
            "      --stop-at-eos      a request stops after the config's eos_token_id\n"
            "      --json             one JSON object (the fields of sfi-ref run --json)\n"
            "      --check            run sfi-ref's decode loop on the CPU too and compare\n"
            "                         ids, step kinds, selected sets and logits; exit 1 on a\n"
            "                         mismatch (--check-backend scalar|blas)\n"
            "      --bench            time every step (no per-step readback) and print step\n"
            "                         times, tokens/s and HBM bytes per step\n"
            "      --no-digest        no per-step readback (the digest is then absent)\n"
            "      --no-graph         launch every step's kernels (no CUDA graph)\n"
            "      --no-overlap       Selector and reorg on the main stream\n"
            "      --page N           positions per KV page (64)\n"
            "      --prefill-chunk N  prompt tokens per prefill pass (2048)\n"
            "      --force-ids F      teacher forcing from a file: line i holds the inputs\n"
            "                         of request i's steps 1.. (e.g. another run's ids)\n"
            "      --pdl, --no-pdl    programmatic dependent launch in decode steps on or\n"
            "                         off (default: on in SFI mode, off in dense mode)\n"
            "      --gemm sfi|cublas  decode GEMMs (bf16, <= 64 rows): ours (default) or\n"
            "                         cuBLAS\n"
            "      --bench-no-selector  timing experiment: slow steps skip the Selector\n"
            "                         and reorg (what the Selector costs; wrong results)\n"
            "  -h, --help             print this help\n\n"
            "Exit status: 0 ok, 1 bad input, failure or check mismatch, 2 usage error,\n"
            "77 no CUDA device. See sfi-gpu(1).\n",
            SFI_GPU_MAX_BATCH);
}

static int parse_int(const char *s, const char *what, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, CMD ": %s '%s': expected an integer in %d..%d\n", what, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Prompt files: at most 256 MiB (a million-token prompt is ~8 MB). */
#define PROMPT_MAX ((size_t)256 << 20)

static char *read_file(const char *path, size_t *len, sfi_error *err)
{
    char *s = NULL;
    sfi_status rc = strcmp(path, "-")
                        ? sfi_io_read(path, PROMPT_MAX, "prompt", &s, len, err)
                        : sfi_io_read_stream(stdin, "standard input", PROMPT_MAX, "prompt", &s,
                                             len, err);
    return rc ? NULL : s;
}

typedef struct {
    int32_t *ids;
    int n;
    int32_t *force; /* replay */
    int n_force;
} prompt_t;

static void prompts_free(prompt_t *p, int n)
{
    for (int i = 0; i < n; i++) {
        free(p[i].ids);
        free(p[i].force);
    }
    free(p);
}

/* One request per non-empty line of decimal ids. */
static sfi_status parse_id_lines(const char *path, const char *s, size_t len, prompt_t **out,
                                 int *n_out, sfi_error *err)
{
    *out = NULL;
    *n_out = 0;
    int cap = 0, n = 0;
    prompt_t *v = NULL;
    size_t i = 0;
    int line = 1;
    while (i < len) {
        size_t e = i;
        while (e < len && s[e] != '\n')
            e++;
        int32_t *ids = NULL;
        int k = 0, kc = 0;
        size_t p = i;
        while (p < e) {
            while (p < e && (s[p] == ' ' || s[p] == '\t' || s[p] == '\r'))
                p++;
            if (p >= e)
                break;
            if (s[p] < '0' || s[p] > '9') {
                free(ids);
                prompts_free(v, n);
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s:%d: byte %zu: expected a non-negative decimal token id",
                                     path, line, p - i + 1);
            }
            long x = 0;
            while (p < e && s[p] >= '0' && s[p] <= '9') {
                x = x * 10 + (s[p] - '0');
                if (x > INT32_MAX) {
                    free(ids);
                    prompts_free(v, n);
                    return sfi_error_set(err, SFI_ERANGE, "%s:%d: token id too large", path, line);
                }
                p++;
            }
            if (p < e && s[p] != ' ' && s[p] != '\t' && s[p] != '\r') {
                free(ids);
                prompts_free(v, n);
                return sfi_error_set(err, SFI_EFORMAT, "%s:%d: byte %zu: unexpected byte 0x%02x "
                                     "after a token id", path, line, p - i + 1,
                                     (unsigned)(unsigned char)s[p]);
            }
            if (k == kc) {
                kc = kc ? 2 * kc : 256;
                int32_t *ni = realloc(ids, (size_t)kc * 4);
                if (!ni) {
                    free(ids);
                    prompts_free(v, n);
                    return sfi_error_set(err, SFI_ENOMEM, "out of memory");
                }
                ids = ni;
            }
            ids[k++] = (int32_t)x;
        }
        if (k > 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                prompt_t *nv = realloc(v, (size_t)cap * sizeof *v);
                if (!nv) {
                    free(ids);
                    prompts_free(v, n);
                    return sfi_error_set(err, SFI_ENOMEM, "out of memory");
                }
                v = nv;
            }
            memset(&v[n], 0, sizeof v[n]);
            v[n].ids = ids;
            v[n].n = k;
            n++;
        }
        i = e + 1;
        line++;
    }
    if (n == 0)
        return sfi_error_set(err, SFI_EFORMAT, "%s: no token ids", path);
    *out = v;
    *n_out = n;
    return SFI_OK;
}

/* The trace's requests as streams (prompt ++ recorded tokens): prompt =
 * the first ctx tokens (ctx 0: the recorded prompt), force = the next
 * n_force. A batch larger than the trace takes every request several
 * times; each further copy starts `stride` tokens later in its stream
 * (up to 512, as far as the stream allows), so that copies do not trigger
 * their slow steps at the same steps. batch 0: one slot per request. */
static sfi_status read_replay(const char *path, int ctx, int n_force, int32_t n_vocab, int batch,
                              prompt_t **out, int *n_out, sfi_error *err)
{
    sfi_trace *t = NULL;
    sfi_status rc = sfi_trace_open(path, &t, err);
    if (rc)
        return rc;
    const sfi_trace_meta *meta = sfi_trace_get_meta(t);
    if (meta->n_vocab > n_vocab) {
        sfi_trace_close(t);
        return sfi_error_set(err, SFI_EINVAL,
                             "%s: its tokens come from a vocabulary of %d ids, the model has %d "
                             "(a trace of another tokenizer?)", path, (int)meta->n_vocab, (int)n_vocab);
    }
    int64_t nr = sfi_trace_n_requests(t);
    if (nr < 1) {
        sfi_trace_close(t);
        return sfi_error_set(err, SFI_EFORMAT, "%s: no requests", path);
    }
    if (nr > SFI_GPU_MAX_BATCH)
        nr = SFI_GPU_MAX_BATCH;
    int B = batch > 0 ? batch : (int)nr;
    prompt_t *v = calloc((size_t)B, sizeof *v);
    if (!v) {
        sfi_trace_close(t);
        return sfi_error_set(err, SFI_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < nr && i < B && !rc; i++) {
        sfi_trace_request r;
        sfi_trace_steps s;
        if ((rc = sfi_trace_read_request(t, i, &r, err)))
            break;
        if ((rc = sfi_trace_read_steps(t, i, &s, err))) {
            sfi_trace_request_free(&r);
            break;
        }
        int64_t total = r.n_prompt + s.n;
        int p = ctx > 0 ? ctx : r.n_prompt;
        int copies = (int)((B - 1 - i) / nr) + 1;
        int64_t spare = total - p - n_force;
        if (spare < 0) {
            rc = sfi_error_set(err, SFI_ERANGE,
                               "%s: request %" PRId64 " has %" PRId64 " tokens; a %d-token "
                               "prompt and %d forced steps need %" PRId64,
                               path, i, total, p, n_force, (int64_t)p + n_force);
        }
        int64_t stride = copies > 1 ? spare / (copies - 1) : 0;
        if (stride > 512)
            stride = 512;
        for (int k = 0; k < copies && !rc; k++) {
            prompt_t *q = &v[i + (int64_t)k * nr];
            int64_t off = k * stride;
            q->n = p;
            q->n_force = n_force;
            q->ids = malloc((size_t)p * 4 + 4);
            q->force = malloc((size_t)n_force * 4 + 4);
            if (!q->ids || !q->force) {
                rc = sfi_error_set(err, SFI_ENOMEM, "out of memory");
                break;
            }
            for (int64_t x = 0; x < p + n_force; x++) {
                int64_t at = off + x;
                int32_t tok = at < r.n_prompt ? r.prompt[at] : s.token[at - r.n_prompt];
                if (x < p)
                    q->ids[x] = tok;
                else
                    q->force[x - p] = tok;
            }
        }
        sfi_trace_steps_free(&s);
        sfi_trace_request_free(&r);
    }
    sfi_trace_close(t);
    if (rc) {
        prompts_free(v, B);
        return rc;
    }
    *out = v;
    *n_out = B;
    return SFI_OK;
}

static int file_exists(const char *dir, const char *name)
{
    char p[PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* ---- bench: bytes and times ---- */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double pct(float *v, int n, double p)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

/* Device-to-device copy bandwidth (bytes read + written per second). */
static double copy_bandwidth(void)
{
    size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, n) != cudaSuccess)
        return 0;
    if (cudaMalloc(&b, n) != cudaSuccess) {
        cudaFree(a);
        return 0;
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 10; i++)
        cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return ms > 0 ? 2.0 * 10 * (double)n / (ms * 1e-3) : 0;
}

typedef struct {
    int n;              /* steps */
    double ms, bytes;   /* totals */
    float *t;           /* per step times */
} stepclass;

static void bench_report(const sfi_gpu_engine *eng, const sfi_gpu_engine_opts *eo,
                         const prompt_t *pr, int B, const sfi_gpu_run_result *res, double bw,
                         json_t *jb)
{
    const int max_new = res->max_new;
    const sfi_params *P = &eo->params;
    uint64_t wb = sfi_gpu_engine_weight_bytes(eng), rowb = sfi_gpu_engine_kv_row_bytes(eng);
    stepclass cls[3]; /* 0 dense-mode steps, 1 with a slow request, 2 all fast */
    memset(cls, 0, sizeof cls);
    for (int c = 0; c < 3; c++)
        cls[c].t = calloc((size_t)max_new, sizeof(float));
    int *kout = calloc((size_t)B, sizeof(int));
    for (int b = 0; b < B && eo->sfi; b++) { /* the prefill's selection */
        int jb, je;
        sfi_state_candidates(P, pr[b].n, &jb, &je);
        kout[b] = je > jb ? (P->K < je - jb ? P->K : je - jb) : 0;
    }
    double tot_ms = 0;
    long tok = 0;
    /* steps 1 and 2 are warm-up (eager step, then the graph's first replay) */
    for (int t = 3; t < max_new && t <= res->n_timed; t++) {
        int any_slow = 0;
        double bytes = (double)wb;
        for (int b = 0; b < B; b++) {
            int kind = res->kinds[(size_t)b * max_new + t];
            int ctx = pr[b].n + t;
            if (kind == SFI_STEP_SLOW) {
                any_slow = 1;
                bytes += (double)ctx * rowb;
                int jb = P->n_sink < ctx ? P->n_sink : ctx, je = ctx - P->n_recent;
                kout[b] = je > jb ? (P->K < je - jb ? P->K : je - jb) : 0;
            } else {
                int a = P->n_sink < ctx ? P->n_sink : ctx;
                long rows = ctx - P->n_recent > a ? (long)P->n_sink + kout[b] + P->n_recent : ctx;
                bytes += (double)rows * rowb;
            }
        }
        int c = !eo->sfi ? 0 : any_slow ? 1 : 2;
        cls[c].t[cls[c].n++] = res->step_ms[t];
        cls[c].ms += res->step_ms[t];
        cls[c].bytes += bytes;
        tot_ms += res->step_ms[t];
        tok += B;
    }
    static const char *names[3] = {"dense", "slow", "fast"};
    printf("bench: copy bandwidth %.1f GB/s; weights %.3f GB read per step; KV %.0f bytes per "
           "position (all layers)\n", bw / 1e9, wb / 1e9, (double)rowb);
    json_t *jc = json_object();
    for (int c = 0; c < 3; c++) {
        if (!cls[c].n)
            continue;
        double mean = cls[c].ms / cls[c].n;
        double gbps = cls[c].bytes / (cls[c].ms * 1e-3);
        float *tmp = malloc((size_t)cls[c].n * sizeof(float));
        memcpy(tmp, cls[c].t, (size_t)cls[c].n * sizeof(float));
        double p50 = pct(tmp, cls[c].n, 0.5), p99 = pct(tmp, cls[c].n, 0.99);
        free(tmp);
        printf("bench: %-5s steps %5d  mean %8.3f ms  p50 %8.3f  p99 %8.3f  bytes/step %.3f GB  "
               "%.1f GB/s = %.1f%% of copy\n",
               names[c], cls[c].n, mean, p50, p99, cls[c].bytes / cls[c].n / 1e9, gbps / 1e9,
               bw > 0 ? 100.0 * gbps / bw : 0.0);
        json_t *o = json_object();
        json_object_set_new(o, "steps", json_integer(cls[c].n));
        json_object_set_new(o, "mean_ms", json_real(mean));
        json_object_set_new(o, "p50_ms", json_real(p50));
        json_object_set_new(o, "p99_ms", json_real(p99));
        json_object_set_new(o, "bytes_per_step", json_real(cls[c].bytes / cls[c].n));
        json_object_set_new(o, "gb_per_s", json_real(gbps / 1e9));
        json_object_set_new(o, "fraction_of_copy", json_real(bw > 0 ? gbps / bw : 0));
        json_object_set_new(jc, names[c], o);
    }
    double tps = tot_ms > 0 ? tok / (tot_ms * 1e-3) : 0;
    long ptok = 0;
    for (int b = 0; b < B; b++)
        ptok += pr[b].n;
    printf("bench: decode %.1f tokens/s (%ld tokens in %.3f s of timed steps); prefill %ld "
           "tokens in %.3f s = %.0f tokens/s\n",
           tps, tok, tot_ms * 1e-3, ptok, res->prefill_s,
           res->prefill_s > 0 ? ptok / res->prefill_s : 0.0);
    if (jb) {
        json_object_set_new(jb, "classes", jc);
        json_object_set_new(jb, "copy_gb_per_s", json_real(bw / 1e9));
        json_object_set_new(jb, "weight_bytes", json_integer((json_int_t)wb));
        json_object_set_new(jb, "kv_bytes_per_position", json_integer((json_int_t)rowb));
        json_object_set_new(jb, "decode_tokens_per_s", json_real(tps));
        json_object_set_new(jb, "prefill_tokens", json_integer(ptok));
        json_object_set_new(jb, "prefill_s", json_real(res->prefill_s));
        json_object_set_new(jb, "prefill_tokens_per_s",
                            json_real(res->prefill_s > 0 ? ptok / res->prefill_s : 0));
        json_object_set_new(jb, "graph_build_s", json_real(res->graph_build_s));
    } else {
        json_decref(jc);
    }
    for (int c = 0; c < 3; c++)
        free(cls[c].t);
    free(kout);
}

/* ---- the command ---- */

int sfi_gpu_cmd_run(int argc, char **argv)
{
    enum { O_PROMPT_FILE = 256, O_PROMPT_IDS, O_MODE, O_PARAMS, O_TRIGGER, O_INTERVAL,
           O_TOKENIZER, O_STOP, O_JSON, O_SYN, O_LAYERS, O_SEED, O_REPLAY, O_REPLAY_CTX,
           O_DTYPE, O_EXACT, O_CHECK, O_CHECK_BACKEND, O_BENCH, O_NODIGEST, O_NOGRAPH,
           O_NOOVERLAP, O_PAGE, O_CHUNK, O_FORCE, O_NOSEL, O_NOPDL, O_GEMM, O_PDL };
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},
        {"synthetic", required_argument, NULL, O_SYN},
        {"layers", required_argument, NULL, O_LAYERS},
        {"seed", required_argument, NULL, O_SEED},
        {"prompt", required_argument, NULL, 'p'},
        {"prompt-file", required_argument, NULL, O_PROMPT_FILE},
        {"prompt-ids", required_argument, NULL, O_PROMPT_IDS},
        {"replay", required_argument, NULL, O_REPLAY},
        {"replay-ctx", required_argument, NULL, O_REPLAY_CTX},
        {"max-new", required_argument, NULL, 'n'},
        {"batch", required_argument, NULL, 'b'},
        {"mode", required_argument, NULL, O_MODE},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"exact", no_argument, NULL, O_EXACT},
        {"param", required_argument, NULL, 'P'},
        {"params", required_argument, NULL, O_PARAMS},
        {"trigger", required_argument, NULL, O_TRIGGER},
        {"interval", required_argument, NULL, O_INTERVAL},
        {"tokenizer", required_argument, NULL, O_TOKENIZER},
        {"stop-at-eos", no_argument, NULL, O_STOP},
        {"json", no_argument, NULL, O_JSON},
        {"check", no_argument, NULL, O_CHECK},
        {"check-backend", required_argument, NULL, O_CHECK_BACKEND},
        {"bench", no_argument, NULL, O_BENCH},
        {"no-digest", no_argument, NULL, O_NODIGEST},
        {"no-graph", no_argument, NULL, O_NOGRAPH},
        {"no-overlap", no_argument, NULL, O_NOOVERLAP},
        {"page", required_argument, NULL, O_PAGE},
        {"prefill-chunk", required_argument, NULL, O_CHUNK},
        {"force-ids", required_argument, NULL, O_FORCE},
        {"bench-no-selector", no_argument, NULL, O_NOSEL},
        {"no-pdl", no_argument, NULL, O_NOPDL},
        {"pdl", no_argument, NULL, O_PDL},
        {"gemm", required_argument, NULL, O_GEMM},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *synthetic = NULL, *prompt = NULL, *prompt_file = NULL;
    const char *prompt_ids = NULL, *replay = NULL, *tok_dir = NULL, *force_ids = NULL;
    int layers = 0, seed = 1, replay_ctx = 0, max_new = -1, batch = 0, json = 0, stop = 0;
    int check = 0, bench = 0, no_digest = 0;
    sfi_backend check_backend = SFI_BACKEND_SCALAR;
    sfi_gpu_engine_opts eo;
    sfi_gpu_engine_opts_default(&eo);
    sfi_decode_mode mode = SFI_DECODE_SFI;
    sfi_trigger_kind trig = SFI_TRIG_SFI;
    sfi_error e;
    sfi_error_clear(&e);
    int c, li = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:b:P:h", opts, &li)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case O_SYN: synthetic = optarg; break;
        case O_LAYERS: if (parse_int(optarg, "--layers", 1, SFI_MODEL_MAX_LAYERS, &layers)) return 2; break;
        case O_SEED: if (parse_int(optarg, "--seed", 0, INT_MAX, &seed)) return 2; break;
        case 'p': prompt = optarg; break;
        case O_PROMPT_FILE: prompt_file = optarg; break;
        case O_PROMPT_IDS: prompt_ids = optarg; break;
        case O_REPLAY: replay = optarg; break;
        case O_REPLAY_CTX: if (parse_int(optarg, "--replay-ctx", 1, INT_MAX / 2, &replay_ctx)) return 2; break;
        case 'n': if (parse_int(optarg, "--max-new", 1, INT_MAX / 2, &max_new)) return 2; break;
        case 'b': if (parse_int(optarg, "--batch", 1, SFI_GPU_MAX_BATCH, &batch)) return 2; break;
        case O_MODE:
            if (sfi_decode_mode_parse(optarg, &mode, &e)) {
                fprintf(stderr, CMD ": --%s\n", e.msg);
                return 2;
            }
            break;
        case O_DTYPE:
            if (!strcmp(optarg, "bf16")) eo.dtype = SFI_GPU_BF16;
            else if (!strcmp(optarg, "f32")) eo.dtype = SFI_GPU_F32;
            else {
                fprintf(stderr, CMD ": --dtype '%s': expected bf16 or f32\n", optarg);
                return 2;
            }
            break;
        case O_EXACT: eo.exact = 1; break;
        case 'P':
            if (sfi_params_set(&eo.params, optarg, "--param", &e)) {
                fprintf(stderr, CMD ": %s\n", e.msg);
                return 2;
            }
            break;
        case O_PARAMS:
            if (sfi_params_load_file(&eo.params, optarg, &e)) {
                fprintf(stderr, CMD ": %s\n", e.msg);
                return 1;
            }
            break;
        case O_TRIGGER:
            if (sfi_trigger_policy_parse(optarg, &trig, &e)) {
                fprintf(stderr, CMD ": --trigger: %s\n", e.msg);
                return 2;
            }
            break;
        case O_INTERVAL: if (parse_int(optarg, "--interval", 1, INT_MAX, &eo.interval)) return 2; break;
        case O_TOKENIZER: tok_dir = optarg; break;
        case O_STOP: stop = 1; break;
        case O_JSON: json = 1; break;
        case O_CHECK: check = 1; break;
        case O_CHECK_BACKEND:
            if (sfi_backend_parse(optarg, &check_backend, &e)) {
                fprintf(stderr, CMD ": --check-%s\n", e.msg);
                return 2;
            }
            break;
        case O_BENCH: bench = 1; break;
        case O_NODIGEST: no_digest = 1; break;
        case O_NOGRAPH: eo.graphs = 0; break;
        case O_NOOVERLAP: eo.overlap = 0; break;
        case O_PAGE: if (parse_int(optarg, "--page", 1, 4096, &eo.page)) return 2; break;
        case O_CHUNK: if (parse_int(optarg, "--prefill-chunk", 1, 1 << 20, &eo.prefill_chunk)) return 2; break;
        case O_FORCE: force_ids = optarg; break;
        case O_NOSEL: eo.skip_select = 1; break;
        case O_NOPDL: eo.pdl = 0; break;
        case O_PDL: eo.pdl = 1; break;
        case O_GEMM:
            if (!strcmp(optarg, "cublas")) eo.gemm_cublas = 1;
            else if (!strcmp(optarg, "sfi")) eo.gemm_cublas = 0;
            else {
                fprintf(stderr, CMD ": --gemm '%s': expected sfi or cublas\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default:
            if (optopt && optopt < 256)
                fprintf(stderr, CMD ": option -%c: %s\n", optopt,
                        strchr("mpnbP", optopt) ? "needs a value" : "unknown");
            else
                fprintf(stderr, CMD ": %s: unknown option or missing value\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, CMD ": unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!!model + !!synthetic != 1 || max_new < 0 ||
        (!!prompt + !!prompt_file + !!prompt_ids + !!replay) != 1) {
        fprintf(stderr, CMD ": need exactly one of --model and --synthetic, --max-new, and "
                        "exactly one of --prompt, --prompt-file, --prompt-ids, --replay\n");
        usage(stderr);
        return 2;
    }
    if (layers && !synthetic) {
        fprintf(stderr, CMD ": --layers cuts a --synthetic preset (use sfi-ref make-checkpoint "
                        "for a checkpoint)\n");
        return 2;
    }
    if (force_ids && replay) {
        fprintf(stderr, CMD ": --force-ids and --replay both force the inputs: give one\n");
        return 2;
    }
    if (eo.skip_select && !bench) {
        fprintf(stderr, CMD ": --bench-no-selector is a timing experiment: it needs --bench\n");
        return 2;
    }
    if (replay_ctx && !replay) {
        fprintf(stderr, CMD ": --replay-ctx needs --replay\n");
        return 2;
    }
    if (check && (synthetic || replay || force_ids)) {
        fprintf(stderr, CMD ": --check compares with sfi-ref on a checkpoint (--model) and "
                        "greedy decoding (no --replay)\n");
        return 2;
    }
    if (check && bench) {
        fprintf(stderr, CMD ": --check and --bench exclude each other\n");
        return 2;
    }
    if (sfi_params_validate(&eo.params, &e)) {
        fprintf(stderr, CMD ": %s\n", e.msg);
        return 2;
    }
    eo.sfi = mode == SFI_DECODE_SFI;
    eo.trigger = trig;
    eo.max_new = max_new;
    int digest = !bench && !no_digest;

    char msg[256];
    int rc = 1;
    sfi_qwen3 *m = NULL;
    sfi_model_config cfg;
    sfi_tokenizer *tk = NULL;
    sfi_trigger_set ts;
    int have_ts = 0;
    prompt_t *pr = NULL;
    int n_pr = 0;
    sfi_gpu_engine *eng = NULL;
    sfi_gpu_run_result res;
    memset(&res, 0, sizeof res);
    sfi_gpu_verify *ver = NULL;
    sfi_gpu_verify_report *rep = NULL;
    const int32_t **pp = NULL;
    int *pn = NULL;
    sfi_gpu_request *req = NULL;
    json_t *jout = NULL;
    int B = 0;

    if (model) {
        if (sfi_qwen3_load(model, &m, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            goto out;
        }
        cfg = *sfi_qwen3_config(m);
    } else {
        if (sfi_model_preset(synthetic, &cfg, &e)) {
            fprintf(stderr, CMD ": --synthetic: %s\n", e.msg);
            goto out;
        }
        if (layers) {
            if (layers > cfg.num_hidden_layers) {
                fprintf(stderr, CMD ": --layers %d: %s has %d\n", layers, synthetic,
                        cfg.num_hidden_layers);
                goto out;
            }
            cfg.num_hidden_layers = layers;
        }
    }
    if (!tok_dir && model)
        tok_dir = model;
    if (tok_dir && file_exists(tok_dir, "vocab.json") && file_exists(tok_dir, "merges.txt")) {
        if (sfi_tokenizer_load(tok_dir, &tk, &e) ||
            sfi_trigger_set_build(sfi_tokenizer_vocab(tk), eo.params.trigger_chars, &ts, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            goto out;
        }
        have_ts = 1;
        eo.is_trigger = ts.is_trigger;
        eo.n_trigger_vocab = ts.n_vocab;
    } else if (prompt || prompt_file) {
        fprintf(stderr, CMD ": %s: no vocab.json + merges.txt to encode the prompt text (give "
                        "--tokenizer DIR or --prompt-ids)\n", tok_dir ? tok_dir : "(none)");
        goto out;
    } else if (tok_dir && !file_exists(tok_dir, "vocab.json") && !model) {
        fprintf(stderr, CMD ": --tokenizer %s: no vocab.json + merges.txt there\n", tok_dir);
        goto out;
    } else if (eo.sfi && !json) {
        fprintf(stderr, CMD ": note: no tokenizer: the trigger set is empty, slow steps come "
                        "from T_max only\n");
    }
    /* prompts */
    if (prompt_ids) {
        size_t len;
        char *s = read_file(prompt_ids, &len, &e);
        if (!s || parse_id_lines(prompt_ids, s, len, &pr, &n_pr, &e)) {
            free(s);
            fprintf(stderr, CMD ": %s\n", e.msg);
            goto out;
        }
        free(s);
    } else if (replay) {
        if (read_replay(replay, replay_ctx, max_new - 1, cfg.vocab_size, batch, &pr, &n_pr, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            goto out;
        }
    } else {
        size_t len = 0;
        char *s = prompt ? strdup(prompt) : read_file(prompt_file, &len, &e);
        if (!s) {
            fprintf(stderr, CMD ": %s\n", prompt ? "out of memory" : e.msg);
            goto out;
        }
        if (prompt)
            len = strlen(s);
        int32_t *ids = NULL;
        size_t n = 0;
        sfi_status st = sfi_tokenizer_encode(tk, s, len, &ids, &n, &e);
        free(s);
        if (st || n == 0 || n > INT_MAX / 2) {
            fprintf(stderr, CMD ": %s: %s\n", prompt ? "--prompt" : prompt_file,
                    st ? e.msg : "the prompt encodes to no tokens");
            free(ids);
            goto out;
        }
        pr = calloc(1, sizeof *pr);
        if (!pr) {
            free(ids);
            goto out;
        }
        pr[0].ids = ids;
        pr[0].n = (int)n;
        n_pr = 1;
    }
    if (force_ids) { /* line i forces request i's inputs of steps 1.. */
        size_t len;
        prompt_t *fr = NULL;
        int nf = 0;
        char *s = read_file(force_ids, &len, &e);
        if (!s || parse_id_lines(force_ids, s, len, &fr, &nf, &e)) {
            free(s);
            fprintf(stderr, CMD ": %s\n", e.msg);
            goto out;
        }
        free(s);
        int bad = nf < n_pr;
        for (int i = 0; i < n_pr && !bad; i++) {
            if (fr[i].n < max_new - 1) {
                bad = 1;
                break;
            }
            pr[i].force = fr[i].ids;
            pr[i].n_force = fr[i].n;
            fr[i].ids = NULL;
        }
        prompts_free(fr, nf);
        if (bad) {
            fprintf(stderr, CMD ": %s: needs a line of at least %d ids for each of the %d "
                            "prompts\n", force_ids, max_new - 1, n_pr);
            goto out;
        }
    }
    B = batch ? batch : (n_pr < SFI_GPU_MAX_BATCH ? n_pr : SFI_GPU_MAX_BATCH);
    if (n_pr < B) { /* cycle through the prompts */
        prompt_t *np = realloc(pr, (size_t)B * sizeof *pr);
        if (!np)
            goto out;
        pr = np;
        for (int b = n_pr; b < B; b++) {
            const prompt_t *s = &pr[b % n_pr];
            pr[b].n = s->n;
            pr[b].n_force = s->n_force;
            pr[b].ids = malloc((size_t)s->n * 4);
            pr[b].force = s->force ? malloc((size_t)s->n_force * 4 + 4) : NULL;
            if (!pr[b].ids || (s->force && !pr[b].force)) {
                n_pr = b + 1;
                goto out;
            }
            memcpy(pr[b].ids, s->ids, (size_t)s->n * 4);
            if (s->force)
                memcpy(pr[b].force, s->force, (size_t)s->n_force * 4);
        }
        n_pr = B;
    }
    int max_prompt = 0;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < pr[b].n; i++)
            if (pr[b].ids[i] < 0 || pr[b].ids[i] >= cfg.vocab_size) {
                fprintf(stderr, CMD ": request %d: token %d (id %d) outside the model's "
                                "vocabulary [0, %d)\n", b, i, (int)pr[b].ids[i], cfg.vocab_size);
                goto out;
            }
        max_prompt = pr[b].n > max_prompt ? pr[b].n : max_prompt;
    }
    if ((long)max_prompt + max_new - 1 > cfg.max_position_embeddings) {
        fprintf(stderr, CMD ": a prompt of %d tokens + %d steps exceeds the model's "
                        "max_position_embeddings %d\n", max_prompt, max_new,
                cfg.max_position_embeddings);
        goto out;
    }
    eo.max_batch = B;
    eo.max_ctx = max_prompt + max_new - 1 > 2 ? max_prompt + max_new - 1 : 2;
    eo.stop_token = stop ? cfg.eos_token_id : -1;
    /* inputs are checked; now the device */
    if (!sfi_gpu_device_ok(msg, sizeof msg)) {
        fprintf(stderr, CMD ": skipped: %s\n", msg);
        rc = SFI_GPU_EXIT_NODEV;
        goto out;
    }
    double bw = bench ? copy_bandwidth() : 0;
    {
        sfi_gpu_engine_mem mp;
        if (sfi_gpu_engine_mem_plan(&cfg, &eo, &mp, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            goto out;
        }
        if (!json)
            fprintf(stderr,
                    CMD ": memory: %.3f GiB (weights %.3f, KV %.3f, compact + key norms %.3f, "
                        "Selector + logits %.3f, activations %.3f, other %.3f)\n",
                    mp.total / 1073741824.0, mp.weights / 1073741824.0, mp.kv / 1073741824.0,
                    (mp.compact + mp.key_norms) / 1073741824.0,
                    (mp.selector + mp.logits) / 1073741824.0, mp.activations / 1073741824.0,
                    (mp.prefill + mp.other) / 1073741824.0);
    }
    if (sfi_gpu_engine_create(&cfg, m, (uint64_t)seed, &eo, &eng, &e)) {
        fprintf(stderr, CMD ": %s: %s\n", model ? model : synthetic, e.msg);
        goto out;
    }
    req = calloc((size_t)B, sizeof *req);
    pp = calloc((size_t)B, sizeof *pp);
    pn = calloc((size_t)B, sizeof *pn);
    rep = calloc((size_t)B, sizeof *rep);
    if (!req || !pp || !pn || !rep)
        goto out;
    for (int b = 0; b < B; b++) {
        req[b].prompt = pp[b] = pr[b].ids;
        req[b].n_prompt = pn[b] = pr[b].n;
        req[b].force = pr[b].force;
        req[b].n_force = pr[b].n_force;
    }
    if (digest && sfi_gpu_verify_new(B, max_new, cfg.vocab_size, pp, pn, mode, check, &ver, &e)) {
        fprintf(stderr, CMD ": %s\n", e.msg);
        goto out;
    }
    if (sfi_gpu_engine_run(eng, req, B, ver ? sfi_gpu_verify_observer(ver) : NULL, bench, &res,
                           &e)) {
        fprintf(stderr, CMD ": %s\n", e.msg);
        goto out;
    }
    /* --check: the reference on the CPU, one thread per request */
    int check_fail = 0;
    if (check) {
        sfi_decode_opts ro;
        sfi_decode_opts_default(&ro);
        ro.mode = mode;
        ro.params = eo.params;
        ro.trigger = trig;
        ro.interval = eo.interval;
        ro.is_trigger = eo.is_trigger;
        ro.n_trigger_vocab = eo.n_trigger_vocab;
        ro.max_new = max_new;
        ro.stop_token = eo.stop_token;
        ro.backend = check_backend;
        check_fail = sfi_gpu_verify_reference(ver, m, &ro, &res, eo.exact, 1e-4, stderr, rep) > 0;
    }
    /* output */
    size_t text_len = 0;
    jout = json ? json_object() : NULL;
    json_t *jreqs = json ? json_array() : NULL;
    const char *backend = eo.exact ? "gpu-exact" : eo.dtype == SFI_GPU_BF16 ? "gpu-bf16" : "gpu-f32";
    for (int b = 0; b < B; b++) {
        int ng = res.n_generated[b];
        const int32_t *ids = res.ids + (size_t)b * max_new;
        char hex[65] = "";
        if (digest && sfi_gpu_verify_digest(ver, b, hex, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            goto out;
        }
        char *text = NULL;
        if (tk && sfi_tokenizer_decode(tk, ids, (size_t)ng, &text, &text_len, &e))
            text = NULL;
        int n_slow = 0;
        for (int t = 0; t < ng; t++)
            n_slow += res.kinds[(size_t)b * max_new + t] == SFI_STEP_SLOW;
        if (json) {
            json_t *j = json_object(), *g = json_array(), *steps = json_array();
            json_object_set_new(j, "model", json_string(model ? model : synthetic));
            json_object_set_new(j, "mode", json_string(sfi_decode_mode_name(mode)));
            json_object_set_new(j, "backend", json_string(backend));
            json_object_set_new(j, "trigger", json_string(sfi_trigger_kind_name(trig)));
            json_object_set_new(j, "prompt_tokens", json_integer(pr[b].n));
            for (int t = 0; t < ng; t++) {
                json_array_append_new(g, json_integer(ids[t]));
                json_t *s = json_object();
                json_object_set_new(s, "kind", json_string(sfi_step_kind_name(
                                                   (sfi_step_kind)res.kinds[(size_t)b * max_new + t])));
                json_object_set_new(s, "reason", json_string(sfi_step_reason_name(
                                                     (sfi_step_reason)res.reasons[(size_t)b * max_new + t])));
                json_array_append_new(steps, s);
            }
            json_object_set_new(j, "generated_ids", g);
            size_t cl = 0;
            char *clean = text ? sfi_utf8_clean(text, text_len, &cl) : NULL;
            if (clean)
                json_object_set_new(j, "text", json_stringn(clean, cl));
            free(clean);
            json_object_set_new(j, "steps", steps);
            json_object_set_new(j, "n_slow", json_integer(n_slow));
            json_object_set_new(j, "slow_fraction", json_real((double)n_slow / ng));
            json_object_set_new(j, "digest", digest ? json_string(hex) : json_null());
            json_object_set_new(j, "prefill_seconds", json_real(res.prefill_s));
            json_object_set_new(j, "decode_seconds", json_real(res.decode_s));
            if (check) {
                const sfi_gpu_verify_report *r = &rep[b];
                json_t *ck = json_object();
                json_object_set_new(ck, "ref_digest", r->ran ? json_string(r->ref_digest) : json_null());
                json_object_set_new(ck, "first_diff_step", json_integer(r->first_diff));
                json_object_set_new(ck, "max_rel_logit_err", json_real(r->max_rel));
                json_object_set_new(ck, "selected_sets", json_integer(r->sel_sets));
                json_object_set_new(ck, "selected_sets_equal", json_integer(r->sel_sets_equal));
                json_object_set_new(j, "check", ck);
            }
            json_array_append_new(jreqs, j);
        } else {
            if (B > 1)
                printf("request %d:\n", b);
            if (text) {
                printf("text: ");
                fwrite(text, 1, text_len, stdout);
                printf("\n");
            }
            printf("ids:");
            for (int t = 0; t < ng; t++)
                printf(" %d", (int)ids[t]);
            printf("\nsteps:\n");
            for (int t = 0; t < ng; t++)
                printf("  %d %s %s %d\n", t,
                       sfi_step_kind_name((sfi_step_kind)res.kinds[(size_t)b * max_new + t]),
                       sfi_step_reason_name((sfi_step_reason)res.reasons[(size_t)b * max_new + t]),
                       (int)ids[t]);
            printf("slow_fraction: %.6f (%d of %d steps)\n", (double)n_slow / ng, n_slow, ng);
            printf("prompt_tokens: %d\nmode: %s\nbackend: %s\n", pr[b].n,
                   sfi_decode_mode_name(mode), backend);
            if (digest)
                printf("digest: %s\n", hex);
        }
        free(text);
    }
    if (json) {
        json_object_set_new(jout, "batch", json_integer(B));
        json_object_set_new(jout, "dtype", json_string(eo.dtype == SFI_GPU_BF16 ? "bf16" : "f32"));
        json_object_set_new(jout, "exact", json_boolean(eo.exact));
        json_object_set_new(jout, "max_new", json_integer(max_new));
        json_object_set_new(jout, "graph_build_seconds", json_real(res.graph_build_s));
        char *pj = sfi_params_to_json(&eo.params);
        json_t *pv = pj ? json_loads(pj, 0, NULL) : NULL;
        free(pj);
        if (pv)
            json_object_set_new(jout, "params", pv);
        if (B == 1) { /* sfi-ref run's shape at the top level */
            json_t *r0 = json_array_get(jreqs, 0);
            const char *k;
            json_t *v;
            json_object_foreach(r0, k, v) json_object_set(jout, k, v);
        }
        json_object_set_new(jout, "requests", jreqs);
    }
    if (bench) {
        json_t *jb = json ? json_object() : NULL;
        bench_report(eng, &eo, pr, B, &res, bw, jb);
        if (jb)
            json_object_set_new(jout, "bench", jb);
    }
    if (json) {
        char *s = json_dumps(jout, JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
        if (!s) {
            fprintf(stderr, CMD ": cannot encode the JSON output (out of memory?)\n");
            goto out;
        }
        printf("%s\n", s);
        free(s);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, CMD ": writing standard output failed\n");
        goto out;
    }
    rc = check_fail ? 1 : 0;
    if (check)
        fprintf(stderr, CMD ": check %s\n", check_fail ? "FAILED" : "passed");
out:
    if (jout)
        json_decref(jout);
    sfi_gpu_verify_free(ver);
    free(rep);
    free(pp);
    free(pn);
    free(req);
    sfi_gpu_run_result_free(&res);
    sfi_gpu_engine_free(eng);
    if (pr)
        prompts_free(pr, n_pr);
    if (have_ts)
        sfi_trigger_set_free(&ts);
    sfi_tokenizer_free(tk);
    sfi_qwen3_free(m);
    return rc;
}
