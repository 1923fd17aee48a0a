/* src/sfi_progress.c: silent off a terminal and before the delay, one line
 * redrawn in place and erased on a terminal (a pseudo-terminal here). */
#include <config.h>

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sfi_progress.h"
#include "sfi_test_util.h"

static void past_delay(void)
{
    struct timespec ts = {.tv_sec = (time_t)SFI_PROGRESS_DELAY, .tv_nsec = 200000000L};
    nanosleep(&ts, NULL);
}

/* Everything readable from fd now (non-blocking), NUL-terminated. */
static size_t drain(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r > 0 && (n += (size_t)r) < cap - 1)
            continue;
        if (r < 0 && errno == EINTR)
            continue;
        break;
    }
    buf[n] = '\0';
    return n;
}

/* stderr becomes the slave side of a new pseudo-terminal; returns the
 * master's fd. */
static int stderr_on_pty(void)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    ck_assert_int_ge(m, 0);
    ck_assert_int_eq(grantpt(m), 0);
    ck_assert_int_eq(unlockpt(m), 0);
    int s = open(ptsname(m), O_RDWR | O_NOCTTY);
    ck_assert_int_ge(s, 0);
    fflush(stderr);
    ck_assert_int_ge(dup2(s, STDERR_FILENO), 0);
    close(s);
    return m;
}

START_TEST(off_a_terminal_nothing_is_written)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    fflush(stderr);
    ck_assert_int_ge(dup2(fds[1], STDERR_FILENO), 0);
    ck_assert_int_eq(sfi_progress_enable(1), 0);
    sfi_progress p;
    sfi_progress_begin(&p, "prefill", "tokens", 10);
    past_delay();
    sfi_progress_update(&p, 5);
    sfi_progress_end(&p);
    fflush(stderr);
    char buf[256];
    ck_assert_uint_eq(drain(fds[0], buf, sizeof buf), 0);
}
END_TEST

START_TEST(on_a_terminal_one_line_is_drawn_and_erased)
{
    int m = stderr_on_pty();
    ck_assert_int_eq(sfi_progress_enable(1), 1);
    char buf[1024];
    sfi_progress p;
    /* Shorter than the delay: nothing. */
    sfi_progress_begin(&p, "prefill", "tokens", 10);
    sfi_progress_update(&p, 10);
    sfi_progress_end(&p);
    ck_assert_uint_eq(drain(m, buf, sizeof buf), 0);
    /* Longer: the line, then spaces over it. */
    sfi_progress_begin(&p, "prefill", "tokens", 10);
    past_delay();
    sfi_progress_update(&p, 5);
    /* "1 s, about 1 s left" on an idle machine; the seconds are not pinned */
    const char *head = "\rprefill: 5/10 tokens (50%), ", *tail = " s left";
    size_t n = drain(m, buf, sizeof buf);
    ck_assert_msg(n > strlen(head) + strlen(tail) && strncmp(buf, head, strlen(head)) == 0 &&
                      strcmp(buf + n - strlen(tail), tail) == 0,
                  "drew '%s'", buf + 1);
    size_t width = n - 1;
    sfi_progress_update(&p, 6); /* within the redraw interval: nothing */
    ck_assert_uint_eq(drain(m, buf, sizeof buf), 0);
    sfi_progress_end(&p);
    ck_assert_uint_eq(drain(m, buf, sizeof buf), width + 2);
    ck_assert(buf[0] == '\r' && buf[width + 1] == '\r' && strspn(buf + 1, " ") == width);
    /* Turned off, even on a terminal: nothing. */
    ck_assert_int_eq(sfi_progress_enable(0), 0);
    sfi_progress_begin(&p, "prefill", "tokens", 10);
    past_delay();
    sfi_progress_update(&p, 5);
    sfi_progress_end(&p);
    ck_assert_uint_eq(drain(m, buf, sizeof buf), 0);
    close(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("progress");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, off_a_terminal_nothing_is_written);
    tcase_add_test(tc, on_a_terminal_one_line_is_drawn_and_erased);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
