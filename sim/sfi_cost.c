/* Cost model of one decode step (see sfi_cost.h and sfi-sim(1)). */
#include <config.h>

#include "sfi_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Non-tensor FP32 throughput as a fraction of the dense BF16 tensor peak:
 * H100 SXM 67 / 989 TFLOPS, B200 80 / 2250 (datasheets); the Selector's
 * elementwise work (exp, powers, compares) runs there. */
#define FP32_OF_BF16 (1.0 / 15.0)
/* HBM passes of Top-K over its fp32 scores: the GPU radix select (gpu/)
 * reads the scores once and keeps its digit histograms on chip; the GPU
 * benchmark calibrates the topk efficiency against one pass. */
#define TOPK_PASSES 1.0
/* Fused launches per layer of a decode step that the model counts besides
 * attention: input norm, QKV GEMM, q/k norm + RoPE, O GEMM, post norm +
 * residual, gate-up GEMM, down GEMM (MoE adds the router). */
#define MAIN_LAUNCHES_DENSE 7
#define MAIN_LAUNCHES_MOE 8
/* Selector kernels per slow layer, as gpu/ runs it: one fused kernel for
 * steps 1-7 and one for the cross-head step 8. */
#define SELECTOR_LAUNCHES 2
/* Side-stream kernels per layer: the Selector's, Top-K, reorg. */
#define SIDE_LAUNCHES (SELECTOR_LAUNCHES + 2)
/* sfi-gpu's rule for its slab decode GEMM (gpu/sfi_gpu_model.cu
 * try_slab): bf16 products of at most 64 rows with at most 13 MiB of
 * weights and a side of at most 1024. */
#define SLAB_MAX_BYTES (13.0 * 1048576.0)
#define SLAB_MAX_SIDE 1024.0
/* Scratch ring slots of the two-stream pipeline (sfi(7) GPU PATH). */
#define SCRATCH_RING 4
/* Prompt-tail queries whose logits initialize the Selector at the end of
 * a prefill (sfi(7) SELECTOR: W = 16). */
#define PREFILL_WINDOW 16

void sfi_cost_setup_init(sfi_cost_setup *s)
{
    memset(s, 0, sizeof *s);
    sfi_hw_profile_default(&s->prof);
    s->kind = SFI_POLICY_SFI;
    sfi_policy_config_default(&s->pol);
    s->tp = 1;
    s->weight_bytes = 2;
    s->kv_bytes = 2;
    s->batch = 1;
}

/* Heads held by one GPU: query heads split evenly; KV heads split when
 * there are at least tp of them, else each GPU keeps one (replicated). */
static int q_heads(const sfi_cost_setup *s)
{
    return s->model->num_attention_heads / s->tp;
}

static int kv_heads(const sfi_cost_setup *s)
{
    int kv = s->model->num_key_value_heads;
    return kv >= s->tp ? kv / s->tp : 1;
}

int sfi_cost_budget(const sfi_cost_setup *s)
{
    return sfi_budget_positions(&s->budget, &s->pol.prm, s->context);
}

/* SFI's parameters at the setup's budget (sfi_budget_sfi_split). */
static sfi_params sfi_prm(const sfi_cost_setup *s)
{
    sfi_params p = s->pol.prm;
    if (s->budget.ratio > 0.0 || s->budget.positions > 0)
        sfi_budget_sfi_split(&s->pol.prm, sfi_cost_budget(s), s->context, &p.n_recent, &p.K);
    return p;
}

/* Candidates J = [n_sink, L - n_recent) (sfi(7) MANAGED STATE). */
static int n_candidates(const sfi_cost_setup *s)
{
    sfi_params p = sfi_prm(s);
    int j = s->context - p.n_recent - p.n_sink;
    return j > 0 ? j : 0;
}

static int layer_is_moe(const sfi_model_config *m, int layer)
{
    /* Hugging Face Qwen3-MoE: a layer uses experts unless it is listed in
     * mlp_only_layers, when experts exist and (layer+1) is a multiple of
     * decoder_sparse_step. (sfi_model_layer_is_moe states the same rule;
     * the cost model keeps this copy so it needs only the struct.) */
    if (m->arch != SFI_ARCH_QWEN3_MOE || m->num_experts <= 0)
        return 0;
    for (int i = 0; i < m->n_mlp_only_layers; i++)
        if (m->mlp_only_layers[i] == layer)
            return 0;
    int step = m->decoder_sparse_step > 0 ? m->decoder_sparse_step : 1;
    return (layer + 1) % step == 0;
}

sfi_status sfi_cost_validate(const sfi_cost_setup *s, sfi_error *err)
{
    const sfi_model_config *m = s->model;
    if (!m)
        return sfi_error_set(err, SFI_EINVAL, "no model");
    if (m->num_hidden_layers < 1 || m->num_attention_heads < 1 || m->num_key_value_heads < 1 ||
        m->head_dim < 1 || m->hidden_size < 1 || m->vocab_size < 1)
        return sfi_error_set(err, SFI_EINVAL, "%s: model shape has a non-positive size", m->name);
    if (m->arch == SFI_ARCH_QWEN3_MOE &&
        (m->num_experts < 1 || m->num_experts_per_tok < 1 ||
         m->num_experts_per_tok > m->num_experts || m->moe_intermediate_size < 1))
        return sfi_error_set(err, SFI_EINVAL, "%s: MoE shape is inconsistent", m->name);
    if (s->tp < 1 || s->tp > 64)
        return sfi_error_set(err, SFI_ERANGE, "--tp %d: must be in 1..64", s->tp);
    if (m->num_attention_heads % s->tp)
        return sfi_error_set(err, SFI_EINVAL, "--tp %d does not divide %s's %d attention heads",
                             s->tp, m->name, m->num_attention_heads);
    if (m->num_key_value_heads % s->tp && s->tp % m->num_key_value_heads)
        return sfi_error_set(err, SFI_EINVAL,
                             "--tp %d and %s's %d KV heads: neither divides the other", s->tp,
                             m->name, m->num_key_value_heads);
    if (s->context < 1 || s->context > (1 << 30))
        return sfi_error_set(err, SFI_ERANGE, "context %d: must be in 1..2^30", s->context);
    if (s->batch < 1 || s->batch > (1 << 20))
        return sfi_error_set(err, SFI_ERANGE, "batch %d: must be in 1..2^20", s->batch);
    if (s->weight_bytes != 1 && s->weight_bytes != 2 && s->weight_bytes != 4)
        return sfi_error_set(err, SFI_EINVAL, "weight bytes %d: must be 1, 2 or 4", s->weight_bytes);
    if (s->kv_bytes != 1 && s->kv_bytes != 2 && s->kv_bytes != 4)
        return sfi_error_set(err, SFI_EINVAL, "KV bytes %d: must be 1, 2 or 4", s->kv_bytes);
    const sfi_params *prm = &s->pol.prm;
    if (prm->K < 1 || prm->n_sink < 0 || prm->n_recent < 1)
        return sfi_error_set(err, SFI_EINVAL, "K >= 1, n_sink >= 0, n_recent >= 1 needed");
    if (!(s->budget.ratio > 0.0) && !(s->budget.positions > 0) && prm->K > s->context)
        return sfi_error_set(err, SFI_EINVAL, "K = %d is larger than the context (%d positions)",
                             prm->K, s->context);
    /* Like K: a sink or recent window longer than the context is a typo
     * (n_recent=16777216 once priced a 2.4e11-byte KV per request). */
    if (prm->n_sink > s->context)
        return sfi_error_set(err, SFI_EINVAL, "n_sink = %d is larger than the context (%d "
                             "positions)", prm->n_sink, s->context);
    if (prm->n_recent > s->context)
        return sfi_error_set(err, SFI_EINVAL, "n_recent = %d is larger than the context (%d "
                             "positions)", prm->n_recent, s->context);
    if (s->budget.ratio < 0.0 || s->budget.ratio > 1.0 || s->budget.positions < 0)
        return sfi_error_set(err, SFI_EINVAL, "budget: a share in (0, 1] or a count >= 1");
    if ((unsigned)s->kind >= SFI_POLICY_N_KINDS)
        return sfi_error_set(err, SFI_EINVAL, "unknown policy");
    if (s->kind == SFI_POLICY_KASCADE && s->pol.kascade_anchors > m->num_hidden_layers - 1)
        return sfi_error_set(err, SFI_EINVAL, "kascade: anchors=%d must be in 1..%d (layers "
                             "besides the dense layer 0)", s->pol.kascade_anchors,
                             m->num_hidden_layers - 1);
    if (s->kind == SFI_POLICY_FASA && s->pol.fasa_tip > m->head_dim / 2)
        return sfi_error_set(err, SFI_EINVAL, "fasa: tip=%d must be in 1..%d (head_dim/2 chunks)",
                             s->pol.fasa_tip, m->head_dim / 2);
    if (s->kind == SFI_POLICY_QUEST && s->pol.quest_page < 1)
        return sfi_error_set(err, SFI_EINVAL, "quest: page must be >= 1");
    for (int c = 0; c < SFI_KC_COUNT; c++)
        if (!(s->prof.efficiency[c] > 0 && s->prof.efficiency[c] <= 1))
            return sfi_error_set(err, SFI_ERANGE, "profile %s: efficiency.%s outside (0, 1]",
                                 s->prof.name, sfi_kernel_class_name((sfi_kernel_class)c));
    return sfi_gpu_validate(&s->gpu, s->gpu.name, err);
}

double sfi_cost_expected_experts(int E, int k, int b)
{
    if (E <= 0 || k <= 0 || b <= 0)
        return 0;
    if (k >= E)
        return E;
    return E * (1.0 - pow(1.0 - (double)k / E, b));
}

/* Attention weights of one layer held by one GPU (elements). */
static double attn_weight_elems(const sfi_cost_setup *s)
{
    const sfi_model_config *m = s->model;
    double d = m->hidden_size, hd = m->head_dim;
    double q_o = 2.0 * d * m->num_attention_heads * hd / s->tp;
    double k_v = 2.0 * d * kv_heads(s) * hd;
    double norms = 2.0 * d + 2.0 * hd;
    return q_o + k_v + norms;
}

static double mlp_weight_elems(const sfi_cost_setup *s, int layer, double experts)
{
    const sfi_model_config *m = s->model;
    double d = m->hidden_size;
    if (layer_is_moe(m, layer))
        return d * m->num_experts + experts * 3.0 * d * m->moe_intermediate_size / s->tp;
    return 3.0 * d * m->intermediate_size / s->tp;
}

double sfi_cost_layer_weight_bytes(const sfi_cost_setup *s, int layer, int b)
{
    const sfi_model_config *m = s->model;
    double ex = layer_is_moe(m, layer)
                    ? sfi_cost_expected_experts(m->num_experts, m->num_experts_per_tok, b)
                    : 0;
    return (attn_weight_elems(s) + mlp_weight_elems(s, layer, ex)) * s->weight_bytes;
}

/* K and V bytes of one cached position in one layer on one GPU. */
static double kv_pos_bytes(const sfi_cost_setup *s)
{
    return 2.0 * kv_heads(s) * s->model->head_dim * s->kv_bytes;
}

int sfi_cost_fast_positions(const sfi_cost_setup *s)
{
    sfi_params p = sfi_prm(s);
    int J = n_candidates(s);
    int sel = p.K < J ? p.K : J;
    long n = (long)p.n_sink + sel + p.n_recent;
    return n < s->context ? (int)n : s->context;
}

double sfi_cost_kv_bytes_dense(const sfi_cost_setup *s)
{
    return (double)s->context * kv_pos_bytes(s);
}

double sfi_cost_kv_bytes_fast(const sfi_cost_setup *s)
{
    return (double)sfi_cost_fast_positions(s) * kv_pos_bytes(s);
}

/* Roofline time over efficiency, without the launch and fixed costs.
 * `stock`: the engine's own dense decode attention (full KV and the other
 * plain dense passes), whose efficiency an engine profile may give by
 * context; the kernels that expose logits (SFI's slow step, oracle,
 * Kascade) are ours and keep efficiency.attn_dense. */
static double roofline_x(const sfi_cost_setup *s, sfi_kernel_class c, double bytes, double flops,
                         int stock)
{
    double peak = s->weight_bytes == 1 && c == SFI_KC_GEMM ? s->gpu.fp8_flops : s->gpu.bf16_flops;
    if (c == SFI_KC_SELECTOR || c == SFI_KC_TOPK || c == SFI_KC_OTHER)
        peak = s->gpu.bf16_flops * FP32_OF_BF16;
    double t = fmax(bytes / s->gpu.hbm_bandwidth, flops / peak);
    double eff = c == SFI_KC_ATTN_DENSE && stock
                     ? sfi_hw_attn_dense_efficiency(&s->prof, s->context)
                     : s->prof.efficiency[c];
    return t / eff;
}

static double roofline_time(const sfi_cost_setup *s, sfi_kernel_class c, double bytes,
                            double flops)
{
    return roofline_x(s, c, bytes, flops, 1);
}

double sfi_cost_kernel_time(const sfi_cost_setup *s, sfi_kernel_class c, double bytes,
                            double flops)
{
    return roofline_time(s, c, bytes, flops) + s->prof.launch_s + s->prof.fixed_s[c];
}

/* The fixed part of a decode product of T token rows into M outputs over
 * N inputs, beyond its launch and bytes (prof.fixed_s[GEMM]; a GEMM's
 * ramp and tail, which stay when tensor parallelism halves its bytes).
 * Under gemm_slab_rule a product that sfi-gpu's slab kernel runs pays
 * none: its CTAs request their whole weight slab before waiting for the
 * previous kernel (programmatic dependent launch), which hides the ramp;
 * the register-streaming kernel requests 4 k-blocks per warp before it. */
static double gemm_fixed(const sfi_cost_setup *s, double M, double N, double T)
{
    double f = s->prof.fixed_s[SFI_KC_GEMM];
    if (!(f > 0))
        return 0;
    if (s->gemm_slab_rule && s->weight_bytes == 2 && T <= 64 && M * N * 2 <= SLAB_MAX_BYTES &&
        !(M > SLAB_MAX_SIDE && N > SLAB_MAX_SIDE))
        return 0;
    return f;
}

/* Extra time of a dense kernel that also writes `bytes` of fp32 logits. */
static double logits_time(const sfi_cost_setup *s, double bytes)
{
    return bytes / (s->gpu.hbm_bandwidth * s->prof.efficiency[SFI_KC_LOGITS]);
}

/* The collectives' latency and efficiency for the setup's group size. */
static void collective_params(const sfi_cost_setup *s, double *lat, double *eff)
{
    *lat = s->prof.allreduce_latency_s;
    *eff = s->prof.efficiency[SFI_KC_ALLREDUCE];
    if (s->tp < SFI_HW_AR_GROUPS && s->prof.ar_by_gpus_eff[s->tp] > 0) {
        *lat = s->prof.ar_by_gpus_lat[s->tp];
        *eff = s->prof.ar_by_gpus_eff[s->tp];
    }
}

/* One direction of a GPU's NVLink (half the vendor total), the bytes per
 * second a ring collective moves. */
static double link_per_dir(const sfi_cost_setup *s)
{
    double per_dir = s->gpu.nvlink_bandwidth / 2;
    return per_dir > 0 ? per_dir : 64e9; /* no NVLink: PCIe 5 x16 */
}

double sfi_cost_allreduce_time(const sfi_cost_setup *s, double bytes)
{
    if (s->tp <= 1)
        return 0;
    /* Ring all-reduce: each GPU sends and receives 2 (tp-1)/tp of the
     * message over one direction of its NVLink. */
    double t = 2.0 * (s->tp - 1) / s->tp * bytes / link_per_dir(s), lat, eff;
    collective_params(s, &lat, &eff);
    return t / eff + lat;
}

double sfi_cost_allgather_time(const sfi_cost_setup *s, double bytes)
{
    if (s->tp <= 1)
        return 0;
    /* Ring all-gather: each GPU forwards tp - 1 pieces of `bytes` over one
     * direction of its NVLink (NCCL's all-gather busbw counts the same);
     * the efficiency and latency fitted to all-gathers of this group size
     * where the profile has them, else the all-reduce's. */
    double t = (s->tp - 1.0) * bytes / link_per_dir(s), lat, eff;
    collective_params(s, &lat, &eff);
    if (s->tp < SFI_HW_AR_GROUPS && s->prof.ag_by_gpus_eff[s->tp] > 0) {
        lat = s->prof.ag_by_gpus_lat[s->tp];
        eff = s->prof.ag_by_gpus_eff[s->tp];
    }
    return t / eff + lat;
}

/* Bytes of the Selector scores one GPU contributes to a layer's all-gather
 * (sel_gather_positions) for `requests` requests. */
static double sel_gather_bytes(const sfi_cost_setup *s, double requests)
{
    if (s->tp <= 1 || s->sel_gather_positions <= 0 || !sfi_policy_has_slow_steps(s->kind) ||
        s->no_selector)
        return 0;
    return requests * kv_heads(s) * (double)s->sel_gather_positions * 4.0;
}

/* The requests whose scores a slow step's all-gather carries under
 * sel_split_gather: sfi-gpu packs the n slow requests' rows and replays
 * the step graph of the next power of two of them, the batch at most. */
static double sel_gather_slots(double n, double batch)
{
    double c = 1;
    while (c < n && c < batch)
        c *= 2;
    return c < batch ? c : batch;
}

void sfi_cost_comm_bytes(const sfi_cost_setup *s, int batch, double *allreduce, double *gather)
{
    *allreduce = *gather = 0;
    if (s->tp <= 1)
        return;
    const sfi_model_config *m = s->model;
    *allreduce = 2.0 * m->num_hidden_layers * batch * (double)m->hidden_size *
                 (s->allreduce_bytes > 0 ? s->allreduce_bytes : 2);
    /* the all-gathers of a step with one slow request (sel_split_gather:
     * sized for its slow requests), as sfi-gpu run --bench reports them */
    *gather = m->num_hidden_layers * sel_gather_bytes(s, s->sel_split_gather ? 1 : batch) +
              (s->argmax_gather ? 8.0 * batch : 0);
}

/* Kernels of several request groups that one launch runs together (a
 * mixed batch, sfi_cost_step_mix): launched[c] = kernels of class c the
 * launch already holds; a group's k-th kernel of class c joins the k-th
 * launch, paying its roofline time but not the launch and fixed costs
 * again. */
typedef struct {
    unsigned char launched[SFI_KC_COUNT];
} merge_state;

/* Per-step sums. */
typedef struct {
    double t, bytes, kvb, wb, flops;
    double attn_body; /* roofline time of the attention launch (with prof.cta_bandwidth) */
    double cta_s;     /* time of its slowest CTA at the per-CTA rates */
    double t_pre;     /* side work: time to the end of the Selector's steps 1-7
                         (its first kernel) */
    int launches;
    merge_state *merge;               /* NULL: every kernel is its own launch */
    unsigned char occ[SFI_KC_COUNT];  /* with merge: this group's kernels by class */
} acc;

static void add_kernel_x(const sfi_cost_setup *s, acc *a, sfi_kernel_class c, double bytes,
                         double flops, int is_kv, int stock)
{
    int own_launch = 1;
    if (a->merge) {
        /* sfi-gpu's engine: slow and fast requests in one attention launch */
        sfi_kernel_class m = s->mixed_attention && c == SFI_KC_ATTN_SPARSE ? SFI_KC_ATTN_DENSE : c;
        int k = a->occ[m]++;
        own_launch = k >= a->merge->launched[m];
        if (own_launch)
            a->merge->launched[m] = (unsigned char)(k + 1);
    }
    /* a GEMM's fixed part depends on its shape (gemm_fixed): its callers
     * add it */
    a->t += roofline_x(s, c, bytes, flops, stock) +
            (own_launch ? s->prof.launch_s + (c == SFI_KC_GEMM ? 0 : s->prof.fixed_s[c]) : 0);
    a->launches += own_launch;
    a->bytes += bytes;
    if (is_kv)
        a->kvb += bytes;
    a->flops += flops;
}

static void add_kernel(const sfi_cost_setup *s, acc *a, sfi_kernel_class c, double bytes,
                       double flops, int is_kv)
{
    add_kernel_x(s, a, c, bytes, flops, is_kv, 1);
}

/* A dense attention kernel reading kv bytes and writing logit bytes. */
static void add_dense_logits(const sfi_cost_setup *s, acc *a, double kv, double logit_bytes,
                             double flops)
{
    add_kernel_x(s, a, SFI_KC_ATTN_DENSE, kv, flops, 1, 0);
    a->t += logits_time(s, logit_bytes);
    a->bytes += logit_bytes;
    a->kvb += logit_bytes;
}

/* QK over `n` keys of every KV head with fp32 logits of every query head
 * written (a dense pass that exposes its scores), then the scores pooled
 * over each GQA group and a top-k over them: what an exact top-k needs. */
static void add_exact_topk(const sfi_cost_setup *s, acc *a, double n)
{
    const int B = s->batch, hd = s->model->head_dim;
    const double hq = q_heads(s), hkv = kv_heads(s), key_b = kv_pos_bytes(s) / 2;
    add_dense_logits(s, a, B * n * key_b, B * hq * n * 4.0, B * 2.0 * hq * hd * n);
    /* softmax + group pooling: logits in, pooled scores out; top-k reads them */
    add_kernel(s, a, SFI_KC_OTHER, B * (hq * n * 4.0 + hkv * n * 4.0), B * 4.0 * hq * n, 1);
    add_kernel(s, a, SFI_KC_TOPK, B * TOPK_PASSES * hkv * n * 4.0, 0, 1);
}

/* With prof.cta_bandwidth: the time of the slowest CTA of an attention
 * launch over requests of `rows` rows each (sfi-gpu's split rule; per_row:
 * K/V bytes per row and KV head), and the launch's roofline body time. */
static void attn_cta(const sfi_cost_setup *s, acc *a, double rows, double per_row, double body,
                     int sparse)
{
    if (!(s->prof.cta_bandwidth > 0))
        return;
    /* FLOPs a CTA spends on a row: QK and PV of the group's query heads */
    const double fl_row = 4.0 * q_heads(s) / kv_heads(s) * s->model->head_dim;
    double r;
    if (s->attn_split_rows > 0) {
        int cap = sparse && s->attn_fast_split_rows > 0 ? s->attn_fast_split_rows
                                                        : s->attn_split_rows;
        r = rows < cap ? rows : cap;
    } else {
        double pairs = (double)s->batch * kv_heads(s);
        double splits = floor(s->gpu.sm_count / pairs), lim = floor(s->context / 1024.0);
        if (splits > lim)
            splits = lim;
        if (splits < 1)
            splits = 1;
        r = ceil(rows / splits);
    }
    a->attn_body += body;
    double t = r * per_row / s->prof.cta_bandwidth;
    if (s->prof.cta_flops > 0 && r * fl_row / s->prof.cta_flops > t)
        t = r * fl_row / s->prof.cta_flops;
    if (t > a->cta_s)
        a->cta_s = t;
}

/* Attention (main stream) of one layer for the whole batch, by policy, at
 * the budget of B positions per KV head (the layouts are in sfi-sim(1),
 * COST MODEL). */
static void attention_layer(const sfi_cost_setup *s, int layer, int n_slow, acc *a)
{
    const int B = s->batch, L = s->context, hd = s->model->head_dim;
    const double hq = q_heads(s), hkv = kv_heads(s), pos_b = kv_pos_bytes(s);
    const double dense_b = sfi_cost_kv_bytes_dense(s);
    /* QK^T and PV: 2 FLOPs per multiply-add, 2 products per position. */
    const double fl_pos = 4.0 * hq * hd;
    const double P = sfi_cost_budget(s);
    const sfi_policy_config *c = &s->pol;
    switch (s->kind) {
    case SFI_POLICY_FULL:
        add_kernel(s, a, SFI_KC_ATTN_DENSE, B * dense_b, B * fl_pos * L, 1);
        attn_cta(s, a, L, pos_b / hkv,
                 roofline_x(s, SFI_KC_ATTN_DENSE, B * dense_b, B * fl_pos * L, 1), 0);
        break;
    case SFI_POLICY_SFI:
    case SFI_POLICY_TMAX:
    case SFI_POLICY_INTERVAL:
    case SFI_POLICY_BOUNDARY: {
        int n_fast = B - n_slow;
        if (n_slow > 0) { /* dense, writing fp32 logits over J for the Selector */
            double lb = n_slow * hq * n_candidates(s) * 4.0;
            add_dense_logits(s, a, n_slow * dense_b, lb, n_slow * fl_pos * L);
            attn_cta(s, a, L, pos_b / hkv + hq / hkv * 4.0,
                     roofline_x(s, SFI_KC_ATTN_DENSE, n_slow * dense_b, n_slow * fl_pos * L, 0) +
                         logits_time(s, lb),
                     0);
        }
        if (n_fast > 0) {
            int F = sfi_cost_fast_positions(s);
            add_kernel(s, a, SFI_KC_ATTN_SPARSE, n_fast * F * pos_b, n_fast * fl_pos * F, 1);
            attn_cta(s, a, F, pos_b / hkv,
                     roofline_x(s, SFI_KC_ATTN_SPARSE, n_fast * F * pos_b, n_fast * fl_pos * F, 1),
                     1);
        }
        break;
    }
    case SFI_POLICY_ORACLE:
        add_exact_topk(s, a, L);
        add_kernel(s, a, SFI_KC_ATTN_SPARSE, B * P * pos_b, B * fl_pos * P, 1);
        break;
    case SFI_POLICY_STREAMING:
        /* the cache holds only sink + window: one contiguous read */
        add_kernel(s, a, SFI_KC_ATTN_DENSE, B * P * pos_b, B * fl_pos * P, 1);
        break;
    case SFI_POLICY_H2O:
        /* The evicting cache holds B positions; its attention must write
         * the probabilities (not a fused kernel's habit) to accumulate
         * them into the scores (read + write), then the eviction scan. */
        add_kernel(s, a, SFI_KC_ATTN_DENSE, B * P * pos_b, B * fl_pos * P, 1);
        a->t += logits_time(s, B * hq * P * 4.0);
        a->bytes += B * hq * P * 4.0;
        a->kvb += B * hq * P * 4.0;
        add_kernel(s, a, SFI_KC_OTHER, B * (hq * P * 4.0 + 3.0 * hkv * P * 4.0),
                   B * 2.0 * hq * P, 1);
        break;
    case SFI_POLICY_SNAPKV:
        /* compressed once at prefill: the cache is the kept B positions */
        add_kernel(s, a, SFI_KC_ATTN_DENSE, B * P * pos_b, B * fl_pos * P, 1);
        break;
    case SFI_POLICY_QUEST: {
        if (layer < c->quest_dense_layers) {
            add_kernel(s, a, SFI_KC_ATTN_DENSE, B * dense_b, B * fl_pos * L, 1);
            break;
        }
        /* Per page: elementwise min and max of its keys (2 vectors). */
        double pages = ceil((double)L / c->quest_page);
        double sel = floor(P / c->quest_page) * c->quest_page;
        if (sel < c->quest_page)
            sel = c->quest_page;
        if (sel > L)
            sel = L;
        add_kernel(s, a, SFI_KC_OTHER, B * pages * 2.0 * hkv * hd * s->kv_bytes,
                   B * pages * 2.0 * 2.0 * hq * hd, 1);
        add_kernel(s, a, SFI_KC_TOPK, B * TOPK_PASSES * hkv * pages * 4.0, 0, 1);
        add_kernel(s, a, SFI_KC_ATTN_SPARSE, B * sel * pos_b, B * fl_pos * sel, 1);
        break;
    }
    case SFI_POLICY_LFPS: {
        /* Two fp32 tables per KV head over the context: one pass for mean
         * and kurtosis, one thresholding into candidates (the decay is a
         * running factor); the sink-share prior reads the d x d key
         * covariance; exact QK over the candidates (keys only), top-k,
         * then attention over min(B, candidates) that also writes the
         * weights the table update adds. */
        double cand = ceil(sfi_policy_lfps_cand_share(c, L) * L) + c->lfps_keep;
        if (cand > L)
            cand = L;
        double fin = P < cand ? P : cand;
        add_kernel(s, a, SFI_KC_OTHER, B * hkv * (2.0 * 2.0 * L * 4.0 + hd * hd * 8.0),
                   B * hkv * 2.0 * 6.0 * L, 1);
        add_kernel(s, a, SFI_KC_ATTN_SPARSE, B * cand * pos_b / 2, B * fl_pos / 2 * cand, 1);
        add_kernel(s, a, SFI_KC_TOPK, B * TOPK_PASSES * hkv * cand * 4.0, 0, 1);
        add_kernel(s, a, SFI_KC_ATTN_SPARSE, B * fin * pos_b, B * fl_pos * fin, 1);
        a->t += logits_time(s, B * hq * fin * 4.0);
        a->bytes += B * hq * fin * 4.0 + B * hkv * fin * 2.0 * 8.0;
        a->kvb += B * hq * fin * 4.0 + B * hkv * fin * 2.0 * 8.0;
        break;
    }
    case SFI_POLICY_KASCADE: {
        /* Layer 0 dense; anchor layers 1..A an exact top-k (any A layers
         * cost the same); every other layer reads its anchor's indices. */
        int A = sfi_policy_kascade_anchors(c, s->model->num_hidden_layers);
        if (layer == 0) {
            add_kernel(s, a, SFI_KC_ATTN_DENSE, B * dense_b, B * fl_pos * L, 1);
            break;
        }
        if (layer <= A)
            add_exact_topk(s, a, L);
        add_kernel(s, a, SFI_KC_ATTN_SPARSE, B * P * (pos_b + hkv * 4.0), B * fl_pos * P, 1);
        break;
    }
    case SFI_POLICY_FASA: {
        /* The cache is token-major (a row per position), so scoring on
         * N_tip chunks reads a compact copy of those 2 N_tip dims of every
         * key, kept per KV head (charged in memory); scores out, top-k,
         * then attention over the top B. */
        double tip = sfi_policy_fasa_tip(c, hd);
        double copy_b = B * (double)L * hkv * 2.0 * tip * s->kv_bytes;
        add_kernel(s, a, SFI_KC_ATTN_DENSE, copy_b + B * hkv * L * 4.0,
                   B * 2.0 * 2.0 * tip * hq * L, 1);
        add_kernel(s, a, SFI_KC_TOPK, B * TOPK_PASSES * hkv * L * 4.0, 0, 1);
        add_kernel(s, a, SFI_KC_ATTN_SPARSE, B * P * pos_b, B * fl_pos * P, 1);
        break;
    }
    default:
        break;
    }
}

/* The layer index matters to attention_layer only through this key (the
 * step prices one layer per key change and reuses it for the following
 * layers): keep it in step with attention_layer and side_layer. */
static int attention_layer_key(const sfi_cost_setup *s, int layer)
{
    if (s->kind == SFI_POLICY_KASCADE)
        return layer == 0 ? 2
                          : layer <= sfi_policy_kascade_anchors(&s->pol, s->model->num_hidden_layers);
    if (s->kind == SFI_POLICY_QUEST)
        return layer < s->pol.quest_dense_layers;
    return 0;
}

/* Side stream of one layer on a slow step: Selector, Top-K, reorg of the
 * n_slow requests that took the slow step, over `window` queries each
 * (1 at a decode step, PREFILL_WINDOW at the end of a prefill). */
static void side_layer(const sfi_cost_setup *s, int n_slow, int window, acc *a)
{
    const double J = n_candidates(s), hq = q_heads(s), hkv = kv_heads(s);
    /* Reads the fp32 logits of the G query heads of each KV head and the
     * key norms once; the fused kernel keeps its intermediates on chip
     * (the byte count the GPU benchmark calibrates against). */
    double sel_b = n_slow * (window * hq * J * 4.0 + hkv * J * 4.0);
    double sel_f = n_slow * 30.0 * window * hq * J;
    for (int k = 0; k < SELECTOR_LAUNCHES; k++) {
        add_kernel(s, a, SFI_KC_SELECTOR, sel_b / SELECTOR_LAUNCHES, sel_f / SELECTOR_LAUNCHES, 1);
        if (k == 0)
            a->t_pre = a->t;
    }
    const sfi_params p = sfi_prm(s);
    double K = p.K < J ? p.K : J;
    add_kernel(s, a, SFI_KC_TOPK, n_slow * (TOPK_PASSES * hkv * J * 4.0 + hkv * K * 4.0), 0, 1);
    /* Copy sink + selected K/V into the compact buffer: read + write. */
    add_kernel(s, a, SFI_KC_REORG, n_slow * 2.0 * (p.n_sink + K) * kv_pos_bytes(s), 0, 1);
}

sfi_status sfi_cost_kernel_predict(const sfi_cost_setup *s, const char *kernel, double *time_s,
                                   sfi_error *err)
{
    sfi_status st = sfi_cost_validate(s, err);
    if (st)
        return st;
    const int B = s->batch, L = s->context, hd = s->model->head_dim;
    const double hq = q_heads(s), pos_b = kv_pos_bytes(s), fl_pos = 4.0 * hq * hd;
    acc a = {0};
    if (!strcmp(kernel, "attn_dense_nologits")) {
        add_kernel(s, &a, SFI_KC_ATTN_DENSE, B * sfi_cost_kv_bytes_dense(s), B * fl_pos * L, 1);
    } else if (!strcmp(kernel, "attn_dense")) {
        add_dense_logits(s, &a, B * sfi_cost_kv_bytes_dense(s), B * hq * n_candidates(s) * 4.0,
                         B * fl_pos * L);
    } else if (!strcmp(kernel, "attn_sparse")) {
        /* The measurement's context is the number of positions read. */
        add_kernel(s, &a, SFI_KC_ATTN_SPARSE, B * (double)L * pos_b, B * fl_pos * L, 1);
    } else if (!strcmp(kernel, "selector") || !strcmp(kernel, "topk") ||
               !strcmp(kernel, "reorg") || !strcmp(kernel, "selector_reorg")) {
        acc sd = {0};
        side_layer(s, B, 1, &sd);
        /* side_layer launches SELECTOR_LAUNCHES selector kernels, then
         * Top-K, then reorg: take the requested part. */
        acc only = {0};
        const double J = n_candidates(s), hkv = kv_heads(s);
        const sfi_params p = sfi_prm(s);
        double K = p.K < J ? p.K : J;
        if (!strcmp(kernel, "selector")) {
            double sel_b = B * (hq * J * 4.0 + hkv * J * 4.0), sel_f = B * 30.0 * hq * J;
            for (int k = 0; k < SELECTOR_LAUNCHES; k++)
                add_kernel(s, &only, SFI_KC_SELECTOR, sel_b / SELECTOR_LAUNCHES,
                           sel_f / SELECTOR_LAUNCHES, 1);
        } else if (!strcmp(kernel, "topk")) {
            add_kernel(s, &only, SFI_KC_TOPK, B * (TOPK_PASSES * hkv * J * 4.0 + hkv * K * 4.0), 0, 1);
        } else if (!strcmp(kernel, "reorg")) {
            add_kernel(s, &only, SFI_KC_REORG, B * 2.0 * (p.n_sink + K) * pos_b, 0, 1);
        } else {
            only = sd;
        }
        a = only;
    } else {
        return sfi_error_set(err, SFI_ENOTFOUND, "kernel '%s' is not modelled", kernel);
    }
    *time_s = a.t;
    return SFI_OK;
}

sfi_status sfi_cost_pipeline_predict(const sfi_cost_setup *s, const char *kind, int layers,
                                     double *time_s, sfi_error *err)
{
    if (layers < 1 || layers > 100000)
        return sfi_error_set(err, SFI_ERANGE, "layers %d outside 1..100000", layers);
    double attn, side;
    sfi_status st = sfi_cost_kernel_predict(s, "attn_dense", &attn, err);
    if (!st)
        st = sfi_cost_kernel_predict(s, "selector_reorg", &side, err);
    if (st)
        return st;
    if (!strcmp(kind, "attn_layers")) {
        *time_s = layers * attn;
    } else if (!strcmp(kind, "slow_step_serial")) {
        *time_s = layers * (attn + side);
    } else if (!strcmp(kind, "slow_step_overlap")) {
        /* Same rule as sfi_cost_step: side work of layer i starts after
         * its attention and the previous side work; the end waits for
         * both; hidden side time costs overlap_contention of itself. */
        double t_main = 0, t_side = 0;
        for (int l = 0; l < layers; l++) {
            t_main += attn;
            t_side = (t_side > t_main ? t_side : t_main) + side;
        }
        double exposed = t_side > t_main ? t_side - t_main : 0;
        double hidden = layers * side - exposed;
        *time_s = t_main + exposed + s->prof.overlap_contention * (hidden > 0 ? hidden : 0);
    } else {
        return sfi_error_set(err, SFI_ENOTFOUND, "'%s' is not modelled", kind);
    }
    return SFI_OK;
}

/* KV cache, compact buffers and policy tables one request holds on one
 * GPU at the setup's context. */
static double request_bytes(const sfi_cost_setup *s)
{
    const sfi_model_config *m = s->model;
    const double L = s->context, layers = m->num_hidden_layers, pos_b = kv_pos_bytes(s);
    const double J = n_candidates(s), hq = q_heads(s), hkv = kv_heads(s), hd = m->head_dim;
    const double P = sfi_cost_budget(s);
    const sfi_policy_config *c = &s->pol;
    double kv = layers * L * pos_b;
    switch (s->kind) {
    case SFI_POLICY_STREAMING: /* evicting: only sink + window stay */
    case SFI_POLICY_SNAPKV:    /* compressed at prefill to the budget */
        kv = layers * P * pos_b;
        break;
    case SFI_POLICY_H2O:       /* evicting, plus a score per kept position */
        kv = layers * P * (pos_b + hkv * 4.0);
        break;
    case SFI_POLICY_SFI:
    case SFI_POLICY_TMAX:
    case SFI_POLICY_INTERVAL:
    case SFI_POLICY_BOUNDARY: {
        /* The full cache stays (slow steps are dense), plus the compact
         * sink + selected buffer of every layer and the ring of Selector
         * scratch (logits over J and two score arrays per slot). */
        const sfi_params p = sfi_prm(s);
        double K = p.K < J ? p.K : J;
        kv += layers * (p.n_sink + K) * pos_b;
        kv += SCRATCH_RING * (hq * J * 4.0 + 2.0 * hkv * J * 4.0);
        break;
    }
    case SFI_POLICY_QUEST: /* page min/max metadata */
        kv += layers * ceil(L / c->quest_page) * 2.0 * hkv * hd * s->kv_bytes;
        break;
    case SFI_POLICY_LFPS: /* two fp32 tables and the key statistics per KV head */
        kv += layers * hkv * (2.0 * L * 4.0 + hd * hd * 8.0 + hd * 8.0);
        break;
    case SFI_POLICY_FASA: /* the compact copy of the dominant dims */
        kv += layers * L * hkv * 2.0 * sfi_policy_fasa_tip(c, m->head_dim) * s->kv_bytes;
        break;
    case SFI_POLICY_KASCADE: /* anchor indices, per anchor layer */
        kv += sfi_policy_kascade_anchors(c, m->num_hidden_layers) * hkv * P * 4.0;
        break;
    default:
        break;
    }
    return kv;
}

/* Causal attention of a prefill chunk of n_new queries ending at the
 * setup's context, for the setup's batch: every query attends to the
 * positions before the chunk and to the chunk up to itself. The KV is read
 * once (query tiles share it through L2), the chunk's K/V written, Q read
 * and O written; FLOP-bound beyond short chunks. */
static void prefill_attention(const sfi_cost_setup *s, int n_new, acc *a)
{
    const double B = s->batch, L = s->context, q = n_new, hq = q_heads(s);
    const double hd = s->model->head_dim, pos_b = kv_pos_bytes(s);
    double attended = q * (L - q) + q * (q + 1) / 2;
    double bytes = B * ((L + q) * pos_b + 2.0 * q * hq * hd * 2.0);
    add_kernel(s, a, SFI_KC_ATTN_PREFILL, bytes, B * 4.0 * hq * hd * attended, 1);
}

/* Attention (main stream) and side-stream work of one layer for all groups
 * of a step, kernels of the groups merged into shared launches. */
static void attention_groups(const sfi_cost_setup *s, int layer, const sfi_cost_group *g, int n,
                             acc *a, acc *side)
{
    const int has_slow = sfi_policy_has_slow_steps(s->kind);
    sfi_cost_setup gs = *s;
    merge_state ma, ms;
    memset(&ma, 0, sizeof ma);
    memset(&ms, 0, sizeof ms);
    memset(a, 0, sizeof *a);
    memset(side, 0, sizeof *side);
    a->merge = &ma;
    side->merge = &ms;
    for (int i = 0; i < n; i++) {
        gs.context = g[i].context;
        gs.batch = g[i].count;
        memset(a->occ, 0, sizeof a->occ);
        memset(side->occ, 0, sizeof side->occ);
        if (!g[i].prefill) {
            int ns = has_slow && g[i].slow ? g[i].count : 0;
            attention_layer(&gs, layer, ns, a);
            if (ns && !s->no_selector)
                side_layer(&gs, ns, 1, side);
        } else {
            prefill_attention(&gs, g[i].n_new, a);
            if (has_slow && g[i].last_chunk) {
                /* The prompt's last queries expose their logits over J and
                 * the Selector initializes the selected sets. */
                double w = g[i].n_new < PREFILL_WINDOW ? g[i].n_new : PREFILL_WINDOW;
                double lb = gs.batch * w * q_heads(&gs) * n_candidates(&gs) * 4.0;
                a->t += logits_time(&gs, lb);
                a->bytes += lb;
                a->kvb += lb;
                side_layer(&gs, g[i].count, (int)w, side);
            }
        }
    }
    a->merge = NULL;
    side->merge = NULL;
    /* a launch of few CTAs (or slow ones): its slowest CTA */
    if (a->cta_s > a->attn_body)
        a->t += a->cta_s - a->attn_body;
}

static void acc_add(acc *to, const acc *a)
{
    to->t += a->t;
    to->bytes += a->bytes;
    to->kvb += a->kvb;
    to->wb += a->wb;
    to->flops += a->flops;
    to->launches += a->launches;
}

/* The step of sfi_cost_step_mix on checked input. */
static void step_groups(const sfi_cost_setup *s, const sfi_cost_group *g, int n, sfi_step_cost *out)
{
    const sfi_model_config *m = s->model;
    const double d = m->hidden_size;
    /* Tokens through the GEMMs, requests, tokens sampled. */
    double T = 0, R = 0, n_out = 0, n_sel = 0;
    int any_slow = 0;
    for (int i = 0; i < n; i++) {
        T += (double)g[i].count * g[i].n_new;
        R += g[i].count;
        if (!g[i].prefill || g[i].last_chunk)
            n_out += g[i].count;
        const int sel = g[i].prefill ? g[i].last_chunk : g[i].slow;
        any_slow |= sel;
        if (sel)
            n_sel += g[i].count;
    }
    any_slow &= sfi_policy_has_slow_steps(s->kind);
    const int Ti = T > 2e9 ? 2000000000 : (int)T;
    memset(out, 0, sizeof *out);

    acc main = {0}, side_total = {0}, attn = {0}, side = {0};
    double t_main = 0, t_side = 0, comm = 0, serial_side = 0;
    const int has_side = sfi_policy_has_slow_steps(s->kind);
    int key = -1;
    for (int l = 0; l < m->num_hidden_layers; l++) {
        acc a = {0};
        if (attention_layer_key(s, l) != key) {
            key = attention_layer_key(s, l);
            attention_groups(s, l, g, n, &attn, &side);
        }
        /* experts read: the distinct ones the batch touches, or (an engine
         * without deduplication) one read per (token, expert) pair */
        const double ex = !layer_is_moe(m, l) ? 0
                          : s->moe_pair_reads
                              ? T * m->num_experts_per_tok
                              : sfi_cost_expected_experts(m->num_experts, m->num_experts_per_tok, Ti);
        /* QKV GEMM then attention, O GEMM, MLP. */
        double hd = m->head_dim;
        double qkv = d * hd * ((double)m->num_attention_heads / s->tp + 2.0 * kv_heads(s));
        add_kernel(s, &a, SFI_KC_GEMM, qkv * s->weight_bytes, 2.0 * T * qkv, 0);
        a.t += gemm_fixed(s, qkv / d, d, T);
        a.wb += qkv * s->weight_bytes;
        acc_add(&a, &attn);
        double t_after_attn = t_main + a.t;
        double o = d * hd * m->num_attention_heads / s->tp;
        add_kernel(s, &a, SFI_KC_GEMM, o * s->weight_bytes, 2.0 * T * o, 0);
        a.t += gemm_fixed(s, d, o / d, T);
        a.wb += o * s->weight_bytes;
        double mlp = mlp_weight_elems(s, l, ex);
        double mlp_active = layer_is_moe(m, l)
                                ? d * m->num_experts +
                                      m->num_experts_per_tok * 3.0 * d * m->moe_intermediate_size / s->tp
                                : mlp;
        add_kernel(s, &a, SFI_KC_GEMM, mlp * s->weight_bytes, 2.0 * T * mlp_active, 0);
        a.wb += mlp * s->weight_bytes;
        /* a dense MLP is two products (gate/up, then down; the down one's
         * launch is among the small kernels below); an MoE layer's router
         * is a cuBLAS f32 product and its experts per-pair GEMVs (streamed
         * below), none of them a decode GEMM */
        if (!layer_is_moe(m, l)) {
            double inter = (double)m->intermediate_size / s->tp;
            a.t += gemm_fixed(s, 2.0 * inter, d, T) + gemm_fixed(s, d, inter, T);
        }
        if (layer_is_moe(m, l) &&
            (s->prof.moe_efficiency > 0 || s->prof.moe_pair_bandwidth > 0 || s->moe_stream)) {
            /* Expert kernels of their own (sfi-gpu's per-pair GEMV): the
             * experts' bytes at moe_efficiency (or, streamed like the dense
             * attention's K/V, at its efficiency) instead of the GEMMs',
             * and no faster than one (token, expert) pair's expert
             * streamed at moe_pair_bandwidth (all pairs run side by
             * side). */
            double eb = ex * 3.0 * d * m->moe_intermediate_size / s->tp * s->weight_bytes;
            double e_g = s->prof.efficiency[SFI_KC_GEMM];
            double e_m = s->prof.moe_efficiency > 0 ? s->prof.moe_efficiency
                         : s->moe_stream           ? s->prof.efficiency[SFI_KC_ATTN_DENSE]
                                                   : e_g;
            double t_m = eb / (s->gpu.hbm_bandwidth * e_m);
            double pair_b = 3.0 * d * m->moe_intermediate_size / s->tp * s->weight_bytes;
            if (s->prof.moe_pair_bandwidth > 0 && pair_b / s->prof.moe_pair_bandwidth > t_m)
                t_m = pair_b / s->prof.moe_pair_bandwidth;
            a.t += t_m - eb / (s->gpu.hbm_bandwidth * e_g);
        }
        /* MoE routing by one thread per token (tokens side by side): its
         * dependent steps one after another */
        if (layer_is_moe(m, l))
            a.t += s->moe_route_steps * s->prof.serial_step_s;
        /* The fused small kernels: norms, RoPE, residual adds (activations
         * only; their bytes are noise next to weights and KV). */
        int small = (layer_is_moe(m, l) ? (s->moe_launches > 0 ? s->moe_launches : MAIN_LAUNCHES_MOE)
                                        : MAIN_LAUNCHES_DENSE) -
                    3;
        double act = 6.0 * T * d * 2;
        a.t += small * s->prof.launch_s + act / (s->gpu.hbm_bandwidth * s->prof.efficiency[SFI_KC_OTHER]);
        a.bytes += act;
        a.launches += small;
        if (s->tp > 1) { /* after O projection and after the MLP */
            double ar = 2 * (sfi_cost_allreduce_time(
                                     s, T * d * (s->allreduce_bytes > 0 ? s->allreduce_bytes : 2)) +
                             s->prof.allreduce_step_s);
            a.t += ar;
            comm += ar;
            a.launches += 2;
        }
        double ga = sel_gather_bytes(s, s->sel_split_gather ? sel_gather_slots(n_sel, R) : R);
        if (ga > 0 && (!s->sel_split_gather || any_slow)) {
            /* the Selector's scores: at the graph's capacity (fast
             * requests' rows too) in every step, or (sel_split_gather) in
             * a step with slow requests, theirs (sel_gather_slots), after
             * this layer's MLP and once the side stream's steps 1-7 wrote
             * them */
            if (s->sel_split_gather && !s->side_serial) {
                double pre_end = (t_side > t_after_attn ? t_side : t_after_attn) + side.t_pre;
                if (s->prof.sel_pre_s > 0) /* in line after the MLP (sfi_hw.h) */
                    pre_end = t_main + a.t + side.t_pre + s->prof.sel_pre_s;
                if (pre_end > t_main + a.t)
                    a.t = pre_end - t_main;
            }
            double tg = sfi_cost_allgather_time(s, ga);
            a.t += tg;
            comm += tg;
            a.launches += 1;
        }
        if (s->side_serial && has_side) {
            /* the side work on the main stream: a slow step's whole, a fast
             * step's launches of kernels that exit at once */
            double ts = any_slow ? side.t : SIDE_LAUNCHES * s->prof.launch_s;
            a.t += ts;
            serial_side += ts;
            a.launches += any_slow ? side.launches : SIDE_LAUNCHES;
        }
        t_main += a.t;
        acc_add(&main, &a);
        if (any_slow && !s->side_serial) {
            /* Starts once this layer's attention wrote the logits and the
             * previous layer's side work is done; with sel_split_gather
             * steps 8 and on wait for the main stream's all-gather. */
            double start = t_side > t_after_attn ? t_side : t_after_attn;
            t_side = start + side.t;
            if (ga > 0 && s->sel_split_gather)
                t_side = t_main + side.t - side.t_pre;
            acc_add(&side_total, &side);
        } else if (any_slow) {
            side_total.t += side.t;
            side_total.bytes += side.bytes;
            side_total.flops += side.flops;
        }
    }
    /* Final norm, LM head and sampling of the tokens sampled this step
     * (a prefill chunk samples only after the prompt's last token). */
    acc tail = {0};
    if (n_out > 0) {
        double lm = (double)m->vocab_size * d / s->tp;
        add_kernel(s, &tail, SFI_KC_GEMM, lm * s->weight_bytes, 2.0 * n_out * lm, 0);
        tail.t += gemm_fixed(s, lm / d, d, n_out);
        tail.wb += lm * s->weight_bytes;
        add_kernel(s, &tail, SFI_KC_OTHER, n_out * (double)m->vocab_size * 4.0, 0, 0);
        if (s->tp > 1 && s->argmax_gather) {
            /* each GPU's best (value, id) of its vocabulary rows gathered,
             * then the best of those (one more launch) */
            double tg = sfi_cost_allgather_time(s, 8.0 * n_out);
            tail.t += tg + s->prof.launch_s;
            comm += tg;
            tail.launches += 2;
        }
    }
    t_main += tail.t;

    /* On the main stream (side_serial) the side work is in t_main already. */
    double exposed = 0;
    if (any_slow && !s->side_serial) {
        /* The barrier at the end of the slow step waits for the side
         * stream; overlapped side work still costs main-stream bandwidth. */
        exposed = t_side > t_main ? t_side - t_main : 0;
        double hidden = side_total.t - exposed;
        exposed += s->prof.overlap_contention * (hidden > 0 ? hidden : 0);
    }
    out->time_s = t_main + exposed + s->prof.step_overhead_s + R * s->prof.request_overhead_s;
    if (s->side_serial)
        exposed = serial_side;
    out->hbm_bytes = main.bytes + tail.bytes + side_total.bytes;
    out->kv_bytes = main.kvb + side_total.bytes;
    out->weight_bytes = main.wb + tail.wb;
    out->flops = main.flops + tail.flops + side_total.flops;
    out->side_s = s->side_serial ? serial_side : side_total.t;
    out->exposed_s = exposed;
    out->comm_s = comm;
    out->launches = main.launches + tail.launches + (s->side_serial ? 0 : side_total.launches);
}

sfi_status sfi_cost_step(const sfi_cost_setup *s, int n_slow, sfi_step_cost *out, sfi_error *err)
{
    sfi_status st = sfi_cost_validate(s, err);
    if (st)
        return st;
    if (!sfi_policy_has_slow_steps(s->kind))
        n_slow = 0;
    if (n_slow < 0 || n_slow > s->batch)
        return sfi_error_set(err, SFI_EINVAL, "n_slow %d outside 0..%d", n_slow, s->batch);
    sfi_cost_group g[2];
    int n = 0;
    if (n_slow > 0)
        g[n++] = (sfi_cost_group){.context = s->context, .n_new = 1, .count = n_slow, .slow = 1};
    if (s->batch - n_slow > 0)
        g[n++] = (sfi_cost_group){.context = s->context, .n_new = 1, .count = s->batch - n_slow};
    step_groups(s, g, n, out);
    return SFI_OK;
}

/* The shape checks of sfi_cost_validate without its context ones: each
 * group of a mixed step has its own context. */
static sfi_status validate_shape(const sfi_cost_setup *s, sfi_error *err)
{
    sfi_cost_setup v = *s;
    v.context = v.pol.prm.K;
    if (v.budget.positions > v.context)
        v.context = v.budget.positions;
    if (v.context < 1)
        v.context = 1;
    v.batch = 1;
    return sfi_cost_validate(&v, err);
}

sfi_status sfi_cost_step_mix(const sfi_cost_setup *s, const sfi_cost_group *g, int n,
                             sfi_step_cost *out, sfi_error *err)
{
    sfi_status st = validate_shape(s, err);
    if (st)
        return st;
    if (n < 1 || !g)
        return sfi_error_set(err, SFI_EINVAL, "a step needs at least one request group");
    double total = 0;
    for (int i = 0; i < n; i++) {
        if (g[i].context < 1 || g[i].context > (1 << 30))
            return sfi_error_set(err, SFI_ERANGE, "group %d: context %d outside 1..2^30", i,
                                 g[i].context);
        if (g[i].n_new < 1 || g[i].n_new > g[i].context || (!g[i].prefill && g[i].n_new != 1))
            return sfi_error_set(err, SFI_ERANGE,
                                 "group %d: %d new tokens (a decode step has 1, a prefill chunk "
                                 "1..context %d)",
                                 i, g[i].n_new, g[i].context);
        if (g[i].count < 1)
            return sfi_error_set(err, SFI_ERANGE, "group %d: count %d < 1", i, g[i].count);
        total += g[i].count;
    }
    if (total > (1 << 20))
        return sfi_error_set(err, SFI_ERANGE, "step of %.0f requests: more than 2^20", total);
    step_groups(s, g, n, out);
    return SFI_OK;
}

double sfi_cost_request_bytes(const sfi_cost_setup *s)
{
    return request_bytes(s);
}

sfi_status sfi_cost_memory_of(const sfi_cost_setup *s, sfi_cost_memory *mem, sfi_error *err)
{
    sfi_status st = sfi_cost_validate(s, err);
    if (st)
        return st;
    const sfi_model_config *m = s->model;
    memset(mem, 0, sizeof *mem);
    double w = 0;
    for (int l = 0; l < m->num_hidden_layers; l++)
        w += attn_weight_elems(s) + mlp_weight_elems(s, l, layer_is_moe(m, l) ? m->num_experts : 0);
    double emb = (double)m->vocab_size * m->hidden_size / s->tp;
    w += m->tie_word_embeddings ? emb : 2 * emb;
    mem->weights = w * s->weight_bytes;

    double kv = request_bytes(s);
    mem->kv_per_request = kv;
    mem->scratch = 0;
    mem->usable = s->gpu.hbm_capacity * SFI_COST_USABLE_HBM;
    double room = mem->usable - mem->weights - mem->scratch;
    double mb = room > 0 ? floor(room / kv) : 0;
    mem->max_batch = mb > 1e9 ? 1000000000 : (int)mb;
    return SFI_OK;
}
