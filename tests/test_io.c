/* Check suite of src/sfi_io.c: whole-file reads with a limit, and the
 * output rule every command follows (issue 20): a regular file is replaced
 * whole through a temporary file, a symbolic link is followed, devices and
 * FIFOs are written through, anything else is refused; no temporary file
 * survives a failure, a size limit or a fatal signal. The commands' own
 * outputs (sweep -o, --png, --timeline-png, validate --fit) are checked
 * through the built sfi-sim. */
#include <config.h>

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sfi_io.h"
#include "sfi_plot.h"
#include "sfi_test_util.h"

/* Entries of dir whose name contains ".tmp" (left-over temporary files). */
static int count_temps(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".tmp") != NULL;
    closedir(d);
    return n;
}

static mode_t mode_of(const char *path)
{
    struct stat sb;
    ck_assert_int_eq(lstat(path, &sb), 0);
    return sb.st_mode;
}

START_TEST(read_limits)
{
    char *dir = sfi_test_tmpdir(), path[4200];
    sfi_error e;
    char *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/ten", dir);
    ck_assert_int_eq(sfi_test_write_file(path, "0123456789", 10), 0);
    ck_assert_int_eq(sfi_io_read(path, 10, "a test file", &buf, &len, &e), SFI_OK);
    ck_assert_int_eq(len, 10);
    ck_assert_str_eq(buf, "0123456789");
    free(buf);
    ck_assert_int_eq(sfi_io_read(path, 9, "a test file", &buf, &len, &e), SFI_ERANGE);
    ck_assert_ptr_null(buf);
    ck_assert_ptr_nonnull(strstr(e.msg, "ten: 10 bytes is too large for a test file (limit 9)"));
    /* Endless and piped inputs are read up to the limit only. */
    ck_assert_int_eq(sfi_io_read("/dev/zero", 100000, "a test file", &buf, &len, &e), SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "/dev/zero: more than 100000 bytes is too large"));
    FILE *p = popen("head -c 200000 /dev/zero", "r");
    ck_assert_ptr_nonnull(p);
    char fdpath[64];
    snprintf(fdpath, sizeof fdpath, "/dev/fd/%d", fileno(p));
    ck_assert_int_eq(sfi_io_read(fdpath, 200000, "a test file", &buf, &len, &e), SFI_OK);
    ck_assert_int_eq(len, 200000);
    ck_assert_int_eq(buf[len], 0);
    free(buf);
    pclose(p);
    p = popen("head -c 200001 /dev/zero", "r");
    ck_assert_int_eq(sfi_io_read_stream(p, "stdin", 200000, "a test file", &buf, &len, &e),
                     SFI_ERANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "stdin: more than 200000 bytes"));
    pclose(p);
    /* A FIFO nobody writes to reads as empty at once (a vocab.json or
     * config.json FIFO once hung the command). */
    snprintf(path, sizeof path, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(sfi_io_read(path, 10, "a test file", &buf, &len, &e), SFI_OK);
    ck_assert_int_eq(len, 0);
    free(buf);
    /* Empty, missing, directory. */
    snprintf(path, sizeof path, "%s/empty", dir);
    ck_assert_int_eq(sfi_test_write_file(path, "", 0), 0);
    ck_assert_int_eq(sfi_io_read(path, 10, "a test file", &buf, &len, &e), SFI_OK);
    ck_assert_int_eq(len, 0);
    free(buf);
    snprintf(path, sizeof path, "%s/none", dir);
    ck_assert_int_eq(sfi_io_read(path, 10, "a test file", &buf, &len, &e), SFI_ENOTFOUND);
    ck_assert_int_eq(sfi_io_read(dir, 10, "a test file", &buf, &len, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, ": is a directory, not a test file"));
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(out_regular_files)
{
    char *dir = sfi_test_tmpdir(), path[4200];
    sfi_error e;
    mode_t old = umask(022);
    snprintf(path, sizeof path, "%s/new.csv", dir);
    ck_assert_int_eq(sfi_out_write(path, "a,b\n", 4, &e), SFI_OK);
    ck_assert_int_eq(mode_of(path) & 0777, 0644);
    umask(027);
    snprintf(path, sizeof path, "%s/new2.csv", dir);
    ck_assert_int_eq(sfi_out_write(path, "a,b\n", 4, &e), SFI_OK);
    ck_assert_int_eq(mode_of(path) & 0777, 0640);
    umask(old);
    /* An existing file keeps its permission bits. */
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(sfi_out_write(path, "c,d,e\n", 6, &e), SFI_OK);
    ck_assert_int_eq(mode_of(path) & 0777, 0600);
    char *t = sfi_test_read_file(path, NULL);
    ck_assert_str_eq(t, "c,d,e\n");
    free(t);
    /* Abort: the target is untouched, no temporary file is left. */
    sfi_out *o;
    FILE *f;
    ck_assert_int_eq(sfi_out_open(path, &o, &f, &e), SFI_OK);
    fputs("half", f);
    sfi_out_abort(o);
    t = sfi_test_read_file(path, NULL);
    ck_assert_str_eq(t, "c,d,e\n");
    free(t);
    ck_assert_int_eq(count_temps(dir), 0);
    /* A directory that does not exist: the pre-flight check and the
     * write both say so. */
    snprintf(path, sizeof path, "%s/no/such.csv", dir);
    ck_assert_int_eq(sfi_out_check(path, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "such.csv: directory "));
    ck_assert_int_eq(sfi_out_check(dir, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, ": is a directory"));
    ck_assert_int_eq(sfi_out_check("/dev/null", &e), SFI_OK);
    ck_assert_int_eq(sfi_out_write(path, "x", 1, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "such.csv: cannot create: No such file or directory"));
    ck_assert_int_eq(sfi_out_write("", "x", 1, &e), SFI_EINVAL);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* A file the user may not write is not replaced (the rename would go
 * through in a writable directory). As root, the check runs as nobody. */
START_TEST(out_read_only_file_refused)
{
    char *dir = sfi_test_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/ro.csv", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (geteuid() == 0 &&
            (chown(dir, 65534, 65534) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
            _exit(3);
        if (sfi_test_write_file(path, "old", 3) != 0 || chmod(path, 0444) != 0)
            _exit(4);
        sfi_error e;
        if (sfi_out_check(path, &e) != SFI_EIO || !strstr(e.msg, "Permission denied"))
            _exit(7);
        if (sfi_out_write(path, "new", 3, &e) != SFI_EIO || !strstr(e.msg, "Permission denied"))
            _exit(5);
        char *t = sfi_test_read_file(path, NULL);
        _exit(t && !strcmp(t, "old") ? 0 : 6);
    }
    int ws;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child status %d", ws);
    ck_assert_int_eq(count_temps(dir), 0);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(out_symlinks)
{
    char *dir = sfi_test_tmpdir(), path[4200], real[4200];
    sfi_error e;
    snprintf(real, sizeof real, "%s/real.png", dir);
    snprintf(path, sizeof path, "%s/link.png", dir);
    ck_assert_int_eq(symlink("real.png", path), 0);
    /* Dangling: refused, nothing created; the pre-flight check says so
     * too (sfi_out_check: the same rule before the work). */
    ck_assert_int_eq(sfi_out_check(path, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "link.png: a dangling symbolic link"));
    ck_assert_int_eq(sfi_out_write(path, "x", 1, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "link.png: a dangling symbolic link"));
    ck_assert_int_eq(access(real, F_OK), -1);
    /* To a file: the file is replaced, the link stays a link. */
    ck_assert_int_eq(sfi_test_write_file(real, "old", 3), 0);
    ck_assert_int_eq(sfi_out_write(path, "new", 3, &e), SFI_OK);
    ck_assert(S_ISLNK(mode_of(path)));
    char *t = sfi_test_read_file(real, NULL);
    ck_assert_str_eq(t, "new");
    free(t);
    /* To a FIFO or device: written through (below). */
    ck_assert_int_eq(count_temps(dir), 0);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(out_devices_fifos_and_refusals)
{
    char *dir = sfi_test_tmpdir(), path[4200], cmd[8600];
    sfi_error e;
    /* A FIFO with a reader: written through, still a FIFO. */
    snprintf(path, sizeof path, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    snprintf(cmd, sizeof cmd, "cat '%s'", path);
    FILE *r = popen(cmd, "r");
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(sfi_out_write(path, "through\n", 8, &e), SFI_OK);
    char got[32] = {0};
    ck_assert_ptr_nonnull(fgets(got, sizeof got, r));
    pclose(r);
    ck_assert_str_eq(got, "through\n");
    ck_assert(S_ISFIFO(mode_of(path)));
    /* A symlink to the FIFO: through as well. */
    char lnk[4200];
    snprintf(lnk, sizeof lnk, "%s/fifo-link", dir);
    ck_assert_int_eq(symlink("fifo", lnk), 0);
    snprintf(cmd, sizeof cmd, "cat '%s' >/dev/null", path);
    r = popen(cmd, "r");
    ck_assert_int_eq(sfi_out_write(lnk, "x\n", 2, &e), SFI_OK);
    pclose(r);
    ck_assert(S_ISFIFO(mode_of(path)) && S_ISLNK(mode_of(lnk)));
    /* A full device: the write error is reported. */
    ck_assert_int_eq(sfi_out_write("/dev/full", "x", 1, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "/dev/full: cannot write: No space left on device"));
    /* A character device node of our own (needs root; /dev/null itself is
     * never put at risk): still a device afterwards. */
    snprintf(path, sizeof path, "%s/null", dir);
    if (mknod(path, S_IFCHR | 0666, makedev(1, 3)) == 0) {
        ck_assert_int_eq(sfi_out_write(path, "x", 1, &e), SFI_OK);
        ck_assert(S_ISCHR(mode_of(path)));
    } else {
        printf("note: mknod not permitted; the device-node case is covered by /dev/full\n");
    }
    /* A directory and a socket are refused. */
    ck_assert_int_eq(sfi_out_write(dir, "x", 1, &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, ": is a directory"));
    snprintf(path, sizeof path, "%s/sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t pl = strlen(path);
    if (pl < sizeof a.sun_path) {
        memcpy(a.sun_path, path, pl + 1);
        ck_assert_int_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
        ck_assert_int_eq(sfi_out_write(path, "x", 1, &e), SFI_EIO);
        ck_assert_ptr_nonnull(strstr(e.msg, "sock: is a socket; not writing to it"));
        ck_assert(S_ISSOCK(mode_of(path)));
    }
    close(s);
    ck_assert_int_eq(count_temps(dir), 0);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* A file size limit: with sfi_io_cleanup_on_signals the write fails with a
 * message instead of SIGXFSZ killing us, and no temporary file remains. */
START_TEST(out_file_size_limit_and_signals)
{
    char *dir = sfi_test_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/big.csv", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        sfi_io_cleanup_on_signals();
        struct rlimit rl = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &rl);
        static char big[100000];
        memset(big, 'x', sizeof big);
        sfi_error e;
        sfi_status st = sfi_out_write(path, big, sizeof big, &e);
        _exit(st == SFI_EIO && strstr(e.msg, "File too large") ? 0 : 1);
    }
    int ws;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "status %d", ws);
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(count_temps(dir), 0);
    /* SIGTERM while a file is being written: the program dies of it and
     * takes its temporary file along. */
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        sfi_io_cleanup_on_signals();
        sfi_out *o;
        FILE *f;
        sfi_error e;
        if (sfi_out_open(path, &o, &f, &e) != SFI_OK)
            _exit(3);
        fputs("partial", f);
        fflush(f);
        raise(SIGTERM);
        _exit(4);
    }
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGTERM, "status %d", ws);
    ck_assert_int_eq(access(path, F_OK), -1);
    ck_assert_int_eq(count_temps(dir), 0);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(png_follows_the_rule)
{
    char *dir = sfi_test_tmpdir(), path[4200], cmd[8600];
    sfi_error e;
    sfi_plot *p = sfi_plot_new(200, 100, 1, 1);
    double x[2] = {1, 2}, y[2] = {1, 2};
    ck_assert_int_eq(sfi_plot_axes(p, 0, "t", "x", "y", 0, &e), SFI_OK);
    ck_assert_int_eq(sfi_plot_line(p, 0, "l", x, y, 2, 0, &e), SFI_OK);
    mode_t old = umask(022);
    snprintf(path, sizeof path, "%s/a.png", dir);
    ck_assert_int_eq(sfi_plot_write_png(p, path, &e), SFI_OK);
    ck_assert_int_eq(mode_of(path) & 0777, 0644);
    umask(old);
    snprintf(path, sizeof path, "%s/fifo.png", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    snprintf(cmd, sizeof cmd, "cat '%s' > '%s/got.png'", path, dir);
    FILE *r = popen(cmd, "w");
    ck_assert_int_eq(sfi_plot_write_png(p, path, &e), SFI_OK);
    pclose(r);
    snprintf(cmd, sizeof cmd, "%s/got.png", dir);
    size_t n = 0;
    char *png = sfi_test_read_file(cmd, &n);
    ck_assert(png && n > 8 && !memcmp(png, "\x89PNG", 4));
    free(png);
    ck_assert(S_ISFIFO(mode_of(path)));
    ck_assert_int_eq(sfi_plot_write_png(p, "/dev/full", &e), SFI_EIO);
    ck_assert_ptr_nonnull(strstr(e.msg, "/dev/full"));
    sfi_plot_free(p);
    sfi_plot_release_fonts();
    ck_assert_int_eq(count_temps(dir), 0);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

/* The commands: sweep's -o, --png and --timeline-png, validate --fit. */
START_TEST(sim_outputs_follow_the_rule)
{
    char *dir = sfi_test_tmpdir(), cmd[16384];
    char *out = NULL, *err = NULL;
    char sim[PATH_MAX];
    ck_assert_ptr_nonnull(realpath(sfi_test_build("sfi-sim"), sim));
    char prof[PATH_MAX];
    ck_assert_ptr_nonnull(realpath(sfi_test_src("gpu/profiles/h100.json"), prof));
    const char *sweep = "sweep --models Qwen3-8B --contexts 8192,16384";
    /* A FIFO for -o and a device node for --png (or /dev/full when mknod
     * is not permitted: an error, and it stays a device). */
    int have_node = 0;
    char node[4200];
    snprintf(node, sizeof node, "%s/node", dir);
    have_node = mknod(node, S_IFCHR | 0666, makedev(1, 3)) == 0;
    snprintf(cmd, sizeof cmd,
             "cd '%s' && mkfifo f && (cat f > got.csv &) && '%s' %s -o f --png %s "
             "--timeline-png tl.png && ln -s tl.png tl-link.png && "
             "'%s' %s --no-png -o out.csv --timeline-png tl-link.png",
             dir, sim, sweep, have_node ? "node" : "/dev/null", sim, sweep);
    int rc = sfi_test_run(cmd, &out, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    free(out);
    free(err);
    char path[4300];
    if (have_node)
        ck_assert(S_ISCHR(mode_of(node)));
    snprintf(path, sizeof path, "%s/f", dir);
    ck_assert(S_ISFIFO(mode_of(path)));
    snprintf(path, sizeof path, "%s/tl-link.png", dir);
    ck_assert(S_ISLNK(mode_of(path)));
    snprintf(path, sizeof path, "%s/out.csv", dir);
    mode_t um = umask(0);
    umask(um);
    ck_assert_int_eq(mode_of(path) & 0777, 0666 & ~um); /* like the PNGs, not 0600 */
    /* The CSV that went through the FIFO arrived (the reader may lag). */
    snprintf(path, sizeof path, "%s/got.csv", dir);
    char *csv = NULL;
    for (int i = 0; i < 100 && !(csv && strstr(csv, "Qwen3-8B")); i++) {
        free(csv);
        usleep(20000);
        csv = sfi_test_read_file(path, NULL);
    }
    ck_assert_msg(csv && strstr(csv, "Qwen3-8B"), "%s", csv ? csv : "(none)");
    free(csv);
    /* A directory, a dangling link: refused, exit 1, a message. */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && ln -s nowhere.csv dangling.csv && '%s' %s -o dangling.csv", dir, sim,
             sweep);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, &err), 1);
    ck_assert_msg(strstr(err, "dangling.csv: a dangling symbolic link"), "%s", err);
    free(err);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s --no-png -o .", dir, sim, sweep);
    ck_assert_int_eq(sfi_test_run(cmd, NULL, &err), 1);
    ck_assert_msg(strstr(err, ".: is a directory"), "%s", err);
    free(err);
    /* ulimit -f: an error with a message, not SIGXFSZ; nothing left. */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && ulimit -f 1 && '%s' %s --contexts 8192,16384,32768,65536 "
             "--batch 1,2,4,8,16 --no-png -o big.csv",
             dir, sim, sweep);
    rc = sfi_test_run(cmd, NULL, &err);
    ck_assert_msg(rc == 1 && strstr(err, "big.csv: cannot write: File too large"), "rc %d: %s", rc,
                  err);
    free(err);
    ck_assert_int_eq(count_temps(dir), 0);
    /* validate --fit through a symbolic link to a FIFO. */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && mkfifo g && ln -s g g-link && (cat g > fit.json &) && "
             "'%s' validate --profile '%s' --fit g-link >/dev/null",
             dir, sim, prof);
    rc = sfi_test_run(cmd, NULL, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    free(err);
    snprintf(path, sizeof path, "%s/g", dir);
    ck_assert(S_ISFIFO(mode_of(path)));
    snprintf(path, sizeof path, "%s/fit.json", dir);
    char *fit = NULL;
    for (int i = 0; i < 100 && !(fit && strstr(fit, "sfi_profile")); i++) {
        free(fit);
        usleep(20000);
        fit = sfi_test_read_file(path, NULL);
    }
    ck_assert_msg(fit && strstr(fit, "sfi_profile"), "%s", fit ? fit : "(none)");
    free(fit);
    sfi_test_rmtree(dir);
    free(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("io");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, read_limits);
    tcase_add_test(tc, out_regular_files);
    tcase_add_test(tc, out_read_only_file_refused);
    tcase_add_test(tc, out_symlinks);
    tcase_add_test(tc, out_devices_fifos_and_refusals);
    tcase_add_test(tc, out_file_size_limit_and_signals);
    tcase_add_test(tc, png_follows_the_rule);
    tcase_add_test(tc, sim_outputs_follow_the_rule);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
