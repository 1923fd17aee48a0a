/* sfi-ref make-checkpoint: a random-weight checkpoint (config.json +
 * model.safetensors) of a preset's (or a config.json's) shape, so
 * benchmarks of real model sizes need no download. */
#include <config.h>

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_cli.h"
#include "sfi_model.h"
#include "sfi_parse.h"
#include "sfi_qwen3.h"
#include "sfi_ref_cli.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-ref make-checkpoint --preset NAME|CONFIG --out DIR [--seed S]\n"
                 "                               [--layers N] [--dtype bf16|f32]\n\n"
                 "Write a random-weight Qwen3 checkpoint of a preset's shape: DIR/config.json and\n"
                 "DIR/model.safetensors (DIR is created when absent; each file is written to a\n"
                 "temporary name and renamed, so a failed run leaves no partial checkpoint). A\n"
                 "checkpoint in DIR that make-checkpoint did not write is never replaced.\n\n"
                 "  -p, --preset NAME   a built-in preset (e.g. Qwen3-0.6B; see 'sfi-ref info\n"
                 "                      --list'), a config.json, or a directory holding one\n"
                 "  -o, --out DIR       output directory\n"
                 "  -s, --seed S        seed of the weights (default 1); same seed, same bytes\n"
                 "  -l, --layers N      keep only the first N layers (smaller test checkpoints)\n"
                 "      --dtype T       bf16 (default) or f32\n"
                 "  -h, --help          print this help\n\n"
                 "Exit status: 0 ok, 1 failure, 2 usage error. See sfi-ref-make-checkpoint(1).\n");
}

int sfi_ref_cmd_make_checkpoint(int argc, char **argv)
{
    enum { O_DTYPE = 256 };
    static const struct option opts[] = {
        {"preset", required_argument, NULL, 'p'},
        {"out", required_argument, NULL, 'o'},
        {"seed", required_argument, NULL, 's'},
        {"layers", required_argument, NULL, 'l'},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *preset = NULL, *out = NULL;
    uint64_t seed = 1;
    int layers = -1;
    sfi_st_dtype dt = SFI_DT_BF16;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "p:o:s:l:h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': preset = optarg; break;
        case 'o': out = optarg; break;
        case 's':
            if (sfi_parse_u64(optarg, &seed)) {
                fprintf(stderr,
                        "sfi-ref make-checkpoint: --seed '%s': expected a "
                        "non-negative integer\n",
                        optarg);
                return 2;
            }
            break;
        case 'l':
            if (sfi_parse_int(optarg, 1, SFI_MODEL_MAX_LAYERS, &layers)) {
                fprintf(stderr, "sfi-ref make-checkpoint: --layers '%s': expected 1..%d\n", optarg,
                        SFI_MODEL_MAX_LAYERS);
                return 2;
            }
            break;
        case O_DTYPE:
            if (!strcmp(optarg, "bf16"))
                dt = SFI_DT_BF16;
            else if (!strcmp(optarg, "f32"))
                dt = SFI_DT_F32;
            else {
                fprintf(stderr, "sfi-ref make-checkpoint: --dtype '%s': expected bf16 or f32\n",
                        optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: return sfi_cli_bad_option("sfi-ref make-checkpoint", argv, NULL, usage);
        }
    }
    if (optind < argc || !preset || !out) {
        fprintf(stderr, "sfi-ref make-checkpoint: need --preset and --out\n");
        usage(stderr);
        return 2;
    }
    sfi_model_config *cfg = malloc(sizeof *cfg);
    if (!cfg) {
        fprintf(stderr, "sfi-ref make-checkpoint: out of memory\n");
        return 1;
    }
    sfi_error e;
    if (sfi_model_resolve(preset, cfg, &e)) {
        fprintf(stderr, "sfi-ref make-checkpoint: %s\n", e.msg);
        free(cfg);
        return 1;
    }
    if (layers > 0) {
        if (layers > cfg->num_hidden_layers) {
            fprintf(stderr, "sfi-ref make-checkpoint: --layers %d: %s has only %d layers\n", layers,
                    preset, cfg->num_hidden_layers);
            free(cfg);
            return 2;
        }
        cfg->num_hidden_layers = layers;
        /* mlp-only layers past the cut no longer exist */
        int k = 0;
        for (int i = 0; i < cfg->n_mlp_only_layers; i++)
            if (cfg->mlp_only_layers[i] < layers)
                cfg->mlp_only_layers[k++] = cfg->mlp_only_layers[i];
        cfg->n_mlp_only_layers = k;
    }
    uint64_t params = sfi_model_param_count(cfg);
    if (sfi_qwen3_write_random(cfg, out, seed, dt, &e)) {
        fprintf(stderr, "sfi-ref make-checkpoint: %s\n", e.msg);
        free(cfg);
        return 1;
    }
    printf("wrote %s/config.json and %s/model.safetensors: %s, %d layers, %llu parameters, "
           "%s, seed %llu\n",
           out, out, cfg->name, cfg->num_hidden_layers, (unsigned long long)params,
           dt == SFI_DT_F32 ? "f32" : "bf16", (unsigned long long)seed);
    free(cfg);
    return 0;
}
