/* sfi-sim presets: the built-in GPUs, models and policies. */
#include <config.h>

#include "sfi_sim_cli.h"

#include <stdio.h>
#include <string.h>

#include "sfi_cost.h"
#include "sfi_hw.h"
#include "sfi_model.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-sim presets [-h]\n\n"
                 "Lists the built-in GPUs (vendor figures), the Qwen3 model presets and the\n"
                 "simulated policies with their parameters. See sfi-sim-presets(1).\n");
}

int sfi_sim_cmd_presets(int argc, char **argv)
{
    if (argc > 1) {
        if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "sfi-sim presets: unexpected argument '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    printf("Sizes in decimal units, as GPU vendors give HBM: GB = 1e9 bytes, MB = 1e6, "
           "kB = 1e3;\nTB/s = 1e12 bytes/s; KV_kB/token in bf16 over all layers; params_B = "
           "1e9 parameters;\nmax_pos = max_position_embeddings, the longest context the model "
           "was trained for.\n\n");
    printf("GPUs (--gpus NAME; or a GPU JSON file, see sfi-sim-sweep(1)):\n");
    printf("  %-10s %8s %9s %11s %10s %5s %7s %11s\n", "name", "HBM_GB", "HBM_TB/s", "BF16_TFLOPS",
           "FP8_TFLOPS", "SMs", "L2_MB", "NVLink_GB/s");
    for (size_t i = 0; i < sfi_gpu_preset_count(); i++) {
        const sfi_gpu *g = sfi_gpu_preset_at(i);
        printf("  %-10s %8.0f %9.2f %11.1f %10.1f %5d %7.0f %11.0f\n", g->name, g->hbm_capacity / 1e9,
               g->hbm_bandwidth / 1e12, g->bf16_flops / 1e12, g->fp8_flops / 1e12, g->sm_count,
               g->l2_bytes / 1e6, g->nvlink_bandwidth / 1e9);
    }
    printf("\nModels (--models NAME; or a config.json path):\n");
    printf("  %-24s %-9s %6s %6s %5s %8s %7s %9s %10s %12s %8s\n", "name", "arch", "layers", "heads",
           "kv", "head_dim", "hidden", "experts", "params_B", "KV_kB/token", "max_pos");
    for (size_t i = 0; i < sfi_model_preset_count(); i++) {
        sfi_model_config m;
        sfi_error e;
        if (sfi_model_preset(sfi_model_preset_name(i), &m, &e) != SFI_OK) {
            fprintf(stderr, "sfi-sim presets: %s\n", e.msg);
            return 1;
        }
        char ex[32] = "-";
        if (m.arch == SFI_ARCH_QWEN3_MOE)
            snprintf(ex, sizeof ex, "%d/%d", m.num_experts_per_tok, m.num_experts);
        printf("  %-24s %-9s %6d %6d %5d %8d %7d %9s %10.2f %12.1f %8d\n", sfi_model_preset_name(i),
               m.arch == SFI_ARCH_QWEN3_MOE ? "qwen3_moe" : "qwen3", m.num_hidden_layers,
               m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.hidden_size, ex,
               sfi_model_param_count(&m) / 1e9, sfi_model_kv_bytes_per_token(&m, 2) / 1e3,
               m.max_position_embeddings);
    }
    printf("\nPolicies (--policies NAME or NAME:key=value,...; every policy gets the\n"
           "sweep's --budget B positions per KV head per step):\n");
    for (int k = 0; k < SFI_POLICY_N_KINDS; k++)
        printf("  %-10s %s\n", sfi_policy_kind_name((sfi_policy_kind)k),
               sfi_policy_kind_help((sfi_policy_kind)k));
    printf("\nPolicy parameters (--param KEY=VALUE, or NAME:KEY=VALUE where KEY may drop\n"
           "the policy's prefix, e.g. quest:page=32):\n");
    for (size_t i = 0; i < sfi_policy_config_key_count(); i++)
        printf("  %-19s %s\n", sfi_policy_config_key_name(i), sfi_policy_config_key_help(i));
    return 0;
}
