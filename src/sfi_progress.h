/* Progress of the runs that take minutes (a long prefill, the decode steps
 * of sfi-ref run, recording a trace): one line on stderr, redrawn in place
 * and erased at the end. Silent unless the program turned it on
 * (sfi_progress_enable) and stderr is a terminal, so that pipes, logs and
 * the tests never see it; a run shorter than SFI_PROGRESS_DELAY seconds
 * draws nothing even then. The library reports from its long loops; only a
 * command turns it on, once, before any thread starts. */
#ifndef SFI_PROGRESS_H
#define SFI_PROGRESS_H

#define SFI_PROGRESS_DELAY 1.0    /* seconds before the first line */
#define SFI_PROGRESS_INTERVAL 0.2 /* seconds between redraws */

typedef struct {
    const char *what, *unit; /* "prefill", "tokens": static strings */
    long long total;         /* units of the whole run (0: unknown) */
    double t0, drawn_at;     /* sfi_clock_wall() at begin, at the last draw */
    int on, width;           /* width: characters of the last line drawn */
} sfi_progress;

/* Turns progress on for this process when on is nonzero and stderr is a
 * terminal, off otherwise; returns whether it is on. */
int sfi_progress_enable(int on);

/* Starts a run of total units; draws nothing yet. */
void sfi_progress_begin(sfi_progress *p, const char *what, const char *unit, long long total);
/* done units of the run are finished: redraws when the line is due. */
void sfi_progress_update(sfi_progress *p, long long done);
/* Erases the line if one was drawn. */
void sfi_progress_end(sfi_progress *p);

#endif
