/* Clocks for timings, in seconds as doubles: wall time (monotonic, never
 * stepped by clock changes) and CPU time, which stays meaningful on a
 * machine shared with other work. Every timing of the project (run
 * reports, evaluations, benchmarks) reads these. */
#ifndef SFI_CLOCK_H
#define SFI_CLOCK_H

/* CLOCK_MONOTONIC: only differences mean something. */
double sfi_clock_wall(void);
/* CPU time of the whole process, all threads. */
double sfi_clock_cpu(void);
/* CPU time of the calling thread. */
double sfi_clock_thread_cpu(void);

#endif
