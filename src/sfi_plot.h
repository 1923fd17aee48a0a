/* PNG figures through cairo: one or more panels, each with axes, ticks,
 * tick labels, axis labels, a title and a legend; line series (optionally
 * with markers) and heatmaps (with a colour bar). Series are stored and the
 * figure is drawn when written, so axis ranges fit all data. Text goes
 * through cairo's font machinery (fontconfig/FreeType), no drawn glyphs.
 * The PNG is written to a temporary file and renamed into place. */
#ifndef SFI_PLOT_H
#define SFI_PLOT_H

#include <stddef.h>
#include "sfi_error.h"

typedef struct sfi_plot sfi_plot;

/* Axis flags of a panel. */
#define SFI_PLOT_XLOG2 0x1u /* x axis log2 (ticks at powers of two) */
#define SFI_PLOT_XLOG10 0x2u
#define SFI_PLOT_YLOG10 0x4u
#define SFI_PLOT_YZERO 0x8u  /* linear y axis includes 0 */
#define SFI_PLOT_XKILO 0x10u /* x tick labels of powers of 2 as 8K, 16K */

/* A figure of rows x cols panels, width x height pixels. NULL on ENOMEM or
 * silly sizes (width/height outside 64..16384, rows/cols outside 1..16). */
sfi_plot *sfi_plot_new(int width, int height, int rows, int cols);
void sfi_plot_free(sfi_plot *p);

/* Sets panel (row-major index) texts and axis flags. Strings are copied. */
SFI_NODISCARD sfi_status sfi_plot_axes(sfi_plot *p, int panel, const char *title,
                                       const char *xlabel, const char *ylabel, unsigned flags,
                                       sfi_error *err);

/* Adds a line through n points (n >= 1; non-finite points are skipped,
 * breaking the line). markers != 0 draws a marker at each point. The
 * colour is the next of a fixed palette unless the label was already used
 * in an earlier panel of this figure (same label -> same colour). */
SFI_NODISCARD sfi_status sfi_plot_line(sfi_plot *p, int panel, const char *label, const double *x,
                                       const double *y, size_t n, int markers, sfi_error *err);

/* How a series stands out. PLAIN series take the next colour of a muted
 * palette (no red, no black) and a thin line; PRIMARY series (the method
 * the figure is about) a thick red line drawn on top of the others (a
 * second and third primary label get dark red and magenta); REFERENCE
 * series (the baseline) a thick black dashed line. */
typedef enum { SFI_PLOT_PLAIN = 0, SFI_PLOT_PRIMARY, SFI_PLOT_REFERENCE } sfi_plot_emphasis;

/* As sfi_plot_line, drawn with the given emphasis. */
SFI_NODISCARD sfi_status sfi_plot_line_styled(sfi_plot *p, int panel, const char *label,
                                              const double *x, const double *y, size_t n,
                                              int markers, sfi_plot_emphasis emphasis,
                                              sfi_error *err);

/* A shaded band between ylo[i] and yhi[i] at x[i] (n >= 1; non-finite
 * points break it), in the colour of `label` (give the label of the line it
 * goes with; the band adds no legend entry of its own unless the label is
 * new). */
SFI_NODISCARD sfi_status sfi_plot_band(sfi_plot *p, int panel, const char *label, const double *x,
                                       const double *ylo, const double *yhi, size_t n,
                                       sfi_plot_emphasis emphasis, sfi_error *err);

/* Makes the panel a horizontal bar chart (categories top to bottom in the
 * order added) and adds one bar; the x axis is the value axis (the panel's
 * xlabel). A non-finite value draws no bar but `text` (e.g. "no-fit") where
 * the bar would start; a finite value's `text`, when given, is printed at
 * the bar's end. Lines and bars do not mix in one panel. */
SFI_NODISCARD sfi_status sfi_plot_bar(sfi_plot *p, int panel, const char *label, double value,
                                      const char *text, sfi_plot_emphasis emphasis, sfi_error *err);

/* A note written across the middle of the panel's axes. A panel with a
 * note and no drawable data shows no tick marks (there is no scale to
 * read). */
SFI_NODISCARD sfi_status sfi_plot_note(sfi_plot *p, int panel, const char *text, sfi_error *err);

/* A heatmap of z[iy * nx + ix] over the cells [x0,x1] x [y0,y1]; colour
 * bar labelled zlabel. One heatmap per panel. */
SFI_NODISCARD sfi_status sfi_plot_heatmap(sfi_plot *p, int panel, const double *z, int nx, int ny,
                                          double x0, double x1, double y0, double y1,
                                          const char *zlabel, sfi_error *err);

/* Draws the figure and writes it as PNG to path (temp file + rename). */
SFI_NODISCARD sfi_status sfi_plot_write_png(const sfi_plot *p, const char *path, sfi_error *err);

/* Frees cairo's and fontconfig's process-wide font caches. Call once at
 * the end of a program that drew figures, after the last one (no figure
 * may be drawn afterwards), so leak checkers see a clean exit. */
void sfi_plot_release_fonts(void);

#endif
