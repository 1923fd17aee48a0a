/* The serving simulation (see sfi_serve.h). */
#include <config.h>

#include "sfi_serve.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_rng.h"
#include "sfi_sim_util.h"
#include "sfi_sort.h"

enum { ST_PENDING = 0, ST_WAITING, ST_RUNNING, ST_DONE };

typedef struct {
    int id;
    int state;
    int prompt, gen;
    int generated;   /* tokens sampled so far */
    int computed;    /* positions whose K/V are computed */
    int target;      /* positions the current prefill computes: prompt + generated */
    int held;        /* positions allocated (a multiple of the block size) */
    double own;      /* bytes held, the shared prefix excluded */
    int shared;      /* tokens of its prompt it takes from the shared prefix */
    int in_pool;     /* holds a reference to the shared prefix */
    int hit;         /* positions its prefill took from the shared prefix */
    sfi_trigger_policy trig;
    int64_t pos;     /* next token of its stream */
    int32_t prev;
    int fresh;       /* the next decode step is the first after a prefill */
} rq;

/* What a request does in the step being built. */
typedef struct {
    rq *r;
    int n;           /* tokens */
    int prefill;
    int slow;
} work;

typedef struct {
    const sfi_serve_config *c;
    sfi_cost_setup cs;       /* mutable copy: request_bytes at a context */
    double pos_all;          /* K/V bytes of one position in all layers, one GPU */
    double budget, used;
    /* The shared prefix's blocks: allocated, computed, references, the
     * request computing them (-1: none). */
    int pool_tokens, pool_computed, pool_refs, pool_owner;
    rq *rqs;
    rq **running;
    int n_running;
    rq **wq;                 /* waiting queue, a ring of n */
    int wq_head, wq_len, n;
    work *wk;                /* [n] the step being built */
    sfi_cost_group *grp;     /* [n] its cost groups */
    sfi_serve_result *out;
} engine;

void sfi_serve_config_init(sfi_serve_config *c)
{
    memset(c, 0, sizeof *c);
    sfi_cost_setup_init(&c->cost);
    c->gpu_mem_util = 0.9;
    c->block_size = 16;
    c->max_num_seqs = 256;
    c->max_batched_tokens = 8192;
    c->chunked_prefill = 1;
    c->shared_prefix = 0;
    c->trigger = SFI_TRIG_SFI;
    c->interval = 16;
}

/* ---- memory ---- */

static int round_blocks(const engine *e, int positions)
{
    int bs = e->c->block_size;
    int64_t b = ((int64_t)positions + bs - 1) / bs * bs;
    return b > (1 << 30) ? (1 << 30) : (int)b;
}

/* Bytes a request holds at `positions` cached positions, its shared
 * prefix excluded. */
static double own_bytes(engine *e, const rq *r, int positions)
{
    e->cs.context = round_blocks(e, positions < 1 ? 1 : positions);
    double b = sfi_cost_request_bytes(&e->cs);
    if (r->in_pool)
        b -= r->shared * e->pos_all;
    return b > 0 ? b : 0;
}

/* Activations of one step of `tokens` tokens on one GPU (bf16): residual
 * stream, norm output, QKV, attention output, MLP intermediates, plus fp32
 * logits of the requests sampled. An estimate of what an engine profiles
 * for max_batched_tokens; the profile's reserved_bytes adds the rest. */
static double activation_bytes(const sfi_cost_setup *s, double tokens, int seqs)
{
    const sfi_model_config *m = s->model;
    double hq = (double)m->num_attention_heads / s->tp;
    double hkv = m->num_key_value_heads >= s->tp ? (double)m->num_key_value_heads / s->tp : 1;
    double inter = m->arch == SFI_ARCH_QWEN3_MOE && m->num_experts > 0
                       ? (double)m->num_experts_per_tok * m->moe_intermediate_size / s->tp
                       : (double)m->intermediate_size / s->tp;
    double per_tok = 2.0 * (3.0 * m->hidden_size + (hq + 2 * hkv) * m->head_dim +
                            hq * m->head_dim + 2 * inter);
    return tokens * per_tok + (double)seqs * m->vocab_size * 4.0;
}

static void wq_push_back(engine *e, rq *r)
{
    e->wq[(e->wq_head + e->wq_len++) % e->n] = r;
    r->state = ST_WAITING;
}

static void wq_push_front(engine *e, rq *r)
{
    e->wq_head = (e->wq_head + e->n - 1) % e->n;
    e->wq[e->wq_head] = r;
    e->wq_len++;
    r->state = ST_WAITING;
}

static rq *wq_front(const engine *e)
{
    return e->wq_len ? e->wq[e->wq_head] : NULL;
}

static void wq_pop(engine *e)
{
    e->wq_head = (e->wq_head + 1) % e->n;
    e->wq_len--;
}

static void release(engine *e, rq *r)
{
    e->used -= r->own;
    r->own = 0;
    r->held = 0;
    if (r->in_pool) {
        e->pool_refs--;
        r->in_pool = 0;
    }
    if (e->pool_owner == r->id)
        e->pool_owner = -1;
}

/* Frees the cached shared prefix when nobody uses it. */
static int evict_pool(engine *e)
{
    if (e->pool_refs > 0 || e->pool_tokens == 0)
        return 0;
    e->used -= e->pool_tokens * e->pos_all;
    e->pool_tokens = e->pool_computed = 0;
    return 1;
}

/* Recompute preemption of the last running request. */
static void preempt_last(engine *e)
{
    rq *r = e->running[--e->n_running];
    /* What it computed itself is dropped, to be computed again. */
    e->out->recomputed_tokens += r->computed - r->hit;
    release(e, r);
    r->computed = 0;
    r->shared = 0;
    e->out->preemptions++;
    e->out->req[r->id].preemptions++;
    wq_push_front(e, r);
}

/* Shared-prefix tokens of a request's prompt: full blocks, never the whole
 * prompt (its last token is computed to sample). */
static int shared_of(const engine *e, const rq *r)
{
    if (e->c->shared_prefix <= 0)
        return 0;
    int s = e->c->shared_prefix < r->prompt - 1 ? e->c->shared_prefix : r->prompt - 1;
    return s / e->c->block_size * e->c->block_size;
}

/* Admits the head of the queue if it fits: 1 admitted, 0 not (it waits). */
static int try_admit(engine *e, rq *r, double t)
{
    int sh = shared_of(e, r), grow = 0;
    if (sh > 0) {
        /* Another request is computing the blocks it needs: wait. */
        if (e->pool_owner >= 0 && sh > e->pool_computed)
            return 0;
        grow = sh > e->pool_tokens ? sh - e->pool_tokens : 0;
    }
    int target = r->prompt + r->generated;
    r->shared = sh;
    r->in_pool = sh > 0;
    double own = own_bytes(e, r, target);
    double need = own + grow * e->pos_all;
    if (e->used + need > e->budget && sh == 0)
        evict_pool(e);
    if (e->used + need > e->budget) {
        r->shared = 0;
        r->in_pool = 0;
        return 0;
    }
    e->used += need;
    r->own = own;
    r->held = round_blocks(e, target);
    r->target = target;
    r->computed = 0;
    r->hit = 0;
    if (sh > 0) {
        e->pool_tokens += grow;
        e->pool_refs++;
        int hit = sh < e->pool_computed ? sh : e->pool_computed;
        r->computed = hit;
        r->hit = hit;
        e->out->cached_tokens += hit;
        if (sh > e->pool_computed)
            e->pool_owner = r->id;
    }
    if (e->out->req[r->id].admitted < 0)
        e->out->req[r->id].admitted = t;
    r->state = ST_RUNNING;
    e->running[e->n_running++] = r;
    return 1;
}

/* Makes room for running request i to hold `positions`: preempts from the
 * tail (possibly i itself). Returns 0 when i was preempted. */
static int grow_to(engine *e, int i, int positions)
{
    rq *r = e->running[i];
    if (positions <= r->held)
        return 1;
    double nb = own_bytes(e, r, positions);
    for (;;) {
        double extra = nb - r->own;
        if (e->used + extra <= e->budget) {
            e->used += extra;
            r->own = nb;
            r->held = round_blocks(e, positions);
            return 1;
        }
        if (evict_pool(e))
            continue;
        int last = e->n_running - 1 == i;
        preempt_last(e);
        if (last)
            return 0;
    }
}

static int decide_slow(engine *e, rq *r)
{
    const sfi_serve_config *c = e->c;
    int slow;
    if (!sfi_policy_has_slow_steps(c->cost.kind)) {
        slow = 0;
    } else if (c->stream) {
        slow = sfi_trigger_next(&r->trig, r->prev, NULL) == SFI_STEP_SLOW;
        r->prev = c->stream->tokens[r->pos];
        if (++r->pos == c->stream->n)
            r->pos = 0;
    } else {
        slow = r->fresh;
    }
    r->fresh = 0;
    return slow;
}

static void restart_trigger(engine *e, rq *r)
{
    const sfi_serve_config *c = e->c;
    r->fresh = 1;
    if (c->stream)
        sfi_trigger_policy_init(&r->trig, c->trigger, &c->cost.pol.prm, c->stream->is_trigger,
                                c->stream->n_vocab, c->interval);
    r->prev = -1;
}

static sfi_status validate(const sfi_serve_config *c, const sfi_serve_request *req, int n,
                           sfi_error *err)
{
    if (!(c->gpu_mem_util > 0 && c->gpu_mem_util <= 1))
        return sfi_error_set(err, SFI_ERANGE, "gpu memory utilization %g: must be in (0, 1]",
                             c->gpu_mem_util);
    if (c->block_size < 1 || c->block_size > 65536)
        return sfi_error_set(err, SFI_ERANGE, "block size %d: must be in 1..65536", c->block_size);
    if (c->max_num_seqs < 1 || c->max_num_seqs > (1 << 20))
        return sfi_error_set(err, SFI_ERANGE, "max running requests %d: must be in 1..2^20",
                             c->max_num_seqs);
    if (c->max_batched_tokens < c->max_num_seqs || c->max_batched_tokens > (1 << 24))
        return sfi_error_set(err, SFI_ERANGE,
                             "max batched tokens %d: must be in max-num-seqs (%d)..2^24 (every "
                             "running request decodes in each step)",
                             c->max_batched_tokens, c->max_num_seqs);
    if (c->shared_prefix < 0)
        return sfi_error_set(err, SFI_ERANGE, "shared prefix %d: negative", c->shared_prefix);
    if (c->stream && (!c->stream->tokens || c->stream->n < 1))
        return sfi_error_set(err, SFI_EINVAL, "empty token stream");
    if (n < 1 || n > (1 << 24) || !req)
        return sfi_error_set(err, SFI_ERANGE, "%d requests: must be in 1..2^24", n);
    for (int i = 0; i < n; i++) {
        if (!(req[i].arrival >= 0 && req[i].arrival < 1e12))
            return sfi_error_set(err, SFI_ERANGE, "request %d: arrival %g s outside [0, 1e12)", i,
                                 req[i].arrival);
        if (req[i].prompt < 1 || req[i].gen < 1 ||
            (int64_t)req[i].prompt + req[i].gen > (1 << 30))
            return sfi_error_set(err, SFI_ERANGE,
                                 "request %d: %d prompt + %d new tokens: each >= 1, together at "
                                 "most 2^30",
                                 i, req[i].prompt, req[i].gen);
    }
    return SFI_OK;
}

/* Order of arrival: by time, then by index. */
typedef struct {
    double t;
    int i;
} arrival;

static int cmp_arrival(const void *a, const void *b)
{
    const arrival *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int same_group(const sfi_cost_group *a, const sfi_cost_group *b)
{
    return a->context == b->context && a->n_new == b->n_new && a->prefill == b->prefill &&
           a->slow == b->slow && a->last_chunk == b->last_chunk;
}

static sfi_status push_step(sfi_serve_result *o, const sfi_serve_step *st, int64_t *cap,
                            sfi_error *err)
{
    if (o->n_steps == *cap) {
        int64_t nc = *cap ? *cap * 2 : 1024;
        sfi_serve_step *p = realloc(o->steps, (size_t)nc * sizeof *p);
        if (!p)
            return sfi_error_set(err, SFI_ENOMEM, "serve: out of memory for the timeline");
        o->steps = p;
        *cap = nc;
    }
    o->steps[o->n_steps] = *st;
    return SFI_OK;
}

/* The memory of one GPU: weights (from the memory model), activations of
 * the largest step, the profile's reserve; the rest is the KV budget,
 * refused when there is none. */
static sfi_status size_memory(engine *e, const sfi_serve_request *req, int n, sfi_error *err)
{
    const sfi_serve_config *c = e->c;
    sfi_serve_result *out = e->out;
    /* Weights from the memory model (its context checks do not apply to
     * a workload: give it a context it accepts). */
    sfi_cost_setup ms = c->cost;
    ms.context = ms.pol.prm.K > ms.budget.positions ? ms.pol.prm.K : ms.budget.positions;
    if (ms.context < 1)
        ms.context = 1;
    ms.batch = 1;
    sfi_cost_memory mem;
    sfi_status st = sfi_cost_memory_of(&ms, &mem, err);
    if (st)
        return st;
    ms.kind = SFI_POLICY_FULL;
    ms.context = 1 << 20;
    e->pos_all = sfi_cost_request_bytes(&ms) / (1 << 20);

    /* Without chunking, a prefill step holds a whole prompt (a recompute:
     * prompt and generated tokens). */
    int max_len = 0;
    for (int i = 0; i < n; i++)
        if (req[i].prompt + req[i].gen > max_len)
            max_len = req[i].prompt + req[i].gen;
    double step_tokens = c->max_batched_tokens;
    if (!c->chunked_prefill && max_len > step_tokens)
        step_tokens = max_len;
    out->weights = mem.weights;
    out->activations = activation_bytes(&c->cost, step_tokens,
                                        c->max_num_seqs < n ? c->max_num_seqs : n);
    out->reserved = c->cost.prof.reserved_bytes;
    out->kv_budget = c->gpu_mem_util * c->cost.gpu.hbm_capacity - out->weights -
                     out->activations - out->reserved;
    e->budget = out->kv_budget;
    if (!(e->budget > 0))
        return sfi_error_set(err, SFI_ERANGE,
                             "%s on %s (TP %d): weights %.2f GB + activations %.2f GB + reserved "
                             "%.2f GB per GPU leave no room for KV in %.2f x %.1f GB (raise --tp "
                             "or --gpu-mem-util)",
                             c->cost.model->name, c->cost.gpu.name, c->cost.tp, out->weights / 1e9,
                             out->activations / 1e9, out->reserved / 1e9, c->gpu_mem_util,
                             c->cost.gpu.hbm_capacity / 1e9);
    return SFI_OK;
}

/* The requests' state and statistics, each refused when alone at its
 * longest it would not fit the KV budget; order: their arrivals, sorted. */
static sfi_status init_requests(engine *e, const sfi_serve_request *req, arrival *order,
                                sfi_error *err)
{
    const sfi_serve_config *c = e->c;
    sfi_serve_result *out = e->out;
    int n = e->n;
    for (int i = 0; i < n; i++) {
        rq *r = &e->rqs[i];
        r->id = i;
        r->prompt = req[i].prompt;
        r->gen = req[i].gen;
        r->pos = c->stream ? (int64_t)((double)i * (double)c->stream->n / n) % c->stream->n : 0;
        r->prev = -1;
        out->req[i].arrival = req[i].arrival;
        out->req[i].admitted = -1;
        out->req[i].first_token = -1;
        out->req[i].prompt = req[i].prompt;
        out->req[i].gen = req[i].gen;
        /* Alone, at its longest, without the shared prefix. */
        double alone = own_bytes(e, r, req[i].prompt + req[i].gen);
        if (alone > out->request_bytes_max)
            out->request_bytes_max = alone;
        if (alone > e->budget)
            return sfi_error_set(
                err, SFI_ERANGE,
                "request %d: %d prompt + %d new tokens need %.2f GB per GPU (%s: KV "
                "cache and buffers), more than the KV budget of %.2f GB (%.2f x "
                "%.1f GB - weights %.2f - activations %.2f - reserved %.2f); raise "
                "--tp or --gpu-mem-util, or shorten the requests",
                i, req[i].prompt, req[i].gen, alone / 1e9, sfi_policy_kind_name(c->cost.kind),
                e->budget / 1e9, c->gpu_mem_util, c->cost.gpu.hbm_capacity / 1e9,
                out->weights / 1e9, out->activations / 1e9, out->reserved / 1e9);
        order[i] = (arrival){req[i].arrival, i};
    }
    qsort(order, (size_t)n, sizeof *order, cmp_arrival);
    return SFI_OK;
}

/* The work of the step starting at t into e->wk: without chunking, whole
 * prefills in a step of their own when any can be admitted; else every
 * running request's next chunk or token within the token budget (growing
 * its blocks may preempt others), then, chunking, new admissions while no
 * one was preempted. Returns the number of requests in the step. */
static int build_step(engine *e, double t)
{
    const sfi_serve_config *c = e->c;
    work *wk = e->wk;
    int nw = 0, budget = c->max_batched_tokens, preempted = 0, prefill_step = 0;
    int64_t before = e->out->preemptions;
    if (!c->chunked_prefill && e->wq_len > 0) {
        /* Prefills first, whole prompts, in a step of their own. */
        int tok = 0;
        rq *r;
        while ((r = wq_front(e)) && e->n_running < c->max_num_seqs) {
            int need = r->prompt + r->generated;
            if (tok > 0 && tok + need > budget)
                break;
            if (!try_admit(e, r, t))
                break;
            wq_pop(e);
            wk[nw++] = (work){r, r->target - r->computed, 1, 0};
            tok += r->target - r->computed;
        }
        prefill_step = nw > 0;
    }
    if (prefill_step)
        return nw;
    for (int i = 0; i < e->n_running; i++) {
        rq *r = e->running[i];
        if (r->computed < r->target) {
            int k = r->target - r->computed;
            if (k > budget)
                k = budget;
            if (k <= 0)
                continue;
            wk[nw++] = (work){r, k, 1, 0};
            budget -= k;
        } else {
            if (budget < 1)
                continue;
            if (!grow_to(e, i, r->computed + 1))
                break;
            wk[nw++] = (work){r, 1, 0, 0};
            budget -= 1;
        }
    }
    preempted = e->out->preemptions > before;
    rq *r;
    while (c->chunked_prefill && !preempted && budget > 0 && (r = wq_front(e)) &&
           e->n_running < c->max_num_seqs) {
        if (!try_admit(e, r, t))
            break;
        wq_pop(e);
        int k = r->target - r->computed;
        if (k > budget)
            k = budget;
        wk[nw++] = (work){r, k, 1, 0};
        budget -= k;
    }
    return nw;
}

/* The step's cost: its requests as groups (consecutive equal ones merged),
 * each decode step's kind decided here; pf_tok prefill tokens, n_slow
 * slow steps. */
static sfi_status price_step(engine *e, int nw, int *pf_tok, int *n_slow, sfi_step_cost *sc,
                             sfi_error *err)
{
    work *wk = e->wk;
    sfi_cost_group *grp = e->grp;
    int ng = 0;
    *pf_tok = *n_slow = 0;
    for (int i = 0; i < nw; i++) {
        rq *r = wk[i].r;
        sfi_cost_group g;
        memset(&g, 0, sizeof g);
        g.count = 1;
        g.n_new = wk[i].n;
        g.context = r->computed + wk[i].n;
        if (wk[i].prefill) {
            g.prefill = 1;
            g.last_chunk = r->computed + wk[i].n == r->target;
            *pf_tok += wk[i].n;
        } else {
            wk[i].slow = decide_slow(e, r);
            g.slow = wk[i].slow;
            *n_slow += g.slow;
        }
        if (ng > 0 && same_group(&grp[ng - 1], &g))
            grp[ng - 1].count++;
        else
            grp[ng++] = g;
    }
    return sfi_cost_step_mix(&e->c->cost, grp, ng, sc, err);
}

/* The step's effects at its end t_end: positions computed, tokens
 * sampled, finished requests released and dropped from the running set.
 * Returns the number that finished. */
static int apply_step(engine *e, int nw, double t_end)
{
    const sfi_serve_config *c = e->c;
    sfi_serve_result *out = e->out;
    work *wk = e->wk;
    int finished = 0;
    for (int i = 0; i < nw; i++) {
        rq *r = wk[i].r;
        sfi_serve_req_stats *rs = &out->req[r->id];
        r->computed += wk[i].n;
        if (wk[i].prefill) {
            out->prefill_tokens += wk[i].n;
            if (e->pool_owner == r->id) {
                int done_sh = r->computed < r->shared ? r->computed : r->shared;
                done_sh = done_sh / c->block_size * c->block_size;
                if (done_sh > e->pool_computed)
                    e->pool_computed = done_sh;
                if (r->computed >= r->shared)
                    e->pool_owner = -1;
            }
            if (r->computed < r->target)
                continue;
            restart_trigger(e, r);
        } else {
            rs->decode_steps++;
            rs->slow_steps += wk[i].slow;
            out->request_steps++;
            out->slow_request_steps += wk[i].slow;
        }
        r->generated++;
        if (rs->first_token < 0)
            rs->first_token = t_end;
        if (r->generated >= r->gen) {
            rs->finish = t_end;
            release(e, r);
            r->state = ST_DONE;
            finished++;
        }
    }
    int k = 0;
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i]->state == ST_RUNNING)
            e->running[k++] = e->running[i];
    e->n_running = k;
    return finished;
}

sfi_status sfi_serve_run(const sfi_serve_config *c, const sfi_serve_request *req, int n,
                         sfi_serve_result *out, sfi_error *err)
{
    memset(out, 0, sizeof *out);
    sfi_status st = validate(c, req, n, err);
    if (st)
        return st;
    engine e;
    memset(&e, 0, sizeof e);
    e.c = c;
    e.cs = c->cost;
    e.n = n;
    e.out = out;
    e.pool_owner = -1;
    if ((st = size_memory(&e, req, n, err)))
        return st;

    e.rqs = calloc((size_t)n, sizeof *e.rqs);
    e.running = calloc((size_t)n, sizeof *e.running);
    e.wq = calloc((size_t)n, sizeof *e.wq);
    e.wk = calloc((size_t)n, sizeof *e.wk);
    e.grp = calloc((size_t)n, sizeof *e.grp);
    arrival *order = calloc((size_t)n, sizeof *order);
    out->req = calloc((size_t)n, sizeof *out->req);
    out->n = n;
    if (!e.rqs || !e.running || !e.wq || !e.wk || !e.grp || !order || !out->req) {
        st = sfi_error_set(err, SFI_ENOMEM, "serve: out of memory");
        goto done;
    }
    if ((st = init_requests(&e, req, order, err)))
        goto done;

    int next = 0, done_n = 0;
    int64_t cap = 0;
    double t = order[0].t, run_time = 0;
    out->start = t;
    while (done_n < n) {
        while (next < n && order[next].t <= t)
            wq_push_back(&e, &e.rqs[order[next++].i]);
        if (e.n_running == 0 && e.wq_len == 0) {
            t = order[next].t;
            continue;
        }
        int nw = build_step(&e, t);
        if (nw == 0) {
            if (next < n) {
                t = order[next].t;
                continue;
            }
            st = sfi_error_set(err, SFI_EINVAL, "serve: the scheduler stalled at t = %g s", t);
            goto done;
        }
        /* Memory held during the step (finished requests free theirs after). */
        double in_use = e.used;
        if (in_use > out->peak_kv)
            out->peak_kv = in_use;
        int pf_tok, n_slow;
        sfi_step_cost sc;
        if ((st = price_step(&e, nw, &pf_tok, &n_slow, &sc, err)))
            goto done;
        double t_end = t + sc.time_s;
        done_n += apply_step(&e, nw, t_end);
        if (nw > out->peak_running)
            out->peak_running = nw;
        run_time += nw * sc.time_s;
        out->busy_s += sc.time_s;
        if (c->timeline) {
            sfi_serve_step s1 = {t, sc.time_s, in_use, nw, e.wq_len, pf_tok, n_slow};
            if ((st = push_step(out, &s1, &cap, err)))
                goto done;
        }
        out->n_steps++;
        t = t_end;
    }
    out->end = t;
    out->mean_running = out->busy_s > 0 ? run_time / out->busy_s : 0;
    out->peak_mem = out->weights + out->activations + out->reserved + out->peak_kv;
done:
    free(e.rqs);
    free(e.running);
    free(e.wq);
    free(e.wk);
    free(e.grp);
    free(order);
    if (st)
        sfi_serve_result_free(out);
    return st;
}

void sfi_serve_result_free(sfi_serve_result *r)
{
    if (!r)
        return;
    free(r->req);
    free(r->steps);
    r->req = NULL;
    r->steps = NULL;
}

/* ---- metrics ---- */

static void stats3(double *v, int m, double *mean, double *p50, double *p99)
{
    if (m == 0) {
        *mean = *p50 = *p99 = NAN;
        return;
    }
    double s = 0;
    for (int i = 0; i < m; i++)
        s += v[i];
    qsort(v, (size_t)m, sizeof *v, sfi_cmp_f64);
    *mean = s / m;
    /* Nearest rank: the smallest value with at least q of the requests at
     * or below it. */
    int r50 = (int)ceil(0.50 * m), r99 = (int)ceil(0.99 * m);
    *p50 = v[(r50 < 1 ? 1 : r50) - 1];
    *p99 = v[(r99 < 1 ? 1 : r99) - 1];
}

sfi_status sfi_serve_summarize(const sfi_serve_result *r, double slo_tpot, double slo_ttft,
                               sfi_serve_summary *s, sfi_error *err)
{
    memset(s, 0, sizeof *s);
    if (!r || r->n < 1 || !r->req)
        return sfi_error_set(err, SFI_EINVAL, "serve: no result to summarize");
    double *ttft = malloc((size_t)r->n * sizeof *ttft), *tpot = malloc((size_t)r->n * sizeof *tpot),
           *e2e = malloc((size_t)r->n * sizeof *e2e);
    if (!ttft || !tpot || !e2e) {
        free(ttft);
        free(tpot);
        free(e2e);
        return sfi_error_set(err, SFI_ENOMEM, "serve: out of memory");
    }
    int m_tpot = 0, met = 0;
    double good = 0;
    for (int i = 0; i < r->n; i++) {
        const sfi_serve_req_stats *q = &r->req[i];
        ttft[i] = q->first_token - q->arrival;
        e2e[i] = q->finish - q->arrival;
        double tp = q->gen > 1 ? (q->finish - q->first_token) / (q->gen - 1) : 0;
        if (q->gen > 1)
            tpot[m_tpot++] = tp;
        s->tokens += q->gen;
        int ok = (!(slo_tpot > 0) || tp <= slo_tpot) && (!(slo_ttft > 0) || ttft[i] <= slo_ttft);
        met += ok;
        if (ok)
            good += q->gen;
    }
    s->elapsed = r->end - r->start;
    s->tok_s = s->elapsed > 0 ? s->tokens / s->elapsed : NAN;
    s->goodput_tok_s = s->elapsed > 0 ? good / s->elapsed : NAN;
    s->slo_met = (double)met / r->n;
    stats3(ttft, r->n, &s->ttft_mean, &s->ttft_p50, &s->ttft_p99);
    stats3(tpot, m_tpot, &s->tpot_mean, &s->tpot_p50, &s->tpot_p99);
    stats3(e2e, r->n, &s->e2e_mean, &s->e2e_p50, &s->e2e_p99);
    s->slow_frac = r->request_steps ? (double)r->slow_request_steps / r->request_steps : 0;
    free(ttft);
    free(tpot);
    free(e2e);
    return SFI_OK;
}

/* ---- workloads ---- */

static int parse_len(const char *s, size_t len, double *out)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    int64_t v;
    if (sfi_sim_parse_size(buf, 1, &v) || v < 1 || v > (1 << 30))
        return -1;
    *out = (double)v;
    return 0;
}

sfi_status sfi_len_dist_parse(const char *spec, sfi_len_dist *d, sfi_error *err)
{
    memset(d, 0, sizeof *d);
    if (!spec || !spec[0])
        return sfi_error_set(err, SFI_EINVAL, "empty length");
    if (!strcmp(spec, "trace")) {
        d->kind = SFI_LEN_TRACE;
        return SFI_OK;
    }
    const char *c1 = strchr(spec, ':');
    if (!c1) {
        if (parse_len(spec, strlen(spec), &d->a))
            return sfi_error_set(err, SFI_EINVAL,
                                 "'%s' is not a length in 1..2^30 (e.g. 8K), uniform:LO:HI, "
                                 "lognormal:MEDIAN:SIGMA or trace",
                                 spec);
        d->kind = SFI_LEN_FIXED;
        return SFI_OK;
    }
    const char *c2 = strchr(c1 + 1, ':');
    size_t nlen = (size_t)(c1 - spec);
    if (!c2 || strchr(c2 + 1, ':'))
        return sfi_error_set(err, SFI_EINVAL, "'%s': expected KIND:A:B", spec);
    if (nlen == 7 && !strncmp(spec, "uniform", 7)) {
        if (parse_len(c1 + 1, (size_t)(c2 - c1 - 1), &d->a) || parse_len(c2 + 1, strlen(c2 + 1), &d->b) ||
            d->b < d->a)
            return sfi_error_set(err, SFI_EINVAL, "'%s': uniform:LO:HI needs 1 <= LO <= HI <= 2^30",
                                 spec);
        d->kind = SFI_LEN_UNIFORM;
        return SFI_OK;
    }
    if (nlen == 9 && !strncmp(spec, "lognormal", 9)) {
        char *end;
        if (parse_len(c1 + 1, (size_t)(c2 - c1 - 1), &d->a))
            return sfi_error_set(err, SFI_EINVAL, "'%s': lognormal median must be in 1..2^30", spec);
        d->b = strtod(c2 + 1, &end);
        if (end == c2 + 1 || *end || !(d->b >= 0 && d->b <= 5))
            return sfi_error_set(err, SFI_EINVAL, "'%s': lognormal sigma must be in 0..5", spec);
        d->kind = SFI_LEN_LOGNORMAL;
        return SFI_OK;
    }
    return sfi_error_set(err, SFI_EINVAL, "'%s': unknown distribution '%.*s' (uniform, lognormal)",
                         spec, (int)nlen, spec);
}

int sfi_len_dist_draw(const sfi_len_dist *d, uint64_t *rng, int i, const int64_t *values,
                      int64_t n_values)
{
    double v;
    switch (d->kind) {
    case SFI_LEN_UNIFORM:
        v = d->a + floor(sfi_rng_uniform(rng) * (d->b - d->a + 1));
        break;
    case SFI_LEN_LOGNORMAL: {
        /* Box-Muller; 1 - u keeps the log finite. */
        double u1 = 1.0 - sfi_rng_uniform(rng), u2 = sfi_rng_uniform(rng);
        double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
        v = floor(d->a * exp(d->b * z) + 0.5);
        break;
    }
    case SFI_LEN_TRACE:
        v = values && n_values > 0 ? (double)values[i % n_values] : 1;
        break;
    default:
        v = d->a;
    }
    if (v < 1)
        v = 1;
    if (v > (1 << 30))
        v = 1 << 30;
    return (int)v;
}
