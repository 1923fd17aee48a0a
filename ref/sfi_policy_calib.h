/* Calibration of the comparison policies that need one (Kascade's
 * cross-layer similarity and head map, FASA's dominant frequency chunks),
 * computed from dense forward passes over a calibration text that is not
 * the evaluated one (sfi-ref calibrate), stored as JSON. See
 * ref/sfi_policies.h for how the policies use it. */
#ifndef SFI_POLICY_CALIB_H
#define SFI_POLICY_CALIB_H

#include <stdint.h>
#include "sfi_error.h"

/* ------------------------------------------------------------------ */
/* Calibration (Kascade, FASA), from data separate from the evaluation  */

typedef struct {
    int n_layers, n_kv_heads, head_dim;
    char *source;            /* what it was computed on (text, tokens) */
    int leaks;               /* 1: measured on the evaluated data itself (a
                                stand-in, reported as a proxy) */
    /* Kascade: per (a, b) the similarity sim[a][b] (a anchor, b > a
     * reuse), the head map head[a][b][h] (anchor head for reuse head h)
     * and per layer the importance weight (1 - cos of its input and
     * output). has_kascade = 0 when absent. */
    int has_kascade;
    int kascade_k;           /* top-k the similarity was measured with */
    double *sim;             /* [L][L] */
    int *head;               /* [L][L][H] */
    double *weight;          /* [L] */
    /* FASA: n_tip dominant chunks per (layer, KV head), ascending. */
    int has_fasa;
    int fasa_k;              /* top-K of the agreement test */
    int n_tip;
    int *tip;                /* [L][H][n_tip] */
} sfi_policy_calib;

void sfi_policy_calib_free(sfi_policy_calib *c);
/* JSON text (malloc'd) and back; errors name what is wrong. */
char *sfi_policy_calib_to_json(const sfi_policy_calib *c);
SFI_NODISCARD sfi_status sfi_policy_calib_from_json(const char *text, const char *origin,
                                                    sfi_policy_calib *c, sfi_error *err);
SFI_NODISCARD sfi_status sfi_policy_calib_load(const char *path, sfi_policy_calib *c,
                                               sfi_error *err);
/* Under the output rule of src/sfi_io.h (temporary file, renamed). */
SFI_NODISCARD sfi_status sfi_policy_calib_save(const char *path, const sfi_policy_calib *c,
                                               sfi_error *err);

/* Builds a calibration from dense forward passes over calibration prompts.
 * For every prompt token and layer the caller hands the roped query and
 * the layer's keys (sfi_policy_calibrator_add), and once per token and
 * layer the layer's input and output hidden states (..._hidden). Kascade:
 * per token, the pooled (mean over the group) attention of each KV head,
 * its top-k (kascade_calib_k); sim(a->b) per token = mass of b inside
 * a's top-k over b's own top-k mass, per (anchor head g, reuse head h);
 * min over the prompt's tokens whose context exceeds k, mean over prompts;
 * head map = argmax over g, sim[a][b] = mean over h of the max.
 * FASA: per KV head and chunk c (dims c, c + d/2), the overlap of the
 * top-fasa_calib_k by the chunk's score with the top-K by the full score,
 * averaged over tokens whose context exceeds 2K; the n_tip best chunks. */
typedef struct sfi_policy_calibrator sfi_policy_calibrator;
SFI_NODISCARD sfi_status sfi_policy_calibrator_create(int kascade_k, int fasa_k, int n_tip,
                                                      int n_layers, int n_heads, int n_kv_heads,
                                                      int head_dim, int max_ctx,
                                                      sfi_policy_calibrator **out, sfi_error *err);
void sfi_policy_calibrator_free(sfi_policy_calibrator *c);
/* A new prompt (the min over tokens restarts). */
void sfi_policy_calibrator_begin(sfi_policy_calibrator *c);
SFI_NODISCARD sfi_status sfi_policy_calibrator_add(sfi_policy_calibrator *c, int layer,
                                                   const float *q, const float *k, int n_ctx,
                                                   sfi_error *err);
void sfi_policy_calibrator_hidden(sfi_policy_calibrator *c, int layer, const float *in,
                                  const float *out, int hidden_size);
/* Anchors are not part of the calibration: they depend on the count
 * asked for; sfi_policy_kascade_plan derives them. */
SFI_NODISCARD sfi_status sfi_policy_calibrator_finish(sfi_policy_calibrator *c, const char *source,
                                                      sfi_policy_calib *out, sfi_error *err);

/* Kascade's anchors by dynamic programming over layers 1..L-1 (layer 0 is
 * dense and reused by nobody): layer 1 is an anchor, n_anchors in all
 * (clipped to L - 1); reuse layer b takes the closest anchor a < b;
 * maximizes sum over reuse layers of weight[b] * sim[a][b] (weight NULL:
 * 1). Ties keep earlier anchors. anchors[] gets the layers ascending;
 * returns the objective. */
double sfi_policy_kascade_dp(const double *sim, const double *weight, int n_layers,
                             int n_anchors, int *anchors);

/* A stand-in Kascade calibration from recorded attention (a trace's top-M
 * records; used only when no calibration is at hand, and reported as a
 * proxy: it is measured on the data it is then evaluated on). calib_pos,
 * calib_prob, calib_n: [S][L][H] records of n entries (probability
 * descending); the similarity is the same as the calibrator's, over the S
 * steps as one prompt, weights 1. */
SFI_NODISCARD sfi_status sfi_policy_calib_kascade_from_records(const int32_t *const *pos,
                                                               const float *const *prob,
                                                               const int *n, int S, int L, int H,
                                                               int top_k, sfi_policy_calib *out,
                                                               sfi_error *err);

#endif
