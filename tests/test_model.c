/* Check suite of src/sfi_model.c: the real Qwen3 configs (compiled-in
 * presets and the repository's copies), Hugging Face field variants, and
 * malformed, truncated, wrong-typed and inconsistent configs.
 *
 * Built twice: tests/test_model (everything in the repository) and, with
 * SFI_TEST_SHARED_ONLY, tests/test_model_shared (the tokenizer directory's
 * config.json under $SFI_SHARED; exits 77 when that is absent). */
#include <config.h>

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_model.h"
#include "sfi_safetensors.h"
#include "sfi_test_util.h"

static sfi_model_config must_preset(const char *name)
{
    sfi_model_config c;
    sfi_error e;
    sfi_error_clear(&e);
    ck_assert_msg(sfi_model_preset(name, &c, &e) == SFI_OK, "%s: %s", name, e.msg);
    return c;
}

/* Fields two configs of the same model must share (name aside). */
static void assert_same_model(const sfi_model_config *a, const sfi_model_config *b)
{
    sfi_model_config x = *a, y = *b;
    memset(x.name, 0, sizeof x.name);
    memset(y.name, 0, sizeof y.name);
    ck_assert(!memcmp(&x, &y, sizeof x));
}

#ifndef SFI_TEST_SHARED_ONLY

START_TEST(presets_are_the_qwen3_family)
{
    ck_assert_uint_eq(sfi_model_preset_count(), 9);
    static const char *want[] = {
        "Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B",      "Qwen3-4B-Instruct-2507", "Qwen3-8B",
        "Qwen3-14B",  "Qwen3-32B",  "Qwen3-30B-A3B", "Qwen3-235B-A22B"};
    for (size_t i = 0; i < 9; i++) {
        ck_assert_str_eq(sfi_model_preset_name(i), want[i]);
        sfi_model_config c = must_preset(want[i]);
        ck_assert_str_eq(c.name, want[i]);
        sfi_error e;
        ck_assert_int_eq(sfi_model_config_validate(&c, NULL, &e), SFI_OK);
    }
    ck_assert_ptr_null(sfi_model_preset_name(9));
}
END_TEST

START_TEST(qwen3_0_6b_numbers)
{
    sfi_model_config c = must_preset("qwen3-0.6b"); /* case-insensitive */
    ck_assert_str_eq(c.name, "Qwen3-0.6B");
    ck_assert_int_eq(c.arch, SFI_ARCH_QWEN3);
    ck_assert_int_eq(c.vocab_size, 151936);
    ck_assert_int_eq(c.hidden_size, 1024);
    ck_assert_int_eq(c.intermediate_size, 3072);
    ck_assert_int_eq(c.num_hidden_layers, 28);
    ck_assert_int_eq(c.num_attention_heads, 16);
    ck_assert_int_eq(c.num_key_value_heads, 8);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_int_eq(c.max_position_embeddings, 40960);
    ck_assert(c.rope_theta == 1e6);
    ck_assert(c.rms_norm_eps == 1e-6);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert_int_eq(c.attention_bias, 0);
    ck_assert_int_eq(c.bos_token_id, 151643);
    ck_assert_int_eq(c.eos_token_id, 151645);
    ck_assert_int_eq(c.weight_bytes, 2);
    ck_assert_int_eq(c.num_experts, 0);
    for (int l = 0; l < 28; l++)
        ck_assert_int_eq(sfi_model_layer_is_moe(&c, l), 0);
    /* 28 layers x (K + V) x 8 KV heads x 128 x 2 bytes. */
    ck_assert_uint_eq(sfi_model_kv_bytes_per_token(&c, 2), 28 * 2 * 8 * 128 * 2);
    ck_assert_uint_eq(sfi_model_kv_bytes_per_token(&c, 4), 229376);
    /* By hand: tied embedding 151936*1024 = 155582464; final norm 1024;
     * per layer q,o 2*1024*2048 + k,v 2*1024*1024 + q/k norms 2*128 + two
     * block norms 2*1024 + MLP 3*1024*3072 = 15730944; x28 = 440466432.
     * The model card says 0.6B total, 0.44B non-embedding. */
    ck_assert_uint_eq(sfi_model_param_count(&c), 155582464ull + 1024 + 440466432ull);
}
END_TEST

/* Totals the Qwen3 model cards publish (billions, rounded as published). */
START_TEST(param_counts_match_model_cards)
{
    static const struct {
        const char *name;
        double billions, tol;
    } cards[] = {
        {"Qwen3-1.7B", 1.7, 0.05},     {"Qwen3-4B", 4.0, 0.05},   {"Qwen3-8B", 8.2, 0.05},
        {"Qwen3-14B", 14.8, 0.05},     {"Qwen3-32B", 32.8, 0.05}, {"Qwen3-30B-A3B", 30.5, 0.05},
        {"Qwen3-235B-A22B", 235, 0.5},
    };
    for (size_t i = 0; i < sizeof cards / sizeof cards[0]; i++) {
        sfi_model_config c = must_preset(cards[i].name);
        double b = (double)sfi_model_param_count(&c) / 1e9;
        ck_assert_msg(b > cards[i].billions - cards[i].tol && b < cards[i].billions + cards[i].tol,
                      "%s: %.3fB params", cards[i].name, b);
    }
}
END_TEST

START_TEST(moe_presets)
{
    sfi_model_config c = must_preset("QWEN3-30B-A3B");
    ck_assert_int_eq(c.arch, SFI_ARCH_QWEN3_MOE);
    ck_assert_int_eq(c.num_experts, 128);
    ck_assert_int_eq(c.num_experts_per_tok, 8);
    ck_assert_int_eq(c.moe_intermediate_size, 768);
    ck_assert_int_eq(c.norm_topk_prob, 1);
    ck_assert_int_eq(c.decoder_sparse_step, 1);
    ck_assert_int_eq(c.n_mlp_only_layers, 0);
    ck_assert_int_eq(c.num_hidden_layers, 48);
    ck_assert_int_eq(c.num_key_value_heads, 4);
    for (int l = 0; l < 48; l++)
        ck_assert_int_eq(sfi_model_layer_is_moe(&c, l), 1);
    ck_assert_int_eq(sfi_model_layer_is_moe(&c, 48), 0);
    ck_assert_int_eq(sfi_model_layer_is_moe(&c, -1), 0);
    ck_assert_uint_eq(sfi_model_kv_bytes_per_token(&c, 2), 48 * 2 * 4 * 128 * 2);
    sfi_model_config big = must_preset("Qwen3-235B-A22B");
    ck_assert_int_eq(big.num_hidden_layers, 94);
    ck_assert_int_eq(big.num_attention_heads, 64);
    ck_assert_uint_eq(sfi_model_kv_bytes_per_token(&big, 2), 94 * 2 * 4 * 128 * 2);
}
END_TEST

/* The repository's copies (src/presets/) load from disk as the presets. */
START_TEST(repo_copies_load_as_files)
{
    for (size_t i = 0; i < sfi_model_preset_count(); i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "src/presets/%s.json", sfi_model_preset_name(i));
        char path[4096];
        snprintf(path, sizeof path, "%s", sfi_test_src(rel));
        sfi_model_config f, p;
        sfi_error e;
        ck_assert_msg(sfi_model_config_load(path, &f, &e) == SFI_OK, "%s", e.msg);
        ck_assert_msg(sfi_model_resolve(path, &f, &e) == SFI_OK, "%s", e.msg);
        p = must_preset(sfi_model_preset_name(i));
        assert_same_model(&f, &p);
    }
}
END_TEST

/* The parameter count equals the number of weights the fixtures' real
 * Hugging Face checkpoints store (dense, MoE with a dense layer, untied). */
START_TEST(param_count_matches_checkpoints)
{
    static const char *models[] = {"tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-moe-nonorm"};
    for (size_t i = 0; i < 3; i++) {
        char rel[256], dir[4096];
        snprintf(rel, sizeof rel, "tests/fixtures/hf/%s", models[i]);
        snprintf(dir, sizeof dir, "%s", sfi_test_src(rel));
        sfi_model_config c;
        sfi_error e;
        ck_assert_msg(sfi_model_resolve(dir, &c, &e) == SFI_OK, "%s", e.msg);
        sfi_safetensors *st;
        ck_assert_msg(sfi_st_open(dir, &st, &e) == SFI_OK, "%s", e.msg);
        uint64_t stored = 0;
        for (size_t t = 0; t < sfi_st_count(st); t++)
            stored += sfi_st_tensor_at(st, t)->numel;
        sfi_st_close(st);
        ck_assert_msg(sfi_model_param_count(&c) == stored, "%s: %llu params, checkpoint %llu",
                      models[i], (unsigned long long)sfi_model_param_count(&c),
                      (unsigned long long)stored);
    }
}
END_TEST

static sfi_status parse(const char *json, sfi_model_config *c, sfi_error *e)
{
    sfi_error_clear(e);
    memset(c, 0x5a, sizeof *c);
    return sfi_model_config_parse(json, strlen(json), "t.json", c, e);
}

#define DENSE_HEAD                                                                                 \
    "\"model_type\": \"qwen3\", \"vocab_size\": 1000, \"hidden_size\": 64, "                       \
    "\"intermediate_size\": 128, \"num_hidden_layers\": 4"

START_TEST(hugging_face_variants)
{
    sfi_model_config c;
    sfi_error e;
    /* head_dim and KV heads from Hugging Face's defaults; rope_theta inside
     * rope_parameters (transformers 5); dtype; eos as a list. */
    ck_assert_msg(parse("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"rope_parameters\": "
                        "{\"rope_type\": \"default\", \"rope_theta\": 5000000}, \"dtype\": "
                        "\"float32\", \"eos_token_id\": [7, 9], \"bos_token_id\": null}",
                        &c, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert_int_eq(c.num_key_value_heads, 4);
    ck_assert(c.rope_theta == 5e6);
    ck_assert_int_eq(c.weight_bytes, 4);
    ck_assert_int_eq(c.eos_token_id, 7);
    ck_assert_int_eq(c.bos_token_id, -1);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.max_position_embeddings, 32768);
    ck_assert_str_eq(c.name, "t.json");
    /* MoE: num_local_experts, sparse step 2 and a dense layer list. */
    ck_assert_msg(parse("{\"model_type\": \"qwen3_moe\", \"vocab_size\": 1000, \"hidden_size\": "
                        "64, \"intermediate_size\": 256, \"num_hidden_layers\": 6, "
                        "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 32, "
                        "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, "
                        "\"moe_intermediate_size\": 32, \"decoder_sparse_step\": 2, "
                        "\"mlp_only_layers\": [3], \"torch_dtype\": \"bfloat16\", "
                        "\"attention_bias\": true}",
                        &c, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert_int_eq(c.num_experts, 4);
    ck_assert_int_eq(c.n_mlp_only_layers, 1);
    static const int moe[6] = {0, 1, 0, 0, 0, 1};
    for (int l = 0; l < 6; l++)
        ck_assert_int_eq(sfi_model_layer_is_moe(&c, l), moe[l]);
    /* Embeddings 2*1000*64 + norm 64; attention 2*64*256 + 2*64*64 + biases
     * (256 + 2*64 + 64) + norms 2*32 + 2*64; 2 MoE layers of router 64*4 +
     * 4*3*64*32, 4 dense layers of 3*64*256. */
    uint64_t attn = 2 * 64 * 256 + 2 * 64 * 64 + 256 + 128 + 64 + 64 + 128;
    uint64_t want = 128000 + 64 + 6 * attn + 2 * (256 + 4 * 3 * 64 * 32) + 4 * (3 * 64 * 256);
    ck_assert_uint_eq(sfi_model_param_count(&c), want);
    /* Architecture from the architectures list when model_type is absent. */
    ck_assert_msg(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 10, "
                        "\"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 1, "
                        "\"num_attention_heads\": 2}",
                        &c, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert_int_eq(c.arch, SFI_ARCH_QWEN3);
}
END_TEST

static void expect_bad(const char *json, sfi_status code, const char *needle)
{
    sfi_model_config c, before;
    sfi_error e;
    memset(&c, 0x5a, sizeof c);
    before = c;
    sfi_error_clear(&e);
    sfi_status st = sfi_model_config_parse(json, strlen(json), "t.json", &c, &e);
    ck_assert_msg(st == code, "%s: status %s want %s (%s)", json, sfi_status_name(st),
                  sfi_status_name(code), e.msg);
    ck_assert_msg(strstr(e.msg, needle) != NULL, "message '%s' lacks '%s'", e.msg, needle);
    ck_assert_msg(!strncmp(e.msg, "t.json", 6), "message '%s' does not name the file", e.msg);
    ck_assert_msg(!memcmp(&c, &before, sizeof c), "failed parse wrote the config");
}

START_TEST(malformed_and_wrong_typed)
{
    expect_bad("{\"model_type\": \"qwen3\",", SFI_EFORMAT, "t.json:1:");
    expect_bad("{\"model_type\": \"qwen3\"\n\"x\": 1}", SFI_EFORMAT, "t.json:2:");
    expect_bad("[1, 2]", SFI_EFORMAT, "expected a JSON object, found an array");
    expect_bad("", SFI_EFORMAT, "invalid JSON");
    expect_bad("{}", SFI_EFORMAT, "t.json: model_type: missing");
    expect_bad("{\"model_type\": 3}", SFI_EFORMAT, "model_type: expected a string");
    expect_bad("{\"model_type\": \"llama\"}", SFI_EUNSUPPORTED, "model_type: 'llama' is not");
    expect_bad("{\"model_type\": \"qwen3\", \"vocab_size\": 1000}", SFI_EFORMAT,
               "hidden_size: missing");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": \"16\"}", SFI_EFORMAT,
               "num_attention_heads: expected an integer, found a string");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 16.0}", SFI_EFORMAT,
               "num_attention_heads: expected an integer, found a real number");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"tie_word_embeddings\": \"yes\"}",
               SFI_EFORMAT, "tie_word_embeddings: expected true or false");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"rope_theta\": \"1e6\"}", SFI_EFORMAT,
               "rope_theta: expected a number");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"rope_theta\": -1}", SFI_ERANGE,
               "rope_theta: -1 must be");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"eos_token_id\": \"x\"}", SFI_EFORMAT,
               "eos_token_id: expected an integer or a list");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"eos_token_id\": 1000}", SFI_ERANGE,
               "eos_token_id: 1000 is not below vocab_size (1000)");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"torch_dtype\": \"int8\"}",
               SFI_EUNSUPPORTED, "torch_dtype: 'int8' is not supported");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": "
               "\"yarn\", \"factor\": 4}}",
               SFI_EUNSUPPORTED, "rope_scaling.rope_type: 'yarn'");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"use_sliding_window\": true}",
               SFI_EUNSUPPORTED, "use_sliding_window");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"hidden_size\": 64}", SFI_EFORMAT,
               "invalid JSON: duplicate object key");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 0}", SFI_ERANGE,
               "num_attention_heads: 0 is out of range");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"num_hidden_layers\": 5000}",
               SFI_EFORMAT, "duplicate");
    expect_bad("{\"model_type\": \"qwen3\", \"vocab_size\": 1000, \"hidden_size\": 64, "
               "\"intermediate_size\": 128, \"num_hidden_layers\": 5000, "
               "\"num_attention_heads\": 4}",
               SFI_ERANGE, "num_hidden_layers: 5000 is out of range [1, 1024]");
    expect_bad("{\"model_type\": \"qwen3\", \"vocab_size\": 99999999999999999999}", SFI_EFORMAT,
               "invalid JSON");
}
END_TEST

/* Issue 20.7: what sfi does not implement is refused, not ignored; every
 * eos_token_id of a list is read and checked. */
START_TEST(unimplemented_fields_refused)
{
#define H4 "{" DENSE_HEAD ", \"num_attention_heads\": 4, "
    expect_bad(H4 "\"hidden_act\": \"gelu\"}", SFI_EUNSUPPORTED,
               "hidden_act: 'gelu' is not supported (silu only)");
    expect_bad(H4 "\"hidden_act\": 1}", SFI_EFORMAT, "hidden_act: expected a string");
    expect_bad(H4 "\"partial_rotary_factor\": 0.5}", SFI_EUNSUPPORTED,
               "partial_rotary_factor: 0.5 is not supported");
    expect_bad(H4 "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6, "
                  "\"partial_rotary_factor\": 0.25}}",
               SFI_EUNSUPPORTED, "rope_parameters.partial_rotary_factor: 0.25");
    expect_bad(H4 "\"layer_types\": [\"full_attention\", \"sliding_attention\", "
                  "\"full_attention\", \"full_attention\"]}",
               SFI_EUNSUPPORTED, "layer_types[1]: 'sliding_attention' is not supported");
    expect_bad(H4 "\"layer_types\": [\"full_attention\"]}", SFI_EFORMAT,
               "layer_types: expected a list of 4 layer types");
    expect_bad(H4 "\"eos_token_id\": [7, 1000]}", SFI_ERANGE,
               "eos_token_id[1]: 1000 is not below vocab_size (1000)");
    expect_bad(H4 "\"eos_token_id\": [7, \"x\"]}", SFI_EFORMAT,
               "eos_token_id[1]: expected an integer, found a string");
    expect_bad(H4 "\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", SFI_ERANGE,
               "eos_token_id: 17 ids, more than the 16 sfi reads");
    expect_bad(H4 "\"bos_token_id\": [1, 5000]}", SFI_ERANGE, "bos_token_id[1]: 5000");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"head_dim\": 15}", SFI_EUNSUPPORTED,
               "head_dim: 15 is odd");
    sfi_model_config c;
    sfi_error e;
    ck_assert_msg(parse(H4 "\"hidden_act\": \"swish\", \"partial_rotary_factor\": 1.0, "
                           "\"layer_types\": [\"full_attention\", \"full_attention\", "
                           "\"full_attention\", \"full_attention\"], \"eos_token_id\": [7, 9, 11]}",
                        &c, &e) == SFI_OK,
                  "%s", e.msg);
    ck_assert_int_eq(c.eos_token_id, 7);
    ck_assert_int_eq(c.n_eos, 3);
    ck_assert_int_eq(c.eos_token_ids[2], 11);
    ck_assert_msg(parse(H4 "\"eos_token_id\": 5}", &c, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(c.n_eos, 1);
    ck_assert_int_eq(c.eos_token_ids[0], 5);
    ck_assert_msg(parse(H4 "\"eos_token_id\": []}", &c, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(c.n_eos, 0);
    ck_assert_int_eq(c.eos_token_id, -1);
#undef H4
}
END_TEST

START_TEST(inconsistent_shapes)
{
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 16, \"num_key_value_heads\": 3, "
               "\"head_dim\": 8}",
               SFI_EFORMAT,
               "t.json: num_attention_heads: 16 is not divisible by num_key_value_heads (3)");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 6}", SFI_EFORMAT,
               "head_dim: missing, and hidden_size (64) is not divisible by "
               "num_attention_heads (6)");
    expect_bad("{" DENSE_HEAD ", \"num_attention_heads\": 4, \"num_key_value_heads\": 8}",
               SFI_EFORMAT, "not divisible");
#define MOE_HEAD                                                                                   \
    "\"model_type\": \"qwen3_moe\", \"vocab_size\": 1000, \"hidden_size\": 64, "                   \
    "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
    expect_bad("{" MOE_HEAD "\"num_experts\": 4, \"num_experts_per_tok\": 8, "
               "\"moe_intermediate_size\": 32}",
               SFI_ERANGE, "num_experts_per_tok: 8 is out of range [1, 4]");
    expect_bad("{" MOE_HEAD "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32}",
               SFI_EFORMAT, "num_local_experts: missing");
    expect_bad("{" MOE_HEAD "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
               "\"moe_intermediate_size\": 32, \"mlp_only_layers\": [4]}",
               SFI_ERANGE, "mlp_only_layers[0]: 4 is not a layer index (0..3)");
    expect_bad("{" MOE_HEAD "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
               "\"moe_intermediate_size\": 32, \"mlp_only_layers\": [1, 1], "
               "\"intermediate_size\": 8}",
               SFI_EFORMAT, "layer 1 is listed twice");
    expect_bad("{" MOE_HEAD "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
               "\"moe_intermediate_size\": 32, \"mlp_only_layers\": [1]}",
               SFI_EFORMAT, "intermediate_size: missing, but some layers use the dense MLP");
    expect_bad("{" MOE_HEAD "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
               "\"moe_intermediate_size\": 32, \"mlp_only_layers\": 1}",
               SFI_EFORMAT, "mlp_only_layers: expected a list");
    expect_bad("{" MOE_HEAD "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
               "\"moe_intermediate_size\": 32, \"decoder_sparse_step\": 0}",
               SFI_ERANGE, "decoder_sparse_step");
    /* A struct that never went through the parser. */
    sfi_model_config c = must_preset("Qwen3-0.6B");
    sfi_error e;
    c.num_key_value_heads = 5;
    ck_assert_int_eq(sfi_model_config_validate(&c, "x", &e), SFI_EFORMAT);
    ck_assert_str_eq(e.msg, "x: num_attention_heads: 16 is not divisible by "
                            "num_key_value_heads (5)");
    c = must_preset("Qwen3-0.6B");
    c.num_experts = 3;
    ck_assert_int_eq(sfi_model_config_validate(&c, "x", &e), SFI_EFORMAT);
    /* Derived sizes saturate on hostile values instead of wrapping. */
    c = must_preset("Qwen3-0.6B");
    c.vocab_size = 2000000000;
    c.hidden_size = 2000000000;
    c.intermediate_size = 2000000000;
    ck_assert_uint_eq(sfi_model_param_count(&c), UINT64_MAX);
    c.num_hidden_layers = 2000000000;
    c.num_key_value_heads = 2000000000;
    c.head_dim = 2000000000;
    ck_assert_uint_eq(sfi_model_kv_bytes_per_token(&c, 4), UINT64_MAX);
}
END_TEST

/* Every prefix of a real config is refused with a message, never a crash
 * or a half-filled config. */
START_TEST(every_truncation_is_refused)
{
    char *path = strdup(sfi_test_src("src/presets/Qwen3-30B-A3B.json"));
    size_t len;
    char *text = sfi_test_read_file(path, &len);
    ck_assert_ptr_nonnull(text);
    /* The last '}' closes the object: any shorter prefix is invalid. */
    size_t end = len;
    while (end > 0 && text[end - 1] != '}')
        end--;
    for (size_t n = 0; n < end; n++) {
        sfi_model_config c;
        sfi_error e;
        sfi_status st = sfi_model_config_parse(text, n, "cut.json", &c, &e);
        ck_assert_msg(st == SFI_EFORMAT, "prefix %zu: %s", n, sfi_status_name(st));
        ck_assert_ptr_nonnull(strstr(e.msg, "cut.json"));
    }
    free(text);
    free(path);
}
END_TEST

START_TEST(files_dirs_and_names)
{
    char *dir = sfi_test_tmpdir();
    char path[4096];
    sfi_model_config c;
    sfi_error e;
    /* A directory holding config.json, with and without a trailing '/'. */
    char *text = sfi_test_read_file(sfi_test_src("src/presets/Qwen3-8B.json"), NULL);
    ck_assert_ptr_nonnull(text);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ck_assert_int_eq(sfi_test_write_file(path, text, strlen(text)), 0);
    free(text);
    ck_assert_msg(sfi_model_resolve(dir, &c, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(c.num_hidden_layers, 36);
    snprintf(path, sizeof path, "%s/", dir);
    ck_assert_msg(sfi_model_config_load(path, &c, &e) == SFI_OK, "%s", e.msg);
    /* Empty file, missing file, directory without config.json. */
    snprintf(path, sizeof path, "%s/empty.json", dir);
    ck_assert_int_eq(sfi_test_write_file(path, "", 0), 0);
    ck_assert_int_eq(sfi_model_config_load(path, &c, &e), SFI_EFORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "empty.json: empty file"));
    snprintf(path, sizeof path, "%s/sub", dir);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "mkdir '%s'", path);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, NULL), 0);
    ck_assert_int_eq(sfi_model_config_load(path, &c, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "sub/config.json: cannot open"));
    ck_assert_int_eq(sfi_model_resolve("/nonexistent/config.json", &c, &e), SFI_ENOTFOUND);
    /* A 2 GiB (sparse) config is refused from its size, before reading. */
    snprintf(path, sizeof path, "%s/huge.json", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 2L << 30, SEEK_SET), 0);
    fputc('}', f);
    fclose(f);
    ck_assert_int_eq(sfi_model_config_load(path, &c, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "huge.json: 2147483649 bytes is too large"));
    sfi_test_rmtree(dir);
    free(dir);
    /* Unknown names list the presets. */
    ck_assert_int_eq(sfi_model_resolve("Qwen9-1T", &c, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "Qwen9-1T: neither a model preset (Qwen3-0.6B, "));
    ck_assert_int_eq(sfi_model_preset("Qwen9-1T", &c, &e), SFI_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "unknown model preset 'Qwen9-1T'"));
    ck_assert_int_eq(sfi_model_resolve("qwen3-14b", &c, &e), SFI_OK);
    ck_assert_str_eq(c.name, "Qwen3-14B");
}
END_TEST

/* Issue 20: configs that are not regular files (pipes, /dev/stdin,
 * process substitution, character devices) are read up to the limit; a
 * read past 64 KiB once grew the capacity without reallocating (heap
 * overflow). */
START_TEST(piped_and_endless_configs)
{
    sfi_model_config c;
    sfi_error e;
    /* An endless device: refused at the limit, not read forever. */
    ck_assert_int_eq(sfi_model_config_load("/dev/zero", &c, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "/dev/zero: more than 16777216 bytes is too large "
                                        "for a config.json"));
    /* 70,000 spaces through a pipe: read whole (more than one 64 KiB
     * chunk), then refused as what it is. */
    FILE *p = popen("head -c 70000 /dev/zero | tr '\\0' ' '", "r");
    ck_assert_ptr_nonnull(p);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fileno(p));
    ck_assert_int_eq(sfi_model_config_load(path, &c, &e), SFI_EFORMAT);
    ck_assert_msg(strstr(e.msg, "invalid JSON"), "%s", e.msg);
    pclose(p);
    /* A real config through a pipe, padded past 64 KiB with spaces. */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "{ head -c 100000 /dev/zero | tr '\\0' ' '; cat '%s'; }",
             sfi_test_src("src/presets/Qwen3-8B.json"));
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    snprintf(path, sizeof path, "/dev/fd/%d", fileno(p));
    ck_assert_msg(sfi_model_config_load(path, &c, &e) == SFI_OK, "%s", e.msg);
    ck_assert_int_eq(c.num_hidden_layers, 36);
    pclose(p);
}
END_TEST

#else /* SFI_TEST_SHARED_ONLY */

/* The real tokenizer directory's config.json (extra fields, nulls). */
START_TEST(shared_tokenizer_config)
{
    const char *p = sfi_test_shared("data/qwen3-tokenizer/config.json");
    ck_assert_ptr_nonnull(p);
    char path[4096];
    snprintf(path, sizeof path, "%s", p);
    sfi_model_config f, d;
    sfi_error e;
    ck_assert_msg(sfi_model_config_load(path, &f, &e) == SFI_OK, "%s", e.msg);
    /* Its directory resolves too. */
    char *slash = strrchr(path, '/');
    *slash = '\0';
    ck_assert_msg(sfi_model_resolve(path, &d, &e) == SFI_OK, "%s", e.msg);
    assert_same_model(&f, &d);
    sfi_model_config pre = must_preset("Qwen3-0.6B");
    assert_same_model(&f, &pre);
}
END_TEST

#endif

int main(void)
{
#ifdef SFI_TEST_SHARED_ONLY
    if (!sfi_test_shared("data/qwen3-tokenizer/config.json")) {
        printf("SKIP: $SFI_SHARED/data/qwen3-tokenizer/config.json not found\n");
        return 77;
    }
#endif
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("core");
#ifndef SFI_TEST_SHARED_ONLY
    tcase_add_test(tc, presets_are_the_qwen3_family);
    tcase_add_test(tc, qwen3_0_6b_numbers);
    tcase_add_test(tc, param_counts_match_model_cards);
    tcase_add_test(tc, moe_presets);
    tcase_add_test(tc, repo_copies_load_as_files);
    tcase_add_test(tc, param_count_matches_checkpoints);
    tcase_add_test(tc, hugging_face_variants);
    tcase_add_test(tc, malformed_and_wrong_typed);
    tcase_add_test(tc, inconsistent_shapes);
    tcase_add_test(tc, unimplemented_fields_refused);
    tcase_add_test(tc, every_truncation_is_refused);
    tcase_add_test(tc, files_dirs_and_names);
    tcase_add_test(tc, piped_and_endless_configs);
#else
    tcase_add_test(tc, shared_tokenizer_config);
#endif
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
