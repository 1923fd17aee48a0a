/* Reports of the analyzer: a text table, CSV (long format: section,
 * name, layer, metric, value), JSON, and the PNG pictures (support
 * heatmap, recall vs budget, stability within vs across sentences). */
#ifndef SFI_ANALYZE_REPORT_H
#define SFI_ANALYZE_REPORT_H

#include <stdio.h>
#include "sfi_analyze.h"

typedef struct {
    const char *trace;        /* file name shown */
    const char *budget;       /* the --budget text */
    int n_steps, n_layers, n_kv_heads;
    long n_snapshots;
    const char *calib;        /* where Kascade/FASA's calibration came from,
                                 NULL: none given */
    int has_prompt;           /* the trace has prompt observations */
} sfi_analyze_report_info;

typedef enum { SFI_ANALYZE_TABLE = 0, SFI_ANALYZE_CSV, SFI_ANALYZE_JSON } sfi_analyze_format;

/* Writes r to out in the given format; -1 on a write error. */
int sfi_analyze_report_write(FILE *out, sfi_analyze_format f, const sfi_analyze_report_info *info,
                             sfi_analyze_result *r);

/* Attention support of (layer, kv head) over the steps: probability mass
 * per position bin (rows) and step (columns), sentence ends marked. */
SFI_NODISCARD sfi_status sfi_analyze_png_support(const char *path, const sfi_analyze_source *src,
                                                 int layer, int kvh, sfi_error *err);
/* Recall vs budget ratio per policy: res[i] analyzed at ratios[i]. */
SFI_NODISCARD sfi_status sfi_analyze_png_budget(const char *path, const double *ratios,
                                                sfi_analyze_result *res, int n, sfi_error *err);
/* Per layer: mean and 10th/90th percentiles of the Jaccard similarity of
 * consecutive top sets, within a sentence vs across a boundary. */
SFI_NODISCARD sfi_status sfi_analyze_png_stability(const char *path, sfi_analyze_result *r,
                                                   sfi_error *err);

#endif
