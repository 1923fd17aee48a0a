/* Progress lines on stderr (see sfi_progress.h). */
#include <config.h>

#include "sfi_progress.h"

#include <stdio.h>
#include <unistd.h>

#include "sfi_clock.h"

/* Set once by the program before its threads start; read-only after. */
static int enabled;

int sfi_progress_enable(int on)
{
    enabled = on && isatty(fileno(stderr));
    return enabled;
}

void sfi_progress_begin(sfi_progress *p, const char *what, const char *unit, long long total)
{
    p->what = what;
    p->unit = unit;
    p->total = total;
    p->on = enabled;
    p->width = 0;
    p->t0 = p->on ? sfi_clock_wall() : 0.0;
    p->drawn_at = p->t0;
}

void sfi_progress_update(sfi_progress *p, long long done)
{
    if (!p->on)
        return;
    double now = sfi_clock_wall(), el = now - p->t0;
    if (el < SFI_PROGRESS_DELAY || (p->width && now - p->drawn_at < SFI_PROGRESS_INTERVAL))
        return;
    char line[160];
    int n;
    if (p->total > 0 && done > 0) {
        double left = el * (double)(p->total - done) / (double)done;
        n = snprintf(line, sizeof line, "%s: %lld/%lld %s (%d%%), %.0f s, about %.0f s left",
                     p->what, done, p->total, p->unit, (int)(100 * done / p->total), el, left);
    } else {
        n = snprintf(line, sizeof line, "%s: %lld %s, %.0f s", p->what, done, p->unit, el);
    }
    if (n < 0)
        return;
    if (n >= (int)sizeof line)
        n = (int)sizeof line - 1;
    /* Pad over the previous line's tail: no terminal escapes needed. */
    fprintf(stderr, "\r%-*s", n > p->width ? n : p->width, line);
    fflush(stderr);
    p->width = n;
    p->drawn_at = now;
}

void sfi_progress_end(sfi_progress *p)
{
    if (p->on && p->width) {
        fprintf(stderr, "\r%*s\r", p->width, "");
        fflush(stderr);
    }
    p->width = 0;
}
