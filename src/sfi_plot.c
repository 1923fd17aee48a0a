/* PNG figures through cairo (see sfi_plot.h). */
#include <config.h>

#include "sfi_plot.h"
#include "sfi_io.h"

#include <cairo.h>
#include <fontconfig/fontconfig.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *label;
    double *x, *y;
    double *ylo; /* a band between ylo and y when non-NULL */
    size_t n;
    int markers;
    int emph;  /* sfi_plot_emphasis */
    int color; /* index within the emphasis' palette */
} series;

typedef struct {
    char *label, *text;
    double v;
    int emph, color;
} bar;

typedef struct {
    double *z;
    int nx, ny;
    double x0, x1, y0, y1;
    char *zlabel;
} heatmap;

typedef struct {
    char *title, *xlabel, *ylabel;
    unsigned flags;
    series *s;
    size_t ns;
    heatmap *h;
    bar *b;
    size_t nb;
    char *note;
} panel;

struct sfi_plot {
    int width, height, rows, cols;
    panel *panels;
    /* label -> palette index within its emphasis, shared across panels */
    char **color_labels;
    int *color_emph, *color_idx;
    int n_colors;
    int n_by_emph[3];
};

/* Tableau-like palette without its red and black, which mark the primary
 * and reference series: distinct hues that survive greyscale printing
 * reasonably; repeats with dashes after it runs out. */
static const double palette[][3] = {
    {0.122, 0.467, 0.706}, {1.000, 0.498, 0.055}, {0.173, 0.627, 0.173}, {0.580, 0.404, 0.741},
    {0.549, 0.337, 0.294}, {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498}, {0.737, 0.741, 0.133},
    {0.090, 0.745, 0.812}, {0.400, 0.650, 1.000},
};
static const double primary_palette[][3] = {
    {0.850, 0.080, 0.090},
    {0.500, 0.000, 0.000},
    {0.800, 0.000, 0.550},
};
static const double reference_palette[][3] = {
    {0.000, 0.000, 0.000},
    {0.350, 0.350, 0.350},
};
#define N_PALETTE ((int)(sizeof palette / sizeof palette[0]))
#define N_PRIMARY ((int)(sizeof primary_palette / sizeof primary_palette[0]))
#define N_REFERENCE ((int)(sizeof reference_palette / sizeof reference_palette[0]))

static char *dupstr(const char *s)
{
    if (!s)
        s = "";
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

sfi_plot *sfi_plot_new(int width, int height, int rows, int cols)
{
    if (width < 64 || width > 16384 || height < 64 || height > 16384 || rows < 1 || rows > 16 ||
        cols < 1 || cols > 16)
        return NULL;
    sfi_plot *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->panels = calloc((size_t)rows * (size_t)cols, sizeof *p->panels);
    if (!p->panels) {
        free(p);
        return NULL;
    }
    p->width = width;
    p->height = height;
    p->rows = rows;
    p->cols = cols;
    return p;
}

void sfi_plot_free(sfi_plot *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->rows * p->cols; i++) {
        panel *pn = &p->panels[i];
        free(pn->title);
        free(pn->xlabel);
        free(pn->ylabel);
        for (size_t j = 0; j < pn->ns; j++) {
            free(pn->s[j].label);
            free(pn->s[j].x);
            free(pn->s[j].y);
            free(pn->s[j].ylo);
        }
        free(pn->s);
        for (size_t j = 0; j < pn->nb; j++) {
            free(pn->b[j].label);
            free(pn->b[j].text);
        }
        free(pn->b);
        free(pn->note);
        if (pn->h) {
            free(pn->h->z);
            free(pn->h->zlabel);
            free(pn->h);
        }
    }
    for (int i = 0; i < p->n_colors; i++)
        free(p->color_labels[i]);
    free(p->color_labels);
    free(p->color_emph);
    free(p->color_idx);
    free(p->panels);
    free(p);
}

static sfi_status check_panel(const sfi_plot *p, int panel_i, sfi_error *err)
{
    if (!p)
        return sfi_error_set(err, SFI_EINVAL, "plot: no figure");
    if (panel_i < 0 || panel_i >= p->rows * p->cols)
        return sfi_error_set(err, SFI_EINVAL, "plot: panel %d outside 0..%d", panel_i,
                             p->rows * p->cols - 1);
    return SFI_OK;
}

sfi_status sfi_plot_axes(sfi_plot *p, int panel_i, const char *title, const char *xlabel,
                         const char *ylabel, unsigned flags, sfi_error *err)
{
    sfi_status st = check_panel(p, panel_i, err);
    if (st)
        return st;
    panel *pn = &p->panels[panel_i];
    char *t = dupstr(title), *xl = dupstr(xlabel), *yl = dupstr(ylabel);
    if (!t || !xl || !yl) {
        free(t);
        free(xl);
        free(yl);
        return sfi_error_set(err, SFI_ENOMEM, "plot: out of memory");
    }
    free(pn->title);
    free(pn->xlabel);
    free(pn->ylabel);
    pn->title = t;
    pn->xlabel = xl;
    pn->ylabel = yl;
    pn->flags = flags;
    return SFI_OK;
}

/* The colour index of a label (the first emphasis it was given wins). */
static int color_of(sfi_plot *p, const char *label, int emph, int *emph_out)
{
    for (int i = 0; i < p->n_colors; i++)
        if (!strcmp(p->color_labels[i], label)) {
            *emph_out = p->color_emph[i];
            return p->color_idx[i];
        }
    size_t n = (size_t)p->n_colors + 1;
    char **nl = realloc(p->color_labels, n * sizeof *nl);
    if (!nl)
        return -1;
    p->color_labels = nl;
    int *ne = realloc(p->color_emph, n * sizeof *ne);
    if (!ne)
        return -1;
    p->color_emph = ne;
    int *ni = realloc(p->color_idx, n * sizeof *ni);
    if (!ni)
        return -1;
    p->color_idx = ni;
    nl[p->n_colors] = dupstr(label);
    if (!nl[p->n_colors])
        return -1;
    ne[p->n_colors] = emph;
    ni[p->n_colors] = p->n_by_emph[emph]++;
    *emph_out = emph;
    return ni[p->n_colors++];
}

static sfi_status add_series(sfi_plot *p, int panel_i, const char *label, const double *x,
                             const double *ylo, const double *y, size_t n, int markers,
                             sfi_plot_emphasis emph, sfi_error *err)
{
    sfi_status st = check_panel(p, panel_i, err);
    if (st)
        return st;
    if (n == 0 || !x || !y)
        return sfi_error_set(err, SFI_EINVAL, "plot: series '%s' has no points",
                             label ? label : "");
    if ((unsigned)emph > SFI_PLOT_REFERENCE)
        return sfi_error_set(err, SFI_EINVAL, "plot: bad emphasis %d", (int)emph);
    panel *pn = &p->panels[panel_i];
    if (pn->nb)
        return sfi_error_set(err, SFI_EINVAL, "plot: panel %d is a bar chart", panel_i);
    series *ns = realloc(pn->s, (pn->ns + 1) * sizeof *ns);
    if (!ns)
        return sfi_error_set(err, SFI_ENOMEM, "plot: out of memory");
    pn->s = ns;
    series *s = &ns[pn->ns];
    memset(s, 0, sizeof *s);
    s->label = dupstr(label);
    s->x = malloc(n * sizeof *s->x);
    s->y = malloc(n * sizeof *s->y);
    s->ylo = ylo ? malloc(n * sizeof *s->ylo) : NULL;
    s->color = s->label ? color_of(p, s->label, (int)emph, &s->emph) : -1;
    if (!s->label || !s->x || !s->y || (ylo && !s->ylo) || s->color < 0) {
        free(s->label);
        free(s->x);
        free(s->y);
        free(s->ylo);
        return sfi_error_set(err, SFI_ENOMEM, "plot: out of memory");
    }
    memcpy(s->x, x, n * sizeof *x);
    memcpy(s->y, y, n * sizeof *y);
    if (ylo)
        memcpy(s->ylo, ylo, n * sizeof *ylo);
    s->n = n;
    s->markers = markers;
    pn->ns++;
    return SFI_OK;
}

sfi_status sfi_plot_line(sfi_plot *p, int panel_i, const char *label, const double *x,
                         const double *y, size_t n, int markers, sfi_error *err)
{
    return add_series(p, panel_i, label, x, NULL, y, n, markers, SFI_PLOT_PLAIN, err);
}

sfi_status sfi_plot_line_styled(sfi_plot *p, int panel_i, const char *label, const double *x,
                                const double *y, size_t n, int markers, sfi_plot_emphasis emphasis,
                                sfi_error *err)
{
    return add_series(p, panel_i, label, x, NULL, y, n, markers, emphasis, err);
}

sfi_status sfi_plot_band(sfi_plot *p, int panel_i, const char *label, const double *x,
                         const double *ylo, const double *yhi, size_t n, sfi_plot_emphasis emphasis,
                         sfi_error *err)
{
    if (!ylo)
        return sfi_error_set(err, SFI_EINVAL, "plot: band '%s' has no lower edge",
                             label ? label : "");
    return add_series(p, panel_i, label, x, ylo, yhi, n, 0, emphasis, err);
}

sfi_status sfi_plot_bar(sfi_plot *p, int panel_i, const char *label, double value, const char *text,
                        sfi_plot_emphasis emphasis, sfi_error *err)
{
    sfi_status st = check_panel(p, panel_i, err);
    if (st)
        return st;
    if ((unsigned)emphasis > SFI_PLOT_REFERENCE)
        return sfi_error_set(err, SFI_EINVAL, "plot: bad emphasis %d", (int)emphasis);
    panel *pn = &p->panels[panel_i];
    if (pn->ns || pn->h)
        return sfi_error_set(err, SFI_EINVAL, "plot: panel %d already holds lines", panel_i);
    bar *nb = realloc(pn->b, (pn->nb + 1) * sizeof *nb);
    if (!nb)
        return sfi_error_set(err, SFI_ENOMEM, "plot: out of memory");
    pn->b = nb;
    bar *b = &nb[pn->nb];
    memset(b, 0, sizeof *b);
    b->label = dupstr(label);
    b->text = text ? dupstr(text) : NULL;
    b->v = value;
    b->color = b->label ? color_of(p, b->label, (int)emphasis, &b->emph) : -1;
    if (!b->label || (text && !b->text) || b->color < 0) {
        free(b->label);
        free(b->text);
        return sfi_error_set(err, SFI_ENOMEM, "plot: out of memory");
    }
    pn->nb++;
    return SFI_OK;
}

sfi_status sfi_plot_note(sfi_plot *p, int panel_i, const char *text, sfi_error *err)
{
    sfi_status st = check_panel(p, panel_i, err);
    if (st)
        return st;
    char *t = dupstr(text);
    if (!t)
        return sfi_error_set(err, SFI_ENOMEM, "plot: out of memory");
    free(p->panels[panel_i].note);
    p->panels[panel_i].note = t;
    return SFI_OK;
}

sfi_status sfi_plot_heatmap(sfi_plot *p, int panel_i, const double *z, int nx, int ny, double x0,
                            double x1, double y0, double y1, const char *zlabel, sfi_error *err)
{
    sfi_status st = check_panel(p, panel_i, err);
    if (st)
        return st;
    if (!z || nx < 1 || ny < 1 || nx > 100000 || ny > 100000 || !(x1 > x0) || !(y1 > y0))
        return sfi_error_set(err, SFI_EINVAL,
                             "plot: heatmap needs nx, ny >= 1 and x1 > x0, y1 > y0");
    panel *pn = &p->panels[panel_i];
    if (pn->nb)
        return sfi_error_set(err, SFI_EINVAL, "plot: panel %d is a bar chart", panel_i);
    heatmap *h = calloc(1, sizeof *h);
    if (!h)
        return sfi_error_set(err, SFI_ENOMEM, "plot: out of memory");
    size_t cells = (size_t)nx * (size_t)ny;
    h->z = malloc(cells * sizeof *h->z);
    h->zlabel = dupstr(zlabel);
    if (!h->z || !h->zlabel) {
        free(h->z);
        free(h->zlabel);
        free(h);
        return sfi_error_set(err, SFI_ENOMEM, "plot: out of memory");
    }
    memcpy(h->z, z, cells * sizeof *z);
    h->nx = nx;
    h->ny = ny;
    h->x0 = x0;
    h->x1 = x1;
    h->y0 = y0;
    h->y1 = y1;
    if (pn->h) {
        free(pn->h->z);
        free(pn->h->zlabel);
        free(pn->h);
    }
    pn->h = h;
    return SFI_OK;
}

/* ---- drawing ---- */

typedef struct {
    double lo, hi;   /* data range (log10 of it on log axes) */
    int log;         /* 0 linear, 2 log2, 10 log10 */
    double px0, px1; /* pixel range */
} axis;

static double ax_fwd(const axis *a, double v)
{
    if (a->log == 2)
        v = log2(v);
    else if (a->log == 10)
        v = log10(v);
    return a->px0 + (v - a->lo) / (a->hi - a->lo) * (a->px1 - a->px0);
}

static int usable(const axis *a, double v)
{
    return isfinite(v) && (a->log == 0 || v > 0);
}

static void fit_range(axis *a, double mn, double mx, int include_zero)
{
    if (!(mn <= mx)) { /* no data */
        mn = a->log ? 1 : 0;
        mx = a->log ? 10 : 1;
    }
    if (a->log == 2) {
        mn = log2(mn);
        mx = log2(mx);
    } else if (a->log == 10) {
        mn = log10(mn);
        mx = log10(mx);
    } else if (include_zero) {
        if (mn > 0)
            mn = 0;
        if (mx < 0)
            mx = 0;
    }
    if (mx - mn < 1e-12 * (fabs(mx) + fabs(mn) + 1e-300)) {
        double d = fabs(mx) > 0 ? fabs(mx) * 0.1 : 1;
        mn -= d;
        mx += d;
    }
    double pad = (mx - mn) * 0.05;
    a->lo = mn - pad;
    a->hi = mx + pad;
    if (a->log == 0 && include_zero && mn >= 0)
        a->lo = mn;
}

static double nice_step(double span, int target)
{
    double raw = span / target;
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    double s = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
    return s * mag;
}

/* Tick values in data units; returns the count (at most max). */
static int ticks(const axis *a, double *t, int max)
{
    int n = 0;
    if (a->log == 10 && a->hi - a->lo < 2.5) {
        /* Under a few decades, powers of ten alone leave one tick or none:
         * add 2 and 5 (and under one decade, every integer multiple). */
        static const double few[] = {1, 2, 5}, all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
        const double *m = a->hi - a->lo < 1 ? all : few;
        int nm = a->hi - a->lo < 1 ? 9 : 3;
        for (double e = floor(a->lo); e <= ceil(a->hi) && n < max; e++)
            for (int i = 0; i < nm && n < max; i++) {
                double v = m[i] * pow(10.0, e), lv = log10(v);
                if (lv >= a->lo - 1e-9 && lv <= a->hi + 1e-9)
                    t[n++] = v;
            }
        return n;
    }
    if (a->log) {
        double lo = ceil(a->lo - 1e-9), hi = floor(a->hi + 1e-9);
        int every = 1;
        while ((hi - lo) / every + 1 > 9)
            every++;
        for (double e = lo; e <= hi && n < max; e += every)
            t[n++] = pow(a->log == 2 ? 2.0 : 10.0, e);
        return n;
    }
    double st = nice_step(a->hi - a->lo, 6);
    for (double v = ceil(a->lo / st) * st; v <= a->hi + st * 1e-9 && n < max; v += st)
        t[n++] = fabs(v) < st * 1e-9 ? 0 : v;
    return n;
}

static void tick_label(double v, unsigned kilo, char *buf, size_t n)
{
    if (kilo && v >= 1024 && fmod(v, 1024) == 0) {
        double k = v / 1024;
        if (k >= 1024 && fmod(k, 1024) == 0)
            snprintf(buf, n, "%gM", k / 1024);
        else
            snprintf(buf, n, "%gK", k);
    } else {
        snprintf(buf, n, "%g", v);
    }
}

static void text_at(cairo_t *cr, const char *s, double x, double y, double ax, double ay)
{
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    cairo_move_to(cr, x - e.x_bearing - ax * e.width, y - e.y_bearing - ay * e.height);
    cairo_show_text(cr, s);
}

static void viridis(double t, double *r, double *g, double *b)
{
    static const double c[5][3] = {{0.267, 0.005, 0.329},
                                   {0.229, 0.322, 0.546},
                                   {0.128, 0.567, 0.551},
                                   {0.369, 0.789, 0.383},
                                   {0.993, 0.906, 0.144}};
    if (!(t >= 0))
        t = 0;
    if (t > 1)
        t = 1;
    double f = t * 4;
    int i = (int)f;
    if (i > 3)
        i = 3;
    f -= i;
    *r = c[i][0] + f * (c[i + 1][0] - c[i][0]);
    *g = c[i][1] + f * (c[i + 1][1] - c[i][1]);
    *b = c[i][2] + f * (c[i + 1][2] - c[i][2]);
}

/* Colour, dash and line width of a series (n points: long series get
 * thinner lines so that they stay readable). */
static void rgb_of(int emph, int color, double *rgb, int *dashed)
{
    const double *c;
    int n;
    if (emph == SFI_PLOT_PRIMARY) {
        c = primary_palette[color % N_PRIMARY];
        n = N_PRIMARY;
    } else if (emph == SFI_PLOT_REFERENCE) {
        c = reference_palette[color % N_REFERENCE];
        n = N_REFERENCE;
    } else {
        c = palette[color % N_PALETTE];
        n = N_PALETTE;
    }
    rgb[0] = c[0];
    rgb[1] = c[1];
    rgb[2] = c[2];
    *dashed = emph == SFI_PLOT_REFERENCE || color >= n;
}

static void set_style(cairo_t *cr, int emph, int color, size_t n)
{
    double c[3];
    int dashed;
    rgb_of(emph, color, c, &dashed);
    cairo_set_source_rgb(cr, c[0], c[1], c[2]);
    if (dashed) {
        static const double dash[] = {8, 4};
        cairo_set_dash(cr, dash, 2, 0);
    } else {
        cairo_set_dash(cr, NULL, 0, 0);
    }
    double w = emph == SFI_PLOT_PRIMARY ? 3.5 : emph == SFI_PLOT_REFERENCE ? 2.5 : 1.6;
    if (n > 400)
        w = emph == SFI_PLOT_PLAIN ? 1.0 : 1.6;
    cairo_set_line_width(cr, w);
}

#define TITLE_LINE 18.0

static void note_box(cairo_t *cr, const char *text, double cx, double cy)
{
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 13);
    cairo_text_extents_t e;
    cairo_text_extents(cr, text, &e);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_rectangle(cr, cx - e.width / 2 - 8, cy - e.height / 2 - 6, e.width + 16, e.height + 12);
    cairo_fill_preserve(cr);
    cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
    cairo_set_line_width(cr, 1);
    cairo_set_dash(cr, NULL, 0, 0);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text_at(cr, text, cx, cy, 0.5, 0.5);
}

static void draw_title_and_labels(cairo_t *cr, const panel *pn, double X, double Y, const axis *ax,
                                  const axis *ay)
{
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_line_width(cr, 1);
    cairo_set_dash(cr, NULL, 0, 0);
    cairo_rectangle(cr, ax->px0, ay->px1, ax->px1 - ax->px0, ay->px0 - ay->px1);
    cairo_stroke(cr);
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 13);
    text_at(cr, pn->xlabel ? pn->xlabel : "", (ax->px0 + ax->px1) / 2, ay->px0 + 28, 0.5, 0);
    if (pn->ylabel && pn->ylabel[0]) {
        cairo_save(cr);
        cairo_translate(cr, X + 14, (ay->px0 + ay->px1) / 2);
        cairo_rotate(cr, -M_PI / 2);
        text_at(cr, pn->ylabel, 0, 0, 0.5, 0.5);
        cairo_restore(cr);
    }
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 14);
    /* One line per '\n' of the title; the first bold, the rest normal. */
    const char *t = pn->title ? pn->title : "";
    double ty = Y + 8;
    for (int line = 0;; line++) {
        size_t len = strcspn(t, "\n");
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), t);
        text_at(cr, buf, (ax->px0 + ax->px1) / 2, ty, 0.5, 0);
        if (!t[len])
            break;
        t += len + 1;
        ty += TITLE_LINE;
        if (line == 0) {
            cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                                   CAIRO_FONT_WEIGHT_NORMAL);
            cairo_set_font_size(cr, 13);
        }
    }
}

/* Space the title takes above the axes. */
static double title_height(const panel *pn)
{
    int lines = 1;
    for (const char *c = pn->title; c && *c; c++)
        lines += *c == '\n';
    return 32 + TITLE_LINE * (lines - 1);
}

/* The panel's note, or "no data" where nothing could be drawn: centred on
 * empty axes, low and out of the way on drawn ones. */
static void panel_note(cairo_t *cr, const panel *pn, const axis *ax, const axis *ay, int has_data)
{
    if (!has_data)
        note_box(cr, pn->note ? pn->note : "no data", (ax->px0 + ax->px1) / 2,
                 (ay->px0 + ay->px1) / 2);
    else if (pn->note)
        note_box(cr, pn->note, (ax->px0 + ax->px1) / 2, ay->px0 - 18);
}

/* A horizontal bar chart: one category a row, the value axis along x. */
static void draw_bars(cairo_t *cr, const panel *pn, double X, double Y, double W, double H)
{
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    double label_w = 0, text_w = 0;
    for (size_t i = 0; i < pn->nb; i++) {
        cairo_text_extents_t e;
        cairo_text_extents(cr, pn->b[i].label, &e);
        label_w = fmax(label_w, e.x_advance);
        if (pn->b[i].text) {
            cairo_text_extents(cr, pn->b[i].text, &e);
            text_w = fmax(text_w, e.x_advance);
        }
    }
    axis ax = {.log = 0}, ay = {.log = 0};
    ax.px0 = X + 20 + label_w + 8;
    ax.px1 = X + W - 20 - text_w - 8;
    if (ax.px1 - ax.px0 < 40)
        ax.px1 = ax.px0 + 40;
    ay.px0 = Y + H - 50;
    ay.px1 = Y + title_height(pn);
    double mx = -INFINITY, mn = INFINITY;
    for (size_t i = 0; i < pn->nb; i++)
        if (isfinite(pn->b[i].v)) {
            mx = fmax(mx, pn->b[i].v);
            mn = fmin(mn, pn->b[i].v);
        }
    int has_data = mx >= mn;
    fit_range(&ax, mn, mx, 1);
    if (has_data && mn >= 0)
        ax.lo = 0;
    if (has_data) /* room for the value labels inside the frame */
        ax.hi += (ax.hi - ax.lo) * 0.06;
    if (has_data) {
        double tv[64];
        char buf[32];
        int nt = ticks(&ax, tv, 64);
        cairo_set_line_width(cr, 1);
        for (int k = 0; k < nt; k++) {
            double px = ax_fwd(&ax, tv[k]);
            cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
            cairo_move_to(cr, px, ay.px0);
            cairo_line_to(cr, px, ay.px1);
            cairo_stroke(cr);
            cairo_set_source_rgb(cr, 0, 0, 0);
            cairo_move_to(cr, px, ay.px0);
            cairo_line_to(cr, px, ay.px0 + 5);
            cairo_stroke(cr);
            tick_label(tv[k], 0, buf, sizeof buf);
            text_at(cr, buf, px, ay.px0 + 8, 0.5, 0);
        }
    }
    double slot = (ay.px0 - ay.px1) / (double)(pn->nb ? pn->nb : 1);
    double x0 = ax_fwd(&ax, ax.lo < 0 && ax.hi > 0 ? 0 : ax.lo);
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    for (size_t i = 0; i < pn->nb; i++) {
        const bar *b = &pn->b[i];
        double cy = ay.px1 + (i + 0.5) * slot, h = fmin(slot * 0.7, 28);
        cairo_set_source_rgb(cr, 0, 0, 0);
        if (b->emph != SFI_PLOT_PLAIN)
            cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                                   CAIRO_FONT_WEIGHT_BOLD);
        text_at(cr, b->label, ax.px0 - 8, cy, 1, 0.5);
        cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                               CAIRO_FONT_WEIGHT_NORMAL);
        if (!isfinite(b->v)) {
            cairo_set_source_rgb(cr, 0.45, 0.45, 0.45);
            if (b->text)
                text_at(cr, b->text, x0 + 6, cy, 0, 0.5);
            continue;
        }
        double c[3];
        int dashed;
        rgb_of(b->emph, b->color, c, &dashed);
        double px = ax_fwd(&ax, b->v);
        cairo_set_source_rgb(cr, c[0], c[1], c[2]);
        cairo_rectangle(cr, fmin(x0, px), cy - h / 2, fabs(px - x0), h);
        cairo_fill(cr);
        if (b->emph == SFI_PLOT_REFERENCE) { /* hatched outline: the baseline */
            cairo_set_source_rgb(cr, 1, 1, 1);
            cairo_set_line_width(cr, 1.5);
            static const double dash[] = {4, 4};
            cairo_set_dash(cr, dash, 2, 0);
            cairo_move_to(cr, fmin(x0, px), cy);
            cairo_line_to(cr, fmax(x0, px), cy);
            cairo_stroke(cr);
            cairo_set_dash(cr, NULL, 0, 0);
        }
        if (b->text) {
            cairo_set_source_rgb(cr, 0, 0, 0);
            text_at(cr, b->text, fmax(x0, px) + 5, cy, 0, 0.5);
        }
    }
    draw_title_and_labels(cr, pn, X, Y, &ax, &ay);
    panel_note(cr, pn, &ax, &ay, has_data);
}

/* Series i has a legend entry: a label, the first series with it. */
static int in_legend(const panel *pn, size_t i)
{
    if (!pn->s[i].label[0])
        return 0;
    for (size_t j = 0; j < i; j++)
        if (!strcmp(pn->s[i].label, pn->s[j].label))
            return 0;
    return 1;
}

/* Legend width from the labels actually present (font: 12 pt normal). */
static double legend_width(cairo_t *cr, const panel *pn)
{
    double legend_w = 0;
    for (size_t i = 0; i < pn->ns; i++) {
        if (!in_legend(pn, i))
            continue;
        cairo_text_extents_t e;
        cairo_text_extents(cr, pn->s[i].label, &e);
        /* + room for the swatch, and for bold labels of emphasised series */
        if (e.x_advance + 48 > legend_w)
            legend_w = e.x_advance + 48;
    }
    return legend_w;
}

/* The heatmap's colour range: its finite values' extent, never empty. */
static void heatmap_range(const heatmap *h, double *zmn, double *zmx)
{
    *zmn = INFINITY;
    *zmx = -INFINITY;
    for (size_t k = 0; k < (size_t)h->nx * (size_t)h->ny; k++)
        if (isfinite(h->z[k])) {
            *zmn = fmin(*zmn, h->z[k]);
            *zmx = fmax(*zmx, h->z[k]);
        }
    if (!(*zmn <= *zmx))
        *zmn = 0, *zmx = 1;
    if (*zmx == *zmn)
        *zmx = *zmn + 1;
}

/* The axes' ranges from the drawable points (and the heatmap's extent).
 * The x range spans every x given, also where y is missing, so that panels
 * of the same x values line up. Returns whether there is a single
 * drawable point: without one there is no scale to read. */
static int fit_axes(const panel *pn, axis *ax, axis *ay)
{
    double xmn = INFINITY, xmx = -INFINITY, ymn = INFINITY, ymx = -INFINITY;
    double xall_mn = INFINITY, xall_mx = -INFINITY;
    for (size_t i = 0; i < pn->ns; i++)
        for (size_t k = 0; k < pn->s[i].n; k++) {
            double x = pn->s[i].x[k], y = pn->s[i].y[k];
            if (usable(ax, x)) {
                xall_mn = fmin(xall_mn, x);
                xall_mx = fmax(xall_mx, x);
            }
            if (!usable(ax, x) || !usable(ay, y))
                continue;
            if (pn->s[i].ylo && !usable(ay, pn->s[i].ylo[k]))
                continue;
            xmn = fmin(xmn, x);
            xmx = fmax(xmx, x);
            ymn = fmin(ymn, y);
            ymx = fmax(ymx, y);
            if (pn->s[i].ylo)
                ymn = fmin(ymn, pn->s[i].ylo[k]);
        }
    if (pn->h) {
        xmn = fmin(xmn, pn->h->x0);
        xmx = fmax(xmx, pn->h->x1);
        ymn = fmin(ymn, pn->h->y0);
        ymx = fmax(ymx, pn->h->y1);
    }
    int has_data = xmn <= xmx && ymn <= ymx;
    if (has_data) {
        xmn = fmin(xmn, xall_mn);
        xmx = fmax(xmx, xall_mx);
    }
    fit_range(ax, xmn, xmx, 0);
    fit_range(ay, ymn, ymx, (pn->flags & SFI_PLOT_YZERO) != 0);
    if (pn->h) { /* heatmaps fill the axes exactly */
        ax->lo = pn->h->x0;
        ax->hi = pn->h->x1;
        ay->lo = pn->h->y0;
        ay->hi = pn->h->y1;
    }
    return has_data;
}

/* Heatmap cells and the colour bar to the right of the axes. */
static void draw_heatmap(cairo_t *cr, const heatmap *h, const axis *ax, const axis *ay)
{
    double zmn, zmx;
    heatmap_range(h, &zmn, &zmx);
    double cw = (ax->px1 - ax->px0) / h->nx, ch = (ay->px0 - ay->px1) / h->ny;
    for (int iy = 0; iy < h->ny; iy++)
        for (int ix = 0; ix < h->nx; ix++) {
            double v = h->z[(size_t)iy * h->nx + ix], r, g, b;
            if (!isfinite(v))
                r = g = b = 0.9;
            else
                viridis((v - zmn) / (zmx - zmn), &r, &g, &b);
            cairo_set_source_rgb(cr, r, g, b);
            cairo_rectangle(cr, ax->px0 + ix * cw, ay->px0 - (iy + 1) * ch, cw + 0.5, ch + 0.5);
            cairo_fill(cr);
        }
    double bx = ax->px1 + 15, bw = 16, by0 = ay->px0, by1 = ay->px1;
    for (int k = 0; k < 128; k++) {
        double r, g, b;
        viridis((k + 0.5) / 128, &r, &g, &b);
        cairo_set_source_rgb(cr, r, g, b);
        cairo_rectangle(cr, bx, by0 - (k + 1) * (by0 - by1) / 128, bw, (by0 - by1) / 128 + 0.5);
        cairo_fill(cr);
    }
    axis az = {.lo = zmn, .hi = zmx, .px0 = by0, .px1 = by1};
    double tv[32];
    int nt = ticks(&az, tv, 32);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, bx, by1, bw, by0 - by1);
    cairo_stroke(cr);
    for (int k = 0; k < nt; k++) {
        double py = ax_fwd(&az, tv[k]);
        char buf[32];
        cairo_move_to(cr, bx + bw, py);
        cairo_line_to(cr, bx + bw + 4, py);
        cairo_stroke(cr);
        tick_label(tv[k], 0, buf, sizeof buf);
        text_at(cr, buf, bx + bw + 6, py, 0, 0.5);
    }
    cairo_save(cr);
    cairo_translate(cr, bx + bw + 56, (by0 + by1) / 2);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, h->zlabel, 0, 0, 0.5, 0.5);
    cairo_restore(cr);
}

/* Grid lines (not over a heatmap), ticks and tick labels of both axes. */
static void draw_grid(cairo_t *cr, const panel *pn, const axis *ax, const axis *ay)
{
    double tv[64];
    char buf[32];
    int nt = ticks(ax, tv, 64);
    cairo_set_line_width(cr, 1);
    for (int k = 0; k < nt; k++) {
        double px = ax_fwd(ax, tv[k]);
        if (!pn->h) {
            cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
            cairo_move_to(cr, px, ay->px0);
            cairo_line_to(cr, px, ay->px1);
            cairo_stroke(cr);
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, px, ay->px0);
        cairo_line_to(cr, px, ay->px0 + 5);
        cairo_stroke(cr);
        tick_label(tv[k], pn->flags & SFI_PLOT_XKILO, buf, sizeof buf);
        text_at(cr, buf, px, ay->px0 + 8, 0.5, 0);
    }
    nt = ticks(ay, tv, 64);
    for (int k = 0; k < nt; k++) {
        double py = ax_fwd(ay, tv[k]);
        if (!pn->h) {
            cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
            cairo_move_to(cr, ax->px0, py);
            cairo_line_to(cr, ax->px1, py);
            cairo_stroke(cr);
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_move_to(cr, ax->px0 - 5, py);
        cairo_line_to(cr, ax->px0, py);
        cairo_stroke(cr);
        tick_label(tv[k], 0, buf, sizeof buf);
        text_at(cr, buf, ax->px0 - 8, py, 1, 0.5);
    }
}

/* A band series: one filled polygon per run of drawable points. */
static void draw_band(cairo_t *cr, const series *s, const axis *ax, const axis *ay)
{
    double c[3];
    int dashed;
    rgb_of(s->emph, s->color, c, &dashed);
    cairo_set_source_rgba(cr, c[0], c[1], c[2], 0.18);
    size_t k = 0;
    while (k < s->n) {
        size_t k1 = k;
        while (k1 < s->n && usable(ax, s->x[k1]) && usable(ay, s->y[k1]) && usable(ay, s->ylo[k1]))
            k1++;
        if (k1 > k) {
            for (size_t j = k; j < k1; j++)
                cairo_line_to(cr, ax_fwd(ax, s->x[j]), ax_fwd(ay, s->y[j]));
            for (size_t j = k1; j-- > k;)
                cairo_line_to(cr, ax_fwd(ax, s->x[j]), ax_fwd(ay, s->ylo[j]));
            cairo_close_path(cr);
            cairo_fill(cr);
        }
        k = k1 + 1;
    }
}

/* A line series (broken where a point is not drawable), with markers. */
static void draw_line(cairo_t *cr, const series *s, const axis *ax, const axis *ay)
{
    set_style(cr, s->emph, s->color, s->n);
    int pen = 0;
    for (size_t k = 0; k < s->n; k++) {
        if (!usable(ax, s->x[k]) || !usable(ay, s->y[k])) {
            pen = 0;
            continue;
        }
        double px = ax_fwd(ax, s->x[k]), py = ax_fwd(ay, s->y[k]);
        if (pen)
            cairo_line_to(cr, px, py);
        else
            cairo_move_to(cr, px, py);
        pen = 1;
    }
    cairo_stroke(cr);
    if (s->markers) {
        cairo_set_dash(cr, NULL, 0, 0);
        double rad = s->emph == SFI_PLOT_PRIMARY ? 4.5 : 3;
        for (size_t k = 0; k < s->n; k++)
            if (usable(ax, s->x[k]) && usable(ay, s->y[k])) {
                cairo_arc(cr, ax_fwd(ax, s->x[k]), ax_fwd(ay, s->y[k]), rad, 0, 2 * M_PI);
                cairo_fill(cr);
            }
    }
}

/* Series, clipped to the axes: bands, then plain lines, the reference,
 * and the primary series on top. */
static void draw_series(cairo_t *cr, const panel *pn, const axis *ax, const axis *ay)
{
    cairo_save(cr);
    cairo_rectangle(cr, ax->px0, ay->px1, ax->px1 - ax->px0, ay->px0 - ay->px1);
    cairo_clip(cr);
    for (size_t i = 0; i < pn->ns; i++)
        if (pn->s[i].ylo)
            draw_band(cr, &pn->s[i], ax, ay);
    static const int order[] = {SFI_PLOT_PLAIN, SFI_PLOT_REFERENCE, SFI_PLOT_PRIMARY};
    for (int o = 0; o < 3; o++)
        for (size_t i = 0; i < pn->ns; i++)
            if (!pn->s[i].ylo && pn->s[i].emph == order[o])
                draw_line(cr, &pn->s[i], ax, ay);
    cairo_restore(cr);
    cairo_set_dash(cr, NULL, 0, 0);
}

/* The legend to the right of the axes (and of a heatmap's colour bar). */
static void draw_legend(cairo_t *cr, const panel *pn, const axis *ax, const axis *ay)
{
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    double ly = ay->px1 + 4, lx = ax->px1 + 12 + (pn->h ? 90 : 0);
    for (size_t i = 0; i < pn->ns; i++) {
        if (!in_legend(pn, i))
            continue;
        const series *s = &pn->s[i];
        if (s->ylo) { /* a band alone: a filled swatch */
            double c[3];
            int dashed;
            rgb_of(s->emph, s->color, c, &dashed);
            cairo_set_source_rgba(cr, c[0], c[1], c[2], 0.35);
            cairo_rectangle(cr, lx, ly + 2, 24, 10);
            cairo_fill(cr);
        } else {
            set_style(cr, s->emph, s->color, 0);
            cairo_move_to(cr, lx, ly + 7);
            cairo_line_to(cr, lx + 24, ly + 7);
            cairo_stroke(cr);
        }
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
        if (s->emph != SFI_PLOT_PLAIN)
            cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                                   CAIRO_FONT_WEIGHT_BOLD);
        text_at(cr, s->label, lx + 30, ly + 7, 0, 0.5);
        cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                               CAIRO_FONT_WEIGHT_NORMAL);
        ly += 17;
    }
}

/* One cell of the grid: bars, or axes with series and a heatmap. */
static void draw_panel(cairo_t *cr, const panel *pn, double X, double Y, double W, double H)
{
    if (pn->nb) {
        draw_bars(cr, pn, X, Y, W, H);
        return;
    }
    if (!pn->title && !pn->ns && !pn->h && !pn->note)
        return; /* an unused cell of the grid */
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    double right = 15 + legend_width(cr, pn) + (pn->h ? 90 : 0);
    axis ax = {.log = (pn->flags & SFI_PLOT_XLOG2) ? 2 : (pn->flags & SFI_PLOT_XLOG10) ? 10 : 0};
    axis ay = {.log = (pn->flags & SFI_PLOT_YLOG10) ? 10 : 0};
    ax.px0 = X + 75;
    ax.px1 = X + W - right;
    ay.px0 = Y + H - 50;
    ay.px1 = Y + title_height(pn);
    if (ax.px1 - ax.px0 < 20)
        ax.px1 = ax.px0 + 20;
    int has_data = fit_axes(pn, &ax, &ay);
    if (pn->h)
        draw_heatmap(cr, pn->h, &ax, &ay);
    if (has_data)
        draw_grid(cr, pn, &ax, &ay);
    draw_series(cr, pn, &ax, &ay);
    draw_title_and_labels(cr, pn, X, Y, &ax, &ay);
    if (has_data)
        draw_legend(cr, pn, &ax, &ay);
    panel_note(cr, pn, &ax, &ay, has_data);
}

static cairo_status_t write_stream(void *closure, const unsigned char *data, unsigned int len)
{
    return fwrite(data, 1, len, (FILE *)closure) == len ? CAIRO_STATUS_SUCCESS
                                                        : CAIRO_STATUS_WRITE_ERROR;
}

sfi_status sfi_plot_write_png(const sfi_plot *p, const char *path, sfi_error *err)
{
    if (!p || !path || !path[0])
        return sfi_error_set(err, SFI_EINVAL, "plot: no figure or no output path");
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, p->width, p->height);
    if (cairo_surface_status(sf) != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(sf);
        return sfi_error_set(err, SFI_ENOMEM, "%s: cannot create a %dx%d image", path, p->width,
                             p->height);
    }
    cairo_t *cr = cairo_create(sf);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    double cw = (double)p->width / p->cols, ch = (double)p->height / p->rows;
    for (int r = 0; r < p->rows; r++)
        for (int c = 0; c < p->cols; c++)
            draw_panel(cr, &p->panels[r * p->cols + c], c * cw, r * ch, cw, ch);
    cairo_status_t cst = cairo_status(cr);
    cairo_destroy(cr);
    if (cst != CAIRO_STATUS_SUCCESS) {
        cairo_surface_destroy(sf);
        return sfi_error_set(err, SFI_EIO, "%s: drawing failed: %s", path,
                             cairo_status_to_string(cst));
    }

    sfi_out *o;
    FILE *f;
    sfi_status st = sfi_out_open(path, &o, &f, err);
    if (st) {
        cairo_surface_destroy(sf);
        return st;
    }
    errno = 0;
    cst = cairo_surface_write_to_png_stream(sf, write_stream, f);
    int e = errno;
    cairo_surface_destroy(sf);
    if (cst != CAIRO_STATUS_SUCCESS) {
        sfi_out_abort(o);
        /* write_stream reports a failed fwrite as a write error. */
        return sfi_error_set(err, SFI_EIO, "%s: cannot write PNG: %s", path,
                             cst == CAIRO_STATUS_WRITE_ERROR && e ? strerror(e)
                                                                  : cairo_status_to_string(cst));
    }
    return sfi_out_commit(o, 0, err);
}

void sfi_plot_release_fonts(void)
{
    cairo_debug_reset_static_data();
    FcFini();
}
