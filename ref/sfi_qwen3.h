/* Qwen3 (dense and MoE) forward pass of the reference, one token at a time
 * over a float32 KV cache.
 *
 * Backends: SFI_BACKEND_SCALAR is deterministic (one documented order per
 * sum, ref/sfi_math.h, bit-exact across compilers and hosts);
 * SFI_BACKEND_BLAS does the matrix-vector products and dense attention
 * through OpenBLAS (only when built with SFI_HAVE_OPENBLAS): faster, not
 * bit-exact, checked against scalar to a tolerance. */
#ifndef SFI_QWEN3_H
#define SFI_QWEN3_H

#include <stddef.h>
#include <stdint.h>
#include "sfi_error.h"
#include "sfi_model.h"
#include "sfi_safetensors.h"

typedef enum { SFI_BACKEND_SCALAR = 0, SFI_BACKEND_BLAS = 1 } sfi_backend;

const char *sfi_backend_name(sfi_backend b);
/* "scalar" or "blas"; "blas" in a build without OpenBLAS is EUNSUPPORTED. */
SFI_NODISCARD sfi_status sfi_backend_parse(const char *s, sfi_backend *b, sfi_error *err);
int sfi_backend_available(sfi_backend b);

typedef struct sfi_qwen3 sfi_qwen3;

/* Loads DIR/config.json and DIR/model.safetensors (or the shards named by
 * DIR/model.safetensors.index.json). Every tensor's name, shape and dtype
 * is checked against the config; weights are widened to float32 exactly. */
SFI_NODISCARD sfi_status sfi_qwen3_load(const char *dir, sfi_qwen3 **out, sfi_error *err);
void sfi_qwen3_free(sfi_qwen3 *m);
const sfi_model_config *sfi_qwen3_config(const sfi_qwen3 *m);
/* Bytes of float32 weights held. */
uint64_t sfi_qwen3_weight_bytes(const sfi_qwen3 *m);

/* KV cache: k[layer][pos][kv_head][head_dim] (the layout of
 * ref/sfi_attention.h per layer), same for v. */
typedef struct {
    int n_layers, n_kv_heads, head_dim;
    int capacity; /* positions allocated */
    int n;        /* positions filled */
    float *k, *v;
    float *key_norms; /* [layer][kv_head][capacity] ||k||_2, for the Selector */
    float *scratch;   /* the forward pass's working vectors */
} sfi_kv_cache;

SFI_NODISCARD sfi_status sfi_kv_cache_init(sfi_kv_cache *c, const sfi_model_config *cfg,
                                           int capacity, sfi_error *err);
void sfi_kv_cache_free(sfi_kv_cache *c);
/* Copies src's first src->n positions (keys, values, key norms) into dst,
 * a cache of the same model shape with capacity >= src->n; dst->n becomes
 * src->n. Lets several runs start from one prefilled prompt. */
SFI_NODISCARD sfi_status sfi_kv_cache_copy(sfi_kv_cache *dst, const sfi_kv_cache *src,
                                           sfi_error *err);
/* Start of layer l's keys / values. */
float *sfi_kv_k(const sfi_kv_cache *c, int layer);
float *sfi_kv_v(const sfi_kv_cache *c, int layer);

/* How one layer's attention of the current token is done. The callback gets
 * the roped query [n_heads][head_dim] and the layer's cache holding n_ctx
 * positions (the current token's key/value included) and writes out
 * [n_heads][head_dim]. NULL: dense attention through the backend. */
typedef sfi_status (*sfi_qwen3_attend_fn)(void *user, int layer, const float *q,
                                          const sfi_kv_cache *kv, int n_ctx, float *out,
                                          sfi_error *err);

/* Runs token `token` at position kv->n (appending its key/value to the
 * cache, then n += 1). logits (may be NULL: skip the lm_head) gets
 * [vocab_size]. */
SFI_NODISCARD sfi_status sfi_qwen3_step(const sfi_qwen3 *m, sfi_backend be, sfi_kv_cache *kv,
                                        int32_t token, sfi_qwen3_attend_fn attend, void *user,
                                        float *logits, sfi_error *err);

/* Runs n prompt tokens at positions kv->n.. (blocks of up to 64 tokens:
 * the blas backend multiplies a block's matrices at once; with the scalar
 * backend the bits equal n single steps). attend is called for every token
 * and layer as in sfi_qwen3_step, with that token's n_ctx. logits (may be
 * NULL) gets the last token's. With the blas backend and no attend, a
 * block's attention is two matrix products per KV head for all its
 * tokens (causally masked). */
SFI_NODISCARD sfi_status sfi_qwen3_prefill(const sfi_qwen3 *m, sfi_backend be, sfi_kv_cache *kv,
                                           const int32_t *tokens, int n, sfi_qwen3_attend_fn attend,
                                           void *user, float *logits, sfi_error *err);

/* Told after each layer of a block of T tokens the residual stream before
 * (in) and after (out) the layer, each [T][hidden_size] (Kascade's layer
 * importance, 1 - cos(in, out)). Only reads. */
typedef void (*sfi_qwen3_layer_fn)(void *user, int layer, int T, const float *in, const float *out);

/* sfi_qwen3_prefill that also calls layer_fn (may be NULL). */
SFI_NODISCARD sfi_status sfi_qwen3_prefill_observed(const sfi_qwen3 *m, sfi_backend be,
                                                    sfi_kv_cache *kv, const int32_t *tokens, int n,
                                                    sfi_qwen3_attend_fn attend, void *user,
                                                    sfi_qwen3_layer_fn layer_fn, void *layer_user,
                                                    float *logits, sfi_error *err);

/* Dense decode attention through the backend (scalar: sfi_attn_dense_decode).
 * logits (may be NULL) as sfi_attn_dense_decode's. */
SFI_NODISCARD sfi_status sfi_qwen3_attn_dense(const sfi_qwen3 *m, sfi_backend be, int layer,
                                              const float *q, const sfi_kv_cache *kv, int n_ctx,
                                              float *out, float *logits, sfi_error *err);

/* Writes DIR/model.safetensors (weights of dtype F32 or BF16 drawn from
 * seed: uniform with std 1/sqrt(fan_in), norms 1 +- 0.2, embeddings of unit
 * scale when untied) and DIR/config.json for cfg; DIR is created when
 * absent. A DIR holding a checkpoint this function did not write (no
 * "generator" in its config.json, weights without a config, a sharded
 * index) is refused (EIO). Each file goes through a temp file + rename;
 * when the config cannot be written the checkpoint is removed again. */
SFI_NODISCARD sfi_status sfi_qwen3_write_random(const sfi_model_config *cfg, const char *dir,
                                                uint64_t seed, sfi_st_dtype dtype, sfi_error *err);

/* Sparse decode attention through the backend (scalar:
 * sfi_attn_sparse_decode; blas: the set's rows gathered, then the products
 * of the dense path). idx/n_idx per KV head as sfi_attn_sparse_decode's. */
SFI_NODISCARD sfi_status sfi_qwen3_attn_sparse(const sfi_qwen3 *m, sfi_backend be, int layer,
                                               const float *q, const sfi_kv_cache *kv, int n_ctx,
                                               const int32_t *const *idx, const int *n_idx,
                                               float *out, sfi_error *err);

/* Read-only views of the loaded weights for other back ends (the CUDA
 * engine uploads them): float32, row-major, the Hugging Face tensor's
 * shape. NULL for a tensor the model does not have (biases without
 * attention_bias, the dense MLP of a MoE layer, experts of a dense one).
 * expert is used by the SFI_W_E_* ids only. */
typedef enum {
    SFI_W_EMBED,
    SFI_W_LM_HEAD,
    SFI_W_FINAL_NORM,
    SFI_W_IN_NORM,
    SFI_W_POST_NORM,
    SFI_W_Q,
    SFI_W_K,
    SFI_W_V,
    SFI_W_O,
    SFI_W_BQ,
    SFI_W_BK,
    SFI_W_BV,
    SFI_W_BO,
    SFI_W_Q_NORM,
    SFI_W_K_NORM,
    SFI_W_GATE,
    SFI_W_UP,
    SFI_W_DOWN,
    SFI_W_ROUTER,
    SFI_W_E_GATE,
    SFI_W_E_UP,
    SFI_W_E_DOWN
} sfi_qwen3_wid;
const float *sfi_qwen3_weight(const sfi_qwen3 *m, sfi_qwen3_wid id, int layer, int expert);

/* The RoPE tables the forward pass uses for positions pos0..pos0+n-1:
 * cs/sn [n][head_dim/2] (the same bits on every host). */
void sfi_qwen3_rope_table(const sfi_model_config *c, int pos0, int n, float *cs, float *sn);

/* Greedy choice: the largest logit, ties to the smaller id. */
int32_t sfi_argmax(const float *logits, int n);

#endif
