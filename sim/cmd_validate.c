/* sfi-sim validate: compares the cost model's kernel predictions with the
 * times a calibration profile's "measurements" recorded on a real GPU. */
#include <config.h>

#include "sfi_sim_cli.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_cost.h"
#include "sfi_hw.h"

#define DEFAULT_PROFILE "gpu/profiles/h100.json"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sfi-sim validate [--profile FILE] [--gpu NAME|FILE] [--tolerance PCT]\n\n"
            "Predicts every kernel time listed under \"measurements\" in a calibration\n"
            "profile, once with the built-in default calibration and once with the\n"
            "profile's own, and prints measured vs predicted with the relative error.\n\n"
            "  --profile FILE   profile written by the GPU benchmarks [" DEFAULT_PROFILE
            " in the source tree]\n"
            "  --gpu NAME|FILE  GPU the measurements ran on [the profile's \"gpu\", else H100-SXM]\n"
            "  --tolerance PCT  error counted as agreement [10]\n"
            "  -h, --help       this help\n\n"
            "Exit status: 0 report printed, 1 bad input, 2 usage error. See sfi-sim-validate(1).\n");
}

int sfi_sim_cmd_validate(int argc, char **argv)
{
    static const struct option opts[] = {{"profile", required_argument, NULL, 'p'},
                                         {"gpu", required_argument, NULL, 'g'},
                                         {"tolerance", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *prof_path = SFI_SIM_SRCDIR "/" DEFAULT_PROFILE, *gpu_name = NULL;
    double tol = 10;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': prof_path = optarg; break;
        case 'g': gpu_name = optarg; break;
        case 't': {
            char *end;
            tol = strtod(optarg, &end);
            if (*end || !(tol > 0 && tol < 1000)) {
                fprintf(stderr, "sfi-sim validate: --tolerance: '%s' is not in (0, 1000)\n", optarg);
                return 2;
            }
            break;
        }
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "sfi-sim validate: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sfi-sim validate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    sfi_hw_profile prof, def;
    sfi_hw_measurement *ms = NULL;
    size_t nm = 0;
    sfi_error err;
    if (sfi_hw_profile_load(prof_path, &prof, &ms, &nm, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim validate: %s\n", err.msg);
        if (err.code == SFI_ENOTFOUND)
            fprintf(stderr, "sfi-sim validate: run the GPU benchmarks (sfi-gpu bench) to write one, "
                            "or pass --profile\n");
        return 1;
    }
    sfi_hw_profile_default(&def);
    if (nm == 0) {
        fprintf(stderr, "sfi-sim validate: %s: no \"measurements\" to compare with\n", prof_path);
        free(ms);
        return 1;
    }
    sfi_gpu gpu;
    const char *gname = gpu_name ? gpu_name : prof.gpu[0] ? prof.gpu : "H100-SXM";
    if (sfi_gpu_resolve(gname, &gpu, &err) != SFI_OK) {
        fprintf(stderr, "sfi-sim validate: %s\n", err.msg);
        free(ms);
        return 1;
    }
    printf("# sfi-sim validate: %s (profile '%s') on %s; agreement = within %.0f%%\n", prof_path,
           prof.name, gpu.name, tol);
    printf("%-18s %5s %7s %5s %4s %4s %5s %11s %11s %8s %11s %8s\n", "kernel", "batch", "context",
           "heads", "kv", "hd", "K", "measured_us", "default_us", "err%", "profile_us", "err%");
    int n_ok_def = 0, n_ok_prof = 0, n_cmp = 0;
    double max_def = 0, max_prof = 0;
    for (size_t i = 0; i < nm; i++) {
        const sfi_hw_measurement *m = &ms[i];
        sfi_model_config mc;
        memset(&mc, 0, sizeof mc);
        snprintf(mc.name, sizeof mc.name, "measurement %zu", i);
        mc.arch = SFI_ARCH_QWEN3;
        mc.num_attention_heads = m->q_heads ? m->q_heads : 32;
        mc.num_key_value_heads = m->kv_heads ? m->kv_heads : 8;
        mc.head_dim = m->head_dim ? m->head_dim : 128;
        mc.hidden_size = mc.num_attention_heads * mc.head_dim;
        mc.intermediate_size = 1;
        mc.num_hidden_layers = 1;
        mc.vocab_size = 1;
        mc.weight_bytes = 2;
        sfi_cost_setup s;
        sfi_cost_setup_init(&s);
        s.model = &mc;
        s.gpu = gpu;
        s.batch = m->batch ? m->batch : 1;
        s.context = m->context;
        if (m->K)
            s.prm.K = m->K;
        double layers = m->layers > 0 ? m->layers : 1;
        double t_def, t_prof;
        s.prof = def;
        /* Multi-layer pipelines are predicted whole; single kernels are
         * per layer, times the measurement's layer count. */
        int pipeline = !strcmp(m->kernel, "attn_layers") || !strcmp(m->kernel, "slow_step_serial") ||
                       !strcmp(m->kernel, "slow_step_overlap");
        sfi_status st = pipeline ? sfi_cost_pipeline_predict(&s, m->kernel, (int)layers, &t_def, &err)
                                 : sfi_cost_kernel_predict(&s, m->kernel, &t_def, &err);
        if (!st) {
            s.prof = prof;
            st = pipeline ? sfi_cost_pipeline_predict(&s, m->kernel, (int)layers, &t_prof, &err)
                          : sfi_cost_kernel_predict(&s, m->kernel, &t_prof, &err);
        }
        if (pipeline)
            layers = 1;
        printf("%-18s %5d %7d %5d %4d %4d %5d %11.1f ", m->kernel, s.batch, m->context,
               mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, s.prm.K, m->time_s * 1e6);
        if (st) {
            printf("%11s %8s %11s %8s  (%s)\n", "-", "-", "-", "-", err.msg);
            continue;
        }
        t_def *= layers;
        t_prof *= layers;
        double e_def = (t_def - m->time_s) / m->time_s * 100, e_prof = (t_prof - m->time_s) / m->time_s * 100;
        printf("%11.1f %+8.1f %11.1f %+8.1f\n", t_def * 1e6, e_def, t_prof * 1e6, e_prof);
        n_cmp++;
        n_ok_def += fabs(e_def) <= tol;
        n_ok_prof += fabs(e_prof) <= tol;
        max_def = fmax(max_def, fabs(e_def));
        max_prof = fmax(max_prof, fabs(e_prof));
    }
    printf("# compared %d of %zu; within %.0f%%: default %d (max |err| %.1f%%), profile %d (max |err| %.1f%%)\n",
           n_cmp, nm, tol, n_ok_def, max_def, n_ok_prof, max_prof);
    free(ms);
    return 0;
}
