/* Model description from a Hugging Face config.json (Qwen3 dense "qwen3" and
 * MoE "qwen3_moe"), validated, plus compiled-in presets of the Qwen3 family. */
#ifndef SFI_MODEL_H
#define SFI_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "sfi_error.h"

#define SFI_MODEL_NAME_MAX 64
#define SFI_MODEL_MAX_LAYERS 1024
/* End-of-sequence ids a config may list (Qwen3 chat models list 2). */
#define SFI_MODEL_MAX_EOS 16

typedef enum { SFI_ARCH_QWEN3 = 0, SFI_ARCH_QWEN3_MOE = 1 } sfi_arch;

typedef struct {
    char name[SFI_MODEL_NAME_MAX]; /* preset name or the config's path */
    sfi_arch arch;
    int vocab_size;
    int hidden_size;
    int intermediate_size; /* dense MLP width */
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;
    int max_position_embeddings;
    double rope_theta; /* also read from rope_parameters */
    double rms_norm_eps;
    int tie_word_embeddings;
    int attention_bias;
    int bos_token_id; /* -1 when absent */
    int eos_token_id; /* -1 when absent; the first of eos_token_ids */
    int n_eos;        /* entries of eos_token_ids (a list in chat models) */
    int eos_token_ids[SFI_MODEL_MAX_EOS];
    int weight_bytes; /* bytes per weight of torch_dtype/dtype: 2 or 4 */
    /* MoE (arch == SFI_ARCH_QWEN3_MOE); zero for dense models */
    int num_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int norm_topk_prob;
    int decoder_sparse_step;
    int n_mlp_only_layers;
    int mlp_only_layers[SFI_MODEL_MAX_LAYERS];
} sfi_model_config;

/* Parses config.json text; origin names it in messages. */
SFI_NODISCARD sfi_status sfi_model_config_parse(const char *json, size_t len, const char *origin,
                                                sfi_model_config *cfg, sfi_error *err);
/* Reads and parses a config.json file (or a directory holding one). */
SFI_NODISCARD sfi_status sfi_model_config_load(const char *path, sfi_model_config *cfg,
                                               sfi_error *err);
/* Checks shapes (heads divisible by KV heads, positive sizes, ...). */
SFI_NODISCARD sfi_status sfi_model_config_validate(const sfi_model_config *cfg, const char *origin,
                                                   sfi_error *err);

/* Built-in presets (compiled from ../shared/data/model-configs). Names as
 * "Qwen3-0.6B"; lookup is case-insensitive. */
size_t sfi_model_preset_count(void);
const char *sfi_model_preset_name(size_t i);
SFI_NODISCARD sfi_status sfi_model_preset(const char *name, sfi_model_config *cfg, sfi_error *err);
/* A preset name or a path to config.json / its directory. */
SFI_NODISCARD sfi_status sfi_model_resolve(const char *name_or_path, sfi_model_config *cfg,
                                           sfi_error *err);

/* 1 when layer l uses MoE experts, 0 when it uses the dense MLP. */
int sfi_model_layer_is_moe(const sfi_model_config *cfg, int layer);
/* KV cache bytes per token for all layers at the given bytes per element. */
uint64_t sfi_model_kv_bytes_per_token(const sfi_model_config *cfg, int bytes_per_elem);
/* Parameter count (embeddings included once when tied). */
uint64_t sfi_model_param_count(const sfi_model_config *cfg);

#endif
