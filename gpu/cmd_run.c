/* sfi-gpu run: the whole SFI decode loop on the GPU (the engine of
 * sfi_gpu_engine.h), with the command-line shape of sfi-ref run, plus
 * batching, bf16/f32/bit-exact kernels, trace replay, random-weight
 * presets, an in-process check against the reference and a benchmark
 * mode. See man sfi-gpu. */
#include <config.h>

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

#include "sfi_cli.h"
#include "sfi_decode.h"
#include "sfi_digest.h"
#include "sfi_gpu.h"
#include "sfi_gpu_cli.h"
#include "sfi_gpu_engine.h"
#include "sfi_gpu_nccl.h"
#include "sfi_gpu_tprun.h"
#include "sfi_gpu_verify.h"
#include "sfi_io.h"
#include "sfi_params.h"
#include "sfi_parse.h"
#include "sfi_qwen3.h"
#include "sfi_sort.h"
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
            "                   [--no-graph] [--no-overlap] [--page N] [--prefill-chunk N]\n"
            "                   [--tp N [--check-tp]]\n\n"
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
            "      --tp N             tensor parallelism over GPUs 0..N-1 through NCCL, one\n"
            "                         thread per GPU (N must divide the KV heads; 1 default)\n"
            "      --check-tp         with --tp N and --model: decode again on one GPU and\n"
            "                         compare ids, step kinds (equal) and logits (1e-4\n"
            "                         relative); exit 1 on a mismatch\n"
            "  -h, --help             print this help\n\n"
            "Exit status: 0 ok, 1 bad input, failure or check mismatch, 2 usage error,\n"
            "77 no CUDA device. See sfi-gpu(1).\n",
            SFI_GPU_MAX_BATCH);
}

static int parse_int(const char *s, const char *what, int lo, int hi, int *out)
{
    if (sfi_parse_int(s, lo, hi, out) == 0)
        return 0;
    fprintf(stderr, CMD ": %s '%s': expected an integer in %d..%d\n", what, s, lo, hi);
    return -1;
}

/* Prompt files: at most 256 MiB (a million-token prompt is ~8 MB). */
#define PROMPT_MAX ((size_t)256 << 20)

static char *read_file(const char *path, size_t *len, sfi_error *err)
{
    char *s = NULL;
    sfi_status rc = strcmp(path, "-") ? sfi_io_read(path, PROMPT_MAX, "prompt", &s, len, err)
                                      : sfi_io_read_stream(stdin, "standard input", PROMPT_MAX,
                                                           "prompt", &s, len, err);
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
                return sfi_error_set(err, SFI_EFORMAT,
                                     "%s:%d: byte %zu: unexpected byte 0x%02x "
                                     "after a token id",
                                     path, line, p - i + 1, (unsigned)(unsigned char)s[p]);
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
                             "(a trace of another tokenizer?)",
                             path, (int)meta->n_vocab, (int)n_vocab);
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

static double pct(float *v, int n, double p)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, sfi_cmp_f32);
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
    int n;            /* steps */
    double ms, bytes; /* totals */
    float *t;         /* per step times */
} stepclass;

static void bench_report(const sfi_gpu_engine *eng, const sfi_gpu_engine_opts *eo,
                         const prompt_t *pr, int B, const sfi_gpu_run_result *res, double bw,
                         json_t *jb)
{
    const int max_new = res->max_new;
    const sfi_params *P = &eo->params;
    const double wb = sfi_gpu_engine_step_weight_bytes(eng, B);
    const uint64_t rowb = sfi_gpu_engine_kv_row_bytes(eng);
    /* 0 dense-mode steps, 1 with a slow request, 2 all fast, 3 all fast
     * while the second stream runs the deferred Selector of requests slow
     * at the step before (refresh_delay) */
    enum { N_CLS = 4 };
    stepclass cls[N_CLS];
    memset(cls, 0, sizeof cls);
    for (int c = 0; c < N_CLS; c++)
        cls[c].t = calloc((size_t)max_new, sizeof(float));
    const int delay = eo->sfi && P->refresh_delay >= 2 ? P->refresh_delay : 0;
    int *kout = calloc((size_t)B, sizeof(int));
    int *pend = calloc((size_t)B, sizeof(int)), *kpend = calloc((size_t)B, sizeof(int));
    for (int b = 0; b < B && eo->sfi; b++) { /* the prefill's selection */
        int jb, je;
        sfi_state_candidates(P, pr[b].n, &jb, &je);
        kout[b] = je > jb ? (P->K < je - jb ? P->K : je - jb) : 0;
    }
    double tot_ms = 0;
    long tok = 0;
    /* steps 1 and 2 are warm-up (eager step, then the graph's first replay),
     * not timed; with refresh_delay followed for the pending sets (without,
     * the bytes stay those of the committed profiles) */
    for (int t = delay ? 1 : 3; t < max_new && t <= res->n_timed; t++) {
        int any_slow = 0, any_sel = 0;
        double bytes = (double)wb;
        for (int b = 0; b < B; b++) {
            int kind = res->kinds[(size_t)b * max_new + t];
            int ctx = pr[b].n + t;
            if (delay && pend[b] > 0 && t == pend[b] + delay) { /* the engine's plan */
                kout[b] = kpend[b];
                pend[b] = 0;
            }
            if (kind == SFI_STEP_SLOW) {
                any_slow = 1;
                bytes += (double)ctx * rowb;
                int jb = P->n_sink < ctx ? P->n_sink : ctx, je = ctx - P->n_recent;
                int kk = je > jb ? (P->K < je - jb ? P->K : je - jb) : 0;
                if (delay) {
                    pend[b] = t;
                    kpend[b] = kk;
                } else {
                    kout[b] = kk;
                }
            } else {
                any_sel = any_sel || (delay && t > 1 && pend[b] == t - 1);
                int a = P->n_sink < ctx ? P->n_sink : ctx;
                long rows = ctx - P->n_recent > a ? (long)P->n_sink + kout[b] + P->n_recent : ctx;
                bytes += (double)rows * rowb;
            }
        }
        if (t < 3)
            continue;
        int c = !eo->sfi ? 0 : any_slow ? 1 : any_sel ? 3 : 2;
        cls[c].t[cls[c].n++] = res->step_ms[t];
        cls[c].ms += res->step_ms[t];
        cls[c].bytes += bytes;
        tot_ms += res->step_ms[t];
        tok += B;
    }
    static const char *names[N_CLS] = {"dense", "slow", "fast", "fast+sel"};
    static const char *keys[N_CLS] = {"dense", "slow", "fast", "fast_sel"};
    printf("bench: copy bandwidth %.1f GB/s; weights %.3f GB read per step; KV %.0f bytes per "
           "position (all layers)\n",
           bw / 1e9, wb / 1e9, (double)rowb);
    uint64_t ar_bytes = 0, ga_bytes = 0;
    int tp_rank = 0, tp_n = 1, nkv_l = 0;
    sfi_gpu_engine_comm_bytes(eng, B, &ar_bytes, &ga_bytes);
    sfi_gpu_engine_tp(eng, &tp_rank, &tp_n, &nkv_l);
    if (tp_n > 1)
        printf("bench: tensor parallel over %d GPUs (bytes and GB/s per GPU: rank 0's weights and "
               "%d KV heads); per step each GPU sends %.3f MB into all-reduces (2 per layer) and "
               "%.3f MB into all-gathers (%sargmax)\n",
               tp_n, nkv_l, ar_bytes / 1e6, ga_bytes / 1e6,
               eo->sfi && !eo->skip_select ? "Selector scores of every layer, " : "");
    json_t *jc = json_object();
    for (int c = 0; c < N_CLS; c++) {
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
        json_object_set_new(jc, keys[c], o);
    }
    double tps = tot_ms > 0 ? tok / (tot_ms * 1e-3) : 0;
    long ptok = 0;
    for (int b = 0; b < B; b++)
        ptok += pr[b].n;
    printf("bench: decode %.1f tokens/s (%ld tokens in %.3f s of timed steps); prefill %ld "
           "tokens in %.3f s = %.0f tokens/s\n",
           tps, tok, tot_ms * 1e-3, ptok, res->prefill_s,
           res->prefill_s > 0 ? ptok / res->prefill_s : 0.0);
    if (res->cond_graph > 0)
        printf("bench: step graph with a conditional node: steps without a slow request ran "
               "without the Selector chain, with the fast-rows attention grid\n");
    else if (res->cond_graph < 0)
        printf("bench: step graph without its conditional node (%s)\n", res->cond_why);
    if (res->n_no_chain > 0)
        printf("bench: %d of %d steps without the Selector chain (no request slow)\n",
               res->n_no_chain, res->n_timed);
    if (jb) {
        json_object_set_new(jb, "classes", jc);
        json_object_set_new(jb, "copy_gb_per_s", json_real(bw / 1e9));
        json_object_set_new(jb, "weight_bytes", json_integer((json_int_t)wb));
        json_object_set_new(jb, "weight_bytes_all",
                            json_integer((json_int_t)sfi_gpu_engine_weight_bytes(eng)));
        json_object_set_new(jb, "kv_bytes_per_position", json_integer((json_int_t)rowb));
        json_object_set_new(jb, "decode_tokens_per_s", json_real(tps));
        json_object_set_new(jb, "prefill_tokens", json_integer(ptok));
        json_object_set_new(jb, "prefill_s", json_real(res->prefill_s));
        json_object_set_new(jb, "prefill_tokens_per_s",
                            json_real(res->prefill_s > 0 ? ptok / res->prefill_s : 0));
        json_object_set_new(jb, "graph_build_s", json_real(res->graph_build_s));
        json_object_set_new(jb, "steps_without_selector", json_integer(res->n_no_chain));
        json_object_set_new(jb, "cond_graph", json_boolean(res->cond_graph > 0));
        json_object_set_new(jb, "tp", json_integer(tp_n));
        json_object_set_new(jb, "allreduce_bytes_per_step", json_integer((json_int_t)ar_bytes));
        json_object_set_new(jb, "gather_bytes_per_step", json_integer((json_int_t)ga_bytes));
        int fr, sr;
        sfi_gpu_engine_attn_split_rows(eng, &fr, &sr);
        if (fr > 0) {
            json_t *js = json_object();
            json_object_set_new(js, "fast", json_integer(fr));
            json_object_set_new(js, "slow", json_integer(sr));
            json_object_set_new(jb, "attn_split_rows", js);
        }
    } else {
        json_decref(jc);
    }
    for (int c = 0; c < N_CLS; c++)
        free(cls[c].t);
    free(kout);
    free(pend);
    free(kpend);
}

/* ---- the command ---- */

enum {
    O_PROMPT_FILE = 256,
    O_PROMPT_IDS,
    O_MODE,
    O_PARAMS,
    O_TRIGGER,
    O_INTERVAL,
    O_TOKENIZER,
    O_STOP,
    O_JSON,
    O_SYN,
    O_LAYERS,
    O_SEED,
    O_REPLAY,
    O_REPLAY_CTX,
    O_DTYPE,
    O_EXACT,
    O_CHECK,
    O_CHECK_BACKEND,
    O_BENCH,
    O_NODIGEST,
    O_NOGRAPH,
    O_NOOVERLAP,
    O_PAGE,
    O_CHUNK,
    O_FORCE,
    O_NOSEL,
    O_NOPDL,
    O_GEMM,
    O_PDL,
    O_TP,
    O_CHECK_TP
};

/* The command line. */
typedef struct {
    const char *model, *synthetic, *prompt, *prompt_file, *prompt_ids, *replay, *tok_dir,
        *force_ids;
    int layers, seed, replay_ctx, max_new, batch, json, stop, check, bench, no_digest;
    int tp, check_tp; /* --tp N (1: one GPU, no NCCL), --check-tp */
    int digest;       /* a per-step readback for the digest: neither --bench nor --no-digest */
    sfi_backend check_backend;
    sfi_gpu_engine_opts eo;
    sfi_decode_mode mode;
    sfi_trigger_kind trig;
} run_args;

/* The options that set a flag or a string. Returns 1 when c is one. */
static int parse_simple(int c, run_args *a)
{
    switch (c) {
    case 'm': a->model = optarg; return 1;
    case O_SYN: a->synthetic = optarg; return 1;
    case 'p': a->prompt = optarg; return 1;
    case O_PROMPT_FILE: a->prompt_file = optarg; return 1;
    case O_PROMPT_IDS: a->prompt_ids = optarg; return 1;
    case O_REPLAY: a->replay = optarg; return 1;
    case O_EXACT: a->eo.exact = 1; return 1;
    case O_TOKENIZER: a->tok_dir = optarg; return 1;
    case O_STOP: a->stop = 1; return 1;
    case O_JSON: a->json = 1; return 1;
    case O_CHECK: a->check = 1; return 1;
    case O_BENCH: a->bench = 1; return 1;
    case O_NODIGEST: a->no_digest = 1; return 1;
    case O_NOGRAPH: a->eo.graphs = 0; return 1;
    case O_NOOVERLAP: a->eo.overlap = 0; return 1;
    case O_FORCE: a->force_ids = optarg; return 1;
    case O_NOSEL: a->eo.skip_select = 1; return 1;
    case O_NOPDL: a->eo.pdl = 0; return 1;
    case O_PDL: a->eo.pdl = 1; return 1;
    case O_CHECK_TP: a->check_tp = 1; return 1;
    }
    return 0;
}

/* The options with a numeric value. Returns 0 when c is not one or its
 * value is good, 2 (message printed) when it is not. */
static int parse_number(int c, run_args *a)
{
    switch (c) {
    case O_LAYERS:
        return parse_int(optarg, "--layers", 1, SFI_MODEL_MAX_LAYERS, &a->layers) ? 2 : 0;
    case O_SEED: return parse_int(optarg, "--seed", 0, INT_MAX, &a->seed) ? 2 : 0;
    case O_REPLAY_CTX:
        return parse_int(optarg, "--replay-ctx", 1, INT_MAX / 2, &a->replay_ctx) ? 2 : 0;
    case 'n': return parse_int(optarg, "--max-new", 1, INT_MAX / 2, &a->max_new) ? 2 : 0;
    case 'b': return parse_int(optarg, "--batch", 1, SFI_GPU_MAX_BATCH, &a->batch) ? 2 : 0;
    case O_INTERVAL: return parse_int(optarg, "--interval", 1, INT_MAX, &a->eo.interval) ? 2 : 0;
    case O_PAGE: return parse_int(optarg, "--page", 1, 4096, &a->eo.page) ? 2 : 0;
    case O_TP: return parse_int(optarg, "--tp", 1, 64, &a->tp) ? 2 : 0;
    case O_CHUNK:
        return parse_int(optarg, "--prefill-chunk", 1, 1 << 20, &a->eo.prefill_chunk) ? 2 : 0;
    }
    return 0;
}

/* The options whose value names a choice. Returns 0 or the exit status. */
static int parse_choice(int c, run_args *a, sfi_error *e)
{
    switch (c) {
    case O_MODE:
        if (sfi_decode_mode_parse(optarg, &a->mode, e))
            return fprintf(stderr, CMD ": --%s\n", e->msg), 2;
        return 0;
    case O_DTYPE:
        if (!strcmp(optarg, "bf16"))
            a->eo.dtype = SFI_GPU_BF16;
        else if (!strcmp(optarg, "f32"))
            a->eo.dtype = SFI_GPU_F32;
        else
            return fprintf(stderr, CMD ": --dtype '%s': expected bf16 or f32\n", optarg), 2;
        return 0;
    case 'P':
        if (sfi_params_set(&a->eo.params, optarg, "--param", e))
            return fprintf(stderr, CMD ": %s\n", e->msg), 2;
        return 0;
    case O_PARAMS:
        if (sfi_params_load_file(&a->eo.params, optarg, e))
            return fprintf(stderr, CMD ": %s\n", e->msg), 1;
        return 0;
    case O_TRIGGER:
        if (sfi_trigger_policy_parse(optarg, &a->trig, e))
            return fprintf(stderr, CMD ": --trigger: %s\n", e->msg), 2;
        return 0;
    case O_CHECK_BACKEND:
        if (sfi_backend_parse(optarg, &a->check_backend, e))
            return fprintf(stderr, CMD ": --check-%s\n", e->msg), 2;
        return 0;
    case O_GEMM:
        if (!strcmp(optarg, "cublas"))
            a->eo.gemm_cublas = 1;
        else if (!strcmp(optarg, "sfi"))
            a->eo.gemm_cublas = 0;
        else
            return fprintf(stderr, CMD ": --gemm '%s': expected sfi or cublas\n", optarg), 2;
        return 0;
    }
    return 0;
}

/* Options that exclude or need each other. Returns 0 or 2. */
static int check_combinations(const run_args *a)
{
    const char *why = NULL;
    if (!!a->model + !!a->synthetic != 1 || a->max_new < 0 ||
        (!!a->prompt + !!a->prompt_file + !!a->prompt_ids + !!a->replay) != 1) {
        fprintf(stderr, CMD ": need exactly one of --model and --synthetic, --max-new, and "
                            "exactly one of --prompt, --prompt-file, --prompt-ids, --replay\n");
        usage(stderr);
        return 2;
    }
    if (a->layers && !a->synthetic)
        why = "--layers cuts a --synthetic preset (use sfi-ref make-checkpoint for a checkpoint)";
    else if (a->force_ids && a->replay)
        why = "--force-ids and --replay both force the inputs: give one";
    else if (a->eo.skip_select && !a->bench)
        why = "--bench-no-selector is a timing experiment: it needs --bench";
    else if (a->replay_ctx && !a->replay)
        why = "--replay-ctx needs --replay";
    else if (a->check && (a->synthetic || a->replay || a->force_ids))
        why = "--check compares with sfi-ref on a checkpoint (--model) and greedy decoding (no "
              "--replay)";
    else if (a->check && a->bench)
        why = "--check and --bench exclude each other";
    else if (a->check_tp && (a->tp < 2 || !a->model || a->replay || a->force_ids || a->bench))
        why = "--check-tp compares --tp N (N >= 2) with one GPU on a checkpoint (--model), greedy "
              "decoding, without --bench";
    if (why) {
        fprintf(stderr, CMD ": %s\n", why);
        return 2;
    }
    return 0;
}

/* Parses and checks the command line. Returns -1 to go on, else the exit
 * status (0 for --help). */
static int parse_args(int argc, char **argv, run_args *a)
{
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
        {"tp", required_argument, NULL, O_TP},
        {"check-tp", no_argument, NULL, O_CHECK_TP},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    a->seed = 1;
    a->max_new = -1;
    a->tp = 1;
    a->check_backend = SFI_BACKEND_SCALAR;
    sfi_gpu_engine_opts_default(&a->eo);
    a->mode = SFI_DECODE_SFI;
    a->trig = SFI_TRIG_SFI;
    sfi_error e;
    sfi_error_clear(&e);
    int c, li = 0, rc;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:p:n:b:P:h", opts, &li)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == '?' || c == ':')
            return sfi_cli_bad_option(CMD, argv, "mpnbP", usage);
        if (!parse_simple(c, a) && ((rc = parse_number(c, a)) || (rc = parse_choice(c, a, &e))))
            return rc;
    }
    if (optind < argc) {
        fprintf(stderr, CMD ": unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if ((rc = check_combinations(a)))
        return rc;
    if (sfi_params_validate(&a->eo.params, &e)) {
        fprintf(stderr, CMD ": %s\n", e.msg);
        return 2;
    }
    a->eo.sfi = a->mode == SFI_DECODE_SFI;
    a->eo.trigger = a->trig;
    a->eo.max_new = a->max_new;
    a->eo.tp_size = a->tp; /* rank and communicator: per GPU (sfi_gpu_tprun.h) */
    a->digest = !a->bench && !a->no_digest;
    return -1;
}

/* What the run holds, freed by run_free. */
typedef struct {
    sfi_qwen3 *m; /* NULL for --synthetic */
    sfi_model_config cfg;
    sfi_tokenizer *tk; /* NULL: no tokenizer files */
    sfi_trigger_set ts;
    int have_ts;
    prompt_t *pr; /* B of them once the batch is filled */
    int n_pr, B;
    sfi_gpu_engine *eng; /* --tp N: rank 0's, owned by tpg */
    sfi_gpu_tp_group *tpg;
    sfi_gpu_run_result res;
    sfi_gpu_verify *ver; /* with the digest */
    sfi_gpu_verify_report *rep;
    const int32_t **pp;
    int *pn;
    sfi_gpu_request *req;
    json_t *jout;
} run_state;

static void run_free(run_state *r)
{
    if (r->jout)
        json_decref(r->jout);
    sfi_gpu_verify_free(r->ver);
    free(r->rep);
    free(r->pp);
    free(r->pn);
    free(r->req);
    sfi_gpu_run_result_free(&r->res);
    if (r->tpg)
        sfi_gpu_tp_free(r->tpg);
    else
        sfi_gpu_engine_free(r->eng);
    if (r->pr)
        prompts_free(r->pr, r->n_pr);
    if (r->have_ts)
        sfi_trigger_set_free(&r->ts);
    sfi_tokenizer_free(r->tk);
    sfi_qwen3_free(r->m);
}

/* The checkpoint, or a preset's shape (cut to --layers) for random
 * weights. Returns 0 or 1. */
static int load_model(const run_args *a, run_state *r)
{
    sfi_error e;
    if (a->model) {
        if (sfi_qwen3_load(a->model, &r->m, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            return 1;
        }
        r->cfg = *sfi_qwen3_config(r->m);
        return 0;
    }
    if (sfi_model_preset(a->synthetic, &r->cfg, &e)) {
        fprintf(stderr, CMD ": --synthetic: %s\n", e.msg);
        return 1;
    }
    if (a->layers) {
        if (a->layers > r->cfg.num_hidden_layers) {
            fprintf(stderr, CMD ": --layers %d: %s has %d\n", a->layers, a->synthetic,
                    r->cfg.num_hidden_layers);
            return 1;
        }
        r->cfg.num_hidden_layers = a->layers;
    }
    return 0;
}

/* The tokenizer and the trigger set when the tokenizer files are there
 * (they must be for prompt text, and where --tokenizer names them).
 * Returns 0 or 1. */
static int load_tokenizer(run_args *a, run_state *r)
{
    sfi_error e;
    const char *tok_dir = a->tok_dir ? a->tok_dir : a->model;
    if (tok_dir && file_exists(tok_dir, "vocab.json") && file_exists(tok_dir, "merges.txt")) {
        if (sfi_tokenizer_load(tok_dir, &r->tk, &e) ||
            sfi_trigger_set_build(sfi_tokenizer_vocab(r->tk), a->eo.params.trigger_chars, &r->ts,
                                  &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            return 1;
        }
        r->have_ts = 1;
        a->eo.is_trigger = r->ts.is_trigger;
        a->eo.n_trigger_vocab = r->ts.n_vocab;
    } else if (a->prompt || a->prompt_file) {
        fprintf(stderr,
                CMD ": %s: no vocab.json + merges.txt to encode the prompt text (give "
                    "--tokenizer DIR or --prompt-ids)\n",
                tok_dir ? tok_dir : "(none)");
        return 1;
    } else if (tok_dir && !file_exists(tok_dir, "vocab.json") && !a->model) {
        fprintf(stderr, CMD ": --tokenizer %s: no vocab.json + merges.txt there\n", tok_dir);
        return 1;
    } else if (a->eo.sfi) {
        /* said in --json mode too (on stderr): a run without the set is a
         * different experiment, easy to make by mistake with --synthetic */
        fprintf(stderr, CMD ": note: no tokenizer: the trigger set is empty, slow steps come "
                            "from T_max only\n");
    }
    return 0;
}

/* --prompt or --prompt-file encoded: one request. Returns 0 or 1. */
static int encode_prompt(const run_args *a, run_state *r)
{
    sfi_error e;
    size_t len = 0;
    char *s = a->prompt ? strdup(a->prompt) : read_file(a->prompt_file, &len, &e);
    if (!s) {
        fprintf(stderr, CMD ": %s\n", a->prompt ? "out of memory" : e.msg);
        return 1;
    }
    if (a->prompt)
        len = strlen(s);
    int32_t *ids = NULL;
    size_t n = 0;
    sfi_status st = sfi_tokenizer_encode(r->tk, s, len, &ids, &n, &e);
    free(s);
    if (st || n == 0 || n > INT_MAX / 2) {
        fprintf(stderr, CMD ": %s: %s\n", a->prompt ? "--prompt" : a->prompt_file,
                st ? e.msg : "the prompt encodes to no tokens");
        free(ids);
        return 1;
    }
    r->pr = calloc(1, sizeof *r->pr);
    if (!r->pr) {
        free(ids);
        return 1;
    }
    r->pr[0].ids = ids;
    r->pr[0].n = (int)n;
    r->n_pr = 1;
    return 0;
}

/* The prompts: --prompt-ids lines, a trace's requests (--replay), or the
 * prompt text. Returns 0 or 1. */
static int read_prompts(const run_args *a, run_state *r)
{
    sfi_error e;
    if (a->prompt_ids) {
        size_t len;
        char *s = read_file(a->prompt_ids, &len, &e);
        if (!s || parse_id_lines(a->prompt_ids, s, len, &r->pr, &r->n_pr, &e)) {
            free(s);
            fprintf(stderr, CMD ": %s\n", e.msg);
            return 1;
        }
        free(s);
        return 0;
    }
    if (a->replay) {
        if (read_replay(a->replay, a->replay_ctx, a->max_new - 1, r->cfg.vocab_size, a->batch,
                        &r->pr, &r->n_pr, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            return 1;
        }
        return 0;
    }
    return encode_prompt(a, r);
}

/* --force-ids: line i forces request i's inputs of steps 1... Returns 0
 * or 1. */
static int read_force_ids(const run_args *a, run_state *r)
{
    sfi_error e;
    size_t len;
    prompt_t *fr = NULL;
    int nf = 0;
    char *s = read_file(a->force_ids, &len, &e);
    if (!s || parse_id_lines(a->force_ids, s, len, &fr, &nf, &e)) {
        free(s);
        fprintf(stderr, CMD ": %s\n", e.msg);
        return 1;
    }
    free(s);
    int bad = nf < r->n_pr;
    for (int i = 0; i < r->n_pr && !bad; i++) {
        if (fr[i].n < a->max_new - 1) {
            bad = 1;
            break;
        }
        r->pr[i].force = fr[i].ids;
        r->pr[i].n_force = fr[i].n;
        fr[i].ids = NULL;
    }
    prompts_free(fr, nf);
    if (bad) {
        fprintf(stderr,
                CMD ": %s: needs a line of at least %d ids for each of the %d "
                    "prompts\n",
                a->force_ids, a->max_new - 1, r->n_pr);
        return 1;
    }
    return 0;
}

/* The batch: --batch requests (default: one per prompt, at most
 * SFI_GPU_MAX_BATCH), cycling through the prompts. Returns 0 or 1. */
static int fill_batch(const run_args *a, run_state *r)
{
    const int B = r->B =
        a->batch ? a->batch : (r->n_pr < SFI_GPU_MAX_BATCH ? r->n_pr : SFI_GPU_MAX_BATCH);
    if (r->n_pr >= B)
        return 0;
    prompt_t *np = realloc(r->pr, (size_t)B * sizeof *r->pr);
    if (!np)
        return 1;
    r->pr = np;
    for (int b = r->n_pr; b < B; b++) {
        prompt_t *pr = r->pr;
        const prompt_t *s = &pr[b % r->n_pr];
        pr[b].n = s->n;
        pr[b].n_force = s->n_force;
        pr[b].ids = malloc((size_t)s->n * 4);
        pr[b].force = s->force ? malloc((size_t)s->n_force * 4 + 4) : NULL;
        if (!pr[b].ids || (s->force && !pr[b].force)) {
            r->n_pr = b + 1;
            return 1;
        }
        memcpy(pr[b].ids, s->ids, (size_t)s->n * 4);
        if (s->force)
            memcpy(pr[b].force, s->force, (size_t)s->n_force * 4);
    }
    r->n_pr = B;
    return 0;
}

/* Every prompt's ids inside the vocabulary and every request inside the
 * model's positions; sizes the engine for them. Returns 0 or 1. */
static int check_prompts(run_args *a, run_state *r)
{
    const sfi_model_config *cfg = &r->cfg;
    int max_prompt = 0;
    for (int b = 0; b < r->B; b++) {
        const prompt_t *p = &r->pr[b];
        for (int i = 0; i < p->n; i++)
            if (p->ids[i] < 0 || p->ids[i] >= cfg->vocab_size) {
                fprintf(stderr,
                        CMD ": request %d: token %d (id %d) outside the model's "
                            "vocabulary [0, %d)\n",
                        b, i, (int)p->ids[i], cfg->vocab_size);
                return 1;
            }
        max_prompt = p->n > max_prompt ? p->n : max_prompt;
    }
    if ((long)max_prompt + a->max_new - 1 > cfg->max_position_embeddings) {
        fprintf(stderr,
                CMD ": a prompt of %d tokens + %d steps exceeds the model's "
                    "max_position_embeddings %d\n",
                max_prompt, a->max_new, cfg->max_position_embeddings);
        return 1;
    }
    a->eo.max_batch = r->B;
    a->eo.max_ctx = max_prompt + a->max_new - 1 > 2 ? max_prompt + a->max_new - 1 : 2;
    a->eo.stop_token = a->stop ? cfg->eos_token_id : -1;
    /* every id of the config's eos list stops, as in sfi-ref run */
    a->eo.n_stop_more = 0;
    for (int i = 0; a->stop && i < cfg->n_eos && a->eo.n_stop_more < 16; i++)
        a->eo.stop_more[a->eo.n_stop_more++] = cfg->eos_token_ids[i];
    return 0;
}

/* The engine's memory plan, said on stderr (not with --json). Returns 0
 * or 1. */
static int plan_memory(const run_args *a, const run_state *r)
{
    sfi_error e;
    sfi_gpu_engine_mem mp;
    if (sfi_gpu_engine_mem_plan(&r->cfg, &a->eo, &mp, &e)) {
        fprintf(stderr, CMD ": %s\n", e.msg);
        return 1;
    }
    if (!a->json)
        fprintf(stderr,
                CMD ": memory%s: %.3f GiB (weights %.3f, KV %.3f, compact + key norms %.3f, "
                    "Selector + logits %.3f, activations %.3f, other %.3f)\n",
                a->tp > 1 ? " per GPU (rank 0's share)" : "", mp.total / 1073741824.0,
                mp.weights / 1073741824.0, mp.kv / 1073741824.0,
                (mp.compact + mp.key_norms) / 1073741824.0,
                (mp.selector + mp.logits) / 1073741824.0, mp.activations / 1073741824.0,
                (mp.prefill + mp.other) / 1073741824.0);
    return 0;
}

/* Creates the engine and decodes the batch (with the digest's readback
 * unless --bench or --no-digest). Returns 0 or 1. */
static int run_engine(const run_args *a, run_state *r)
{
    sfi_error e;
    const int B = r->B;
    if (a->tp == 1 &&
        sfi_gpu_engine_create(&r->cfg, r->m, (uint64_t)a->seed, &a->eo, &r->eng, &e)) {
        fprintf(stderr, CMD ": %s: %s\n", a->model ? a->model : a->synthetic, e.msg);
        return 1;
    }
    r->req = calloc((size_t)B, sizeof *r->req);
    r->pp = calloc((size_t)B, sizeof *r->pp);
    r->pn = calloc((size_t)B, sizeof *r->pn);
    r->rep = calloc((size_t)B, sizeof *r->rep);
    if (!r->req || !r->pp || !r->pn || !r->rep)
        return 1;
    for (int b = 0; b < B; b++) {
        r->req[b].prompt = r->pp[b] = r->pr[b].ids;
        r->req[b].n_prompt = r->pn[b] = r->pr[b].n;
        r->req[b].force = r->pr[b].force;
        r->req[b].n_force = r->pr[b].n_force;
    }
    if (a->digest && sfi_gpu_verify_new(B, a->max_new, r->cfg.vocab_size, r->pp, r->pn, a->mode,
                                        a->check || a->check_tp, &r->ver, &e)) {
        fprintf(stderr, CMD ": %s\n", e.msg);
        return 1;
    }
    if (a->tp > 1) {
        sfi_gpu_tp_job job = {.n = a->tp,
                              .cfg = &r->cfg,
                              .m = r->m,
                              .seed = (uint64_t)a->seed,
                              .eo = &a->eo,
                              .rq = r->req,
                              .B = B,
                              .obs = r->ver ? sfi_gpu_verify_observer(r->ver) : NULL,
                              .time_steps = a->bench};
        if (sfi_gpu_tp_run(&job, &r->tpg, &r->res, &e)) {
            fprintf(stderr, CMD ": %s: %s\n", a->model ? a->model : a->synthetic, e.msg);
            return 1;
        }
        r->eng = sfi_gpu_tp_engine(r->tpg, 0);
        return 0;
    }
    if (sfi_gpu_engine_run(r->eng, r->req, B, r->ver ? sfi_gpu_verify_observer(r->ver) : NULL,
                           a->bench, &r->res, &e)) {
        fprintf(stderr, CMD ": %s\n", e.msg);
        return 1;
    }
    return 0;
}

/* --check: the reference on the CPU, one thread per request. Returns 1
 * when it differs. */
static int run_reference(const run_args *a, run_state *r)
{
    sfi_decode_opts ro;
    sfi_decode_opts_default(&ro);
    ro.mode = a->mode;
    ro.params = a->eo.params;
    ro.trigger = a->trig;
    ro.interval = a->eo.interval;
    ro.is_trigger = a->eo.is_trigger;
    ro.n_trigger_vocab = a->eo.n_trigger_vocab;
    ro.max_new = a->max_new;
    ro.stop_token = a->eo.stop_token;
    ro.stop_tokens = a->stop ? r->cfg.eos_token_ids : NULL;
    ro.n_stop_tokens = a->stop ? r->cfg.n_eos : 0;
    ro.backend = a->check_backend;
    /* --tp N sums in another order: the bits are not the reference's */
    return sfi_gpu_verify_reference(r->ver, r->m, &ro, &r->res, a->eo.exact && a->tp == 1, 1e-4,
                                    stderr, r->rep) > 0;
}

/* --check-tp: the same requests decoded again on GPU 0 alone (the --tp
 * engines are freed first: GPU 0 held rank 0's share), compared with the
 * tensor-parallel run. Returns 1 when they differ. */
static int run_check_tp(const run_args *a, run_state *r)
{
    sfi_error e;
    sfi_gpu_tp_free(r->tpg);
    r->tpg = NULL;
    r->eng = NULL;
    if (cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, CMD ": --check-tp: cannot select GPU 0\n");
        return 1;
    }
    sfi_gpu_engine_opts o = a->eo;
    o.tp_size = 1;
    o.tp_rank = 0;
    o.tp_comm = NULL;
    sfi_gpu_engine *eng = NULL;
    sfi_gpu_verify *v1 = NULL;
    sfi_gpu_run_result res1;
    memset(&res1, 0, sizeof res1);
    int fail = 1;
    sfi_gpu_verify_report *rep = calloc((size_t)r->B, sizeof *rep);
    if (!rep || !r->ver) {
        fprintf(stderr, CMD ": --check-tp: %s\n",
                rep ? "no readback (--no-digest?)" : "out of memory");
    } else if (sfi_gpu_engine_create(&r->cfg, r->m, (uint64_t)a->seed, &o, &eng, &e) ||
               sfi_gpu_verify_new(r->B, a->max_new, r->cfg.vocab_size, r->pp, r->pn, a->mode, 1,
                                  &v1, &e) ||
               sfi_gpu_engine_run(eng, r->req, r->B, sfi_gpu_verify_observer(v1), 0, &res1, &e)) {
        fprintf(stderr, CMD ": --check-tp: the run on one GPU: %s\n", e.msg);
    } else {
        char nb[32];
        snprintf(nb, sizeof nb, "tp %d", a->tp);
        fail =
            sfi_gpu_verify_compare(v1, &res1, r->ver, &r->res, 1e-4, "tp 1", nb, stderr, rep) > 0;
        fprintf(stderr, CMD ": check-tp (--tp %d against one GPU) %s\n", a->tp,
                fail ? "FAILED" : "passed");
    }
    sfi_gpu_run_result_free(&res1);
    sfi_gpu_verify_free(v1);
    sfi_gpu_engine_free(eng);
    free(rep);
    return fail;
}

/* --tp N: N GPUs and NCCL, said before anything is loaded onto a device.
 * Returns 0 to go on, or SFI_GPU_EXIT_NODEV (skipped: message printed). */
static int tp_available(const run_args *a)
{
    if (a->tp < 2)
        return 0;
    sfi_error e;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < a->tp) {
        fprintf(stderr, CMD ": skipped: --tp %d needs %d GPUs; this machine has %d\n", a->tp, a->tp,
                n);
        return SFI_GPU_EXIT_NODEV;
    }
    if (sfi_gpu_nccl_load(&e)) {
        fprintf(stderr, CMD ": skipped: --tp %d: %s\n", a->tp, e.msg);
        return SFI_GPU_EXIT_NODEV;
    }
    if (!a->json) {
        char v[32];
        sfi_gpu_nccl_version(v, sizeof v);
        fprintf(stderr, CMD ": tensor parallelism over GPUs 0..%d, NCCL %s\n", a->tp - 1, v);
    }
    return 0;
}

/* One request's report as the JSON object of sfi-ref run --json (plus
 * the --check comparison). */
static json_t *request_json(const run_args *a, const run_state *r, int b, const char *backend,
                            const char *text, size_t text_len, const char *hex, int n_slow)
{
    const sfi_gpu_run_result *res = &r->res;
    const int max_new = a->max_new, ng = res->n_generated[b];
    const int32_t *ids = res->ids + (size_t)b * max_new;
    json_t *j = json_object(), *g = json_array(), *steps = json_array();
    json_object_set_new(j, "model", json_string(a->model ? a->model : a->synthetic));
    json_object_set_new(j, "mode", json_string(sfi_decode_mode_name(a->mode)));
    json_object_set_new(j, "backend", json_string(backend));
    json_object_set_new(j, "trigger", json_string(sfi_trigger_kind_name(a->trig)));
    json_object_set_new(j, "prompt_tokens", json_integer(r->pr[b].n));
    for (int t = 0; t < ng; t++) {
        json_array_append_new(g, json_integer(ids[t]));
        json_t *s = json_object();
        json_object_set_new(
            s, "kind",
            json_string(sfi_step_kind_name((sfi_step_kind)res->kinds[(size_t)b * max_new + t])));
        json_object_set_new(s, "reason",
                            json_string(sfi_step_reason_name(
                                (sfi_step_reason)res->reasons[(size_t)b * max_new + t])));
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
    json_object_set_new(j, "digest", a->digest ? json_string(hex) : json_null());
    json_object_set_new(j, "prefill_seconds", json_real(res->prefill_s));
    json_object_set_new(j, "decode_seconds", json_real(res->decode_s));
    if (a->check) {
        const sfi_gpu_verify_report *rp = &r->rep[b];
        json_t *ck = json_object();
        json_object_set_new(ck, "ref_digest", rp->ran ? json_string(rp->ref_digest) : json_null());
        json_object_set_new(ck, "first_diff_step", json_integer(rp->first_diff));
        json_object_set_new(ck, "max_rel_logit_err", json_real(rp->max_rel));
        json_object_set_new(ck, "selected_sets", json_integer(rp->sel_sets));
        json_object_set_new(ck, "selected_sets_equal", json_integer(rp->sel_sets_equal));
        json_object_set_new(j, "check", ck);
    }
    return j;
}

/* One request's report as sfi-ref run's text. */
static void request_text(const run_args *a, const run_state *r, int b, const char *backend,
                         const char *text, size_t text_len, const char *hex, int n_slow)
{
    const sfi_gpu_run_result *res = &r->res;
    const int max_new = a->max_new, ng = res->n_generated[b];
    const int32_t *ids = res->ids + (size_t)b * max_new;
    if (r->B > 1)
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
               sfi_step_kind_name((sfi_step_kind)res->kinds[(size_t)b * max_new + t]),
               sfi_step_reason_name((sfi_step_reason)res->reasons[(size_t)b * max_new + t]),
               (int)ids[t]);
    printf("slow_fraction: %.6f (%d of %d steps)\n", (double)n_slow / ng, n_slow, ng);
    printf("prompt_tokens: %d\nmode: %s\nbackend: %s\n", r->pr[b].n, sfi_decode_mode_name(a->mode),
           backend);
    if (a->digest)
        printf("digest: %s\n", hex);
}

/* Every request's report: text on standard output, or appended to jreqs.
 * Returns 0 or 1. */
static int report_requests(const run_args *a, const run_state *r, json_t *jreqs)
{
    sfi_error e;
    const sfi_gpu_engine_opts *eo = &a->eo;
    const char *backend = eo->exact                   ? "gpu-exact"
                          : eo->dtype == SFI_GPU_BF16 ? "gpu-bf16"
                                                      : "gpu-f32";
    for (int b = 0; b < r->B; b++) {
        const int ng = r->res.n_generated[b];
        const int32_t *ids = r->res.ids + (size_t)b * a->max_new;
        char hex[65] = "";
        if (a->digest && sfi_gpu_verify_digest(r->ver, b, hex, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            return 1;
        }
        char *text = NULL;
        size_t text_len = 0;
        if (r->tk && sfi_tokenizer_decode(r->tk, ids, (size_t)ng, &text, &text_len, &e))
            text = NULL;
        int n_slow = 0;
        for (int t = 0; t < ng; t++)
            n_slow += r->res.kinds[(size_t)b * a->max_new + t] == SFI_STEP_SLOW;
        if (jreqs)
            json_array_append_new(jreqs,
                                  request_json(a, r, b, backend, text, text_len, hex, n_slow));
        else
            request_text(a, r, b, backend, text, text_len, hex, n_slow);
        free(text);
    }
    return 0;
}

/* The JSON object's run-wide fields and its requests (a single request's
 * fields also at the top level, as sfi-ref run has them). */
static void finish_json(const run_args *a, const run_state *r, json_t *jreqs)
{
    json_t *jout = r->jout;
    json_object_set_new(jout, "batch", json_integer(r->B));
    json_object_set_new(jout, "dtype", json_string(a->eo.dtype == SFI_GPU_BF16 ? "bf16" : "f32"));
    json_object_set_new(jout, "exact", json_boolean(a->eo.exact));
    json_object_set_new(jout, "max_new", json_integer(a->max_new));
    json_object_set_new(jout, "tp", json_integer(a->tp));
    json_object_set_new(jout, "graph_build_seconds", json_real(r->res.graph_build_s));
    char *pj = sfi_params_to_json(&a->eo.params);
    json_t *pv = pj ? json_loads(pj, 0, NULL) : NULL;
    free(pj);
    if (pv)
        json_object_set_new(jout, "params", pv);
    if (r->B == 1) {
        json_t *r0 = json_array_get(jreqs, 0);
        const char *k;
        json_t *v;
        json_object_foreach(r0, k, v) json_object_set(jout, k, v);
    }
    json_object_set_new(jout, "requests", jreqs);
}

/* The reports (requests, --bench's classes), on standard output. Returns
 * 0 or 1. */
static int report(const run_args *a, run_state *r, double bw)
{
    json_t *jreqs = NULL;
    if (a->json) {
        r->jout = json_object();
        jreqs = json_array();
    }
    if (report_requests(a, r, jreqs)) {
        json_decref(jreqs);
        return 1;
    }
    if (a->json)
        finish_json(a, r, jreqs);
    if (a->bench) {
        json_t *jb = a->json ? json_object() : NULL;
        bench_report(r->eng, &a->eo, r->pr, r->B, &r->res, bw, jb);
        if (jb)
            json_object_set_new(r->jout, "bench", jb);
    }
    if (a->json) {
        char *s = json_dumps(r->jout, JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
        if (!s) {
            fprintf(stderr, CMD ": cannot encode the JSON output (out of memory?)\n");
            return 1;
        }
        printf("%s\n", s);
        free(s);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, CMD ": writing standard output failed\n");
        return 1;
    }
    return 0;
}

/* parse, load, read the prompts (all checked before the device), run,
 * check, report. */
int sfi_gpu_cmd_run(int argc, char **argv)
{
    run_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    run_state r;
    memset(&r, 0, sizeof r);
    rc = 1;
    if (load_model(&a, &r) || load_tokenizer(&a, &r) || read_prompts(&a, &r) ||
        (a.force_ids && read_force_ids(&a, &r)) || fill_batch(&a, &r) || check_prompts(&a, &r))
        goto out;
    if (a.tp > 1) { /* a --tp that does not split the model: said before the device */
        sfi_error e;
        sfi_gpu_engine_mem mp;
        if (sfi_gpu_engine_mem_plan(&r.cfg, &a.eo, &mp, &e)) {
            fprintf(stderr, CMD ": %s\n", e.msg);
            goto out;
        }
    }
    /* inputs are checked; now the device */
    char msg[256];
    if (!sfi_gpu_device_ok(msg, sizeof msg)) {
        fprintf(stderr, CMD ": skipped: %s\n", msg);
        rc = SFI_GPU_EXIT_NODEV;
        goto out;
    }
    if ((rc = tp_available(&a)))
        goto out;
    rc = 1;
    double bw = a.bench ? copy_bandwidth() : 0;
    if (plan_memory(&a, &r) || run_engine(&a, &r))
        goto out;
    int check_fail = a.check ? run_reference(&a, &r) : 0;
    if (a.check_tp)
        check_fail |= run_check_tp(&a, &r);
    if (report(&a, &r, bw))
        goto out;
    rc = check_fail ? 1 : 0;
    if (a.check || a.check_tp)
        fprintf(stderr, CMD ": check %s\n", check_fail ? "FAILED" : "passed");
out:
    run_free(&r);
    return rc;
}
