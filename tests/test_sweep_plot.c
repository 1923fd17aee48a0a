/* src/sfi_plot: figures with lines and heatmaps written as PNG, read back
 * with cairo; bad arguments; no temporary left behind on failure. */
#include <config.h>

#include <cairo.h>
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_plot.h"
#include "sfi_test_util.h"

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

/* Fraction of pixels of the image that are not white. */
static double ink(const char *path, int *w, int *h)
{
    cairo_surface_t *s = cairo_image_surface_create_from_png(path);
    ck_assert_int_eq(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
    *w = cairo_image_surface_get_width(s);
    *h = cairo_image_surface_get_height(s);
    int stride = cairo_image_surface_get_stride(s);
    const unsigned char *d = cairo_image_surface_get_data(s);
    long dark = 0;
    for (int y = 0; y < *h; y++)
        for (int x = 0; x < *w; x++) {
            const unsigned char *p = d + y * stride + 4 * x;
            dark += (p[0] & p[1] & p[2]) != 0xff;
        }
    cairo_surface_destroy(s);
    return (double)dark / ((double)*w * *h);
}

START_TEST(lines_and_heatmap_png)
{
    char *dir = sfi_test_tmpdir(), path[4200];
    sfi_error e;
    sfi_plot *p = sfi_plot_new(900, 400, 1, 2);
    ck_assert_ptr_nonnull(p);
    double x[5] = {8192, 16384, 32768, 65536, 131072}, y1[5] = {5, 4, 3, 2, 1},
           y2[5] = {5, 5, NAN, 5, 5};
    ck_assert_int_eq(sfi_plot_axes(p, 0, "throughput", "context", "tokens/s",
                                   SFI_PLOT_XLOG2 | SFI_PLOT_XKILO | SFI_PLOT_YZERO, &e),
                     SFI_OK);
    ck_assert_int_eq(sfi_plot_line(p, 0, "full", x, y1, 5, 1, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_line(p, 0, "sfi", x, y2, 5, 0, &e), SFI_OK);
    double z[6] = {0, 1, 2, 3, 4, 5};
    ck_assert_int_eq(sfi_plot_heatmap(p, 1, z, 3, 2, 0, 3, 0, 2, "mass", &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_axes(p, 1, "heat", "x", "y", 0, &e), SFI_OK);
    snprintf(path, sizeof path, "%s/f.png", dir);
    ck_assert_msg(sfi_plot_write_png(p, path, &e) == SFI_OK, "%s", e.msg);
    int w, h;
    double f = ink(path, &w, &h);
    ck_assert_int_eq(w, 900);
    ck_assert_int_eq(h, 400);
    /* Axes, text, lines and a filled heatmap: clearly not blank, not solid. */
    ck_assert(f > 0.05 && f < 0.6);
    ck_assert_int_eq(count_entries(dir), 1); /* no temporary left */
    /* Log axis with non-positive values: they are skipped, no crash. */
    double yn[3] = {-1, 0, 2}, xn[3] = {1, 2, 4};
    ck_assert_int_eq(sfi_plot_axes(p, 0, "log", "x", "y", SFI_PLOT_YLOG10 | SFI_PLOT_XLOG10, &e),
                     SFI_OK);
    ck_assert_int_eq(sfi_plot_line(p, 0, "neg", xn, yn, 3, 1, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_write_png(p, path, &e), SFI_OK);
    sfi_plot_free(p);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* Pixels of the image close to colour (r, g, b) in the rectangle
 * [x0, x1) x [y0, y1) (whole image when x1 <= x0). */
static long pixels_like(const char *path, int r, int g, int b, int x0, int y0, int x1, int y1)
{
    cairo_surface_t *s = cairo_image_surface_create_from_png(path);
    ck_assert_int_eq(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
    int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
    if (x1 <= x0) {
        x0 = y0 = 0;
        x1 = w;
        y1 = h;
    }
    int stride = cairo_image_surface_get_stride(s);
    const unsigned char *d = cairo_image_surface_get_data(s);
    long n = 0;
    for (int y = y0; y < y1 && y < h; y++)
        for (int x = x0; x < x1 && x < w; x++) {
            const unsigned char *p = d + y * stride + 4 * x; /* BGRA */
            n += abs(p[2] - r) < 24 && abs(p[1] - g) < 24 && abs(p[0] - b) < 24;
        }
    cairo_surface_destroy(s);
    return n;
}

START_TEST(styles_bars_bands_notes)
{
    char *dir = sfi_test_tmpdir(), path[4200];
    sfi_error e;
    sfi_plot *p = sfi_plot_new(1200, 400, 1, 3);
    ck_assert_ptr_nonnull(p);
    double x[4] = {1, 2, 3, 4}, y[4] = {1, 2, 3, 4}, lo[4] = {0.5, 1, 2, 3}, hi[4] = {2, 3, 4, 5},
           nan4[4] = {NAN, NAN, NAN, NAN};
    /* Panel 0: many plain lines and one primary (red) on top; the plain
     * palette has no red. */
    ck_assert_int_eq(sfi_plot_axes(p, 0, "lines\nsecond line", "x", "y", 0, &e), SFI_OK);
    for (int i = 0; i < 12; i++) {
        char l[16];
        snprintf(l, sizeof l, "p%d", i);
        double yy[4] = {i, i + 1, i, i + 1};
        ck_assert_int_eq(sfi_plot_line(p, 0, l, x, yy, 4, 0, &e), SFI_OK);
    }
    ck_assert_int_eq(sfi_plot_line_styled(p, 0, "main", x, y, 4, 1, SFI_PLOT_PRIMARY, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_band(p, 0, "main", x, lo, hi, 4, SFI_PLOT_PRIMARY, &e), SFI_OK);
    /* Panel 1: bars, one without a value. */
    ck_assert_int_eq(sfi_plot_axes(p, 1, "bars", "value", "", 0, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_bar(p, 1, "full", 1.0, "1.00x", SFI_PLOT_REFERENCE, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_bar(p, 1, "main", 2.5, "2.50x", SFI_PLOT_PRIMARY, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_bar(p, 1, "other", NAN, "no-fit", SFI_PLOT_PLAIN, &e), SFI_OK);
    /* Lines and bars do not mix. */
    ck_assert_int_eq(sfi_plot_line(p, 1, "x", x, y, 4, 0, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_plot_bar(p, 0, "x", 1, NULL, SFI_PLOT_PLAIN, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_plot_band(p, 0, "x", x, NULL, hi, 4, SFI_PLOT_PLAIN, &e), SFI_EINVAL);
    /* Panel 2: nothing drawable, a note instead of a meaningless scale. */
    ck_assert_int_eq(sfi_plot_axes(p, 2, "empty", "x", "y", 0, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_line(p, 2, "main", x, nan4, 4, 1, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_note(p, 2, "nothing fits", &e), SFI_OK);
    snprintf(path, sizeof path, "%s/s.png", dir);
    ck_assert_msg(sfi_plot_write_png(p, path, &e) == SFI_OK, "%s", e.msg);
    sfi_plot_free(p);
    /* The primary red is present in the line panel and the bar panel. */
    ck_assert(pixels_like(path, 217, 20, 23, 0, 0, 400, 400) > 100);
    ck_assert(pixels_like(path, 217, 20, 23, 400, 0, 800, 400) > 100);
    /* The empty panel: inside its frame only white, the note's box and its
     * text, and no tick labels left of the frame (only the y label). */
    int w, h;
    double f = ink(path, &w, &h);
    ck_assert(f > 0.01);
    ck_assert_int_eq(pixels_like(path, 217, 20, 23, 800, 0, 1200, 400), 0);
    ck_assert_int_eq(pixels_like(path, 255, 255, 255, 825, 60, 870, 330), 45 * 270);
    /* The line panel has tick labels there. */
    ck_assert(pixels_like(path, 255, 255, 255, 25, 60, 70, 330) < 45 * 270);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(bad_arguments)
{
    sfi_error e;
    ck_assert_ptr_null(sfi_plot_new(10, 400, 1, 1));
    ck_assert_ptr_null(sfi_plot_new(400, 400, 0, 1));
    ck_assert_ptr_null(sfi_plot_new(400, 400, 1, 17));
    sfi_plot *p = sfi_plot_new(300, 200, 1, 1);
    double x[1] = {1}, y[1] = {1}, z[1] = {0};
    ck_assert_int_eq(sfi_plot_axes(p, 1, "", "", "", 0, &e), SFI_EINVAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "panel 1"));
    ck_assert_int_eq(sfi_plot_line(p, 0, "a", x, y, 0, 0, &e), SFI_EINVAL);
    ck_assert_int_eq(sfi_plot_heatmap(p, 0, z, 1, 1, 1, 0, 0, 1, "", &e), SFI_EINVAL);
    /* An empty figure still draws (axes with a default range). */
    char *dir = sfi_test_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/empty.png", dir);
    ck_assert_int_eq(sfi_plot_write_png(p, path, &e), SFI_OK);
    /* Unwritable destination: error naming it, nothing left behind. */
    snprintf(path, sizeof path, "%s/no/such/dir.png", dir);
    ck_assert_int_eq(sfi_plot_write_png(p, path, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "dir.png"));
    ck_assert_int_eq(count_entries(dir), 1);
    sfi_plot_free(p);
    sfi_plot_free(NULL);
    sfi_test_rmtree(dir);
    free(dir);
    sfi_plot_release_fonts();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plot");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, lines_and_heatmap_png);
    tcase_add_test(tc, styles_bars_bands_notes);
    tcase_add_test(tc, bad_arguments);
    suite_add_tcase(s, tc);
    /* One process: sfi_plot_release_fonts at the end of the last test. */
    return sfi_test_run_suite(s, CK_NOFORK);
}
