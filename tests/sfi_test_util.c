#include <config.h>

#include "sfi_test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char path_buf[4096];

static const char *join(const char *env, const char *fallback, const char *rel)
{
    const char *base = getenv(env);
    if (!base || !*base)
        base = fallback;
    snprintf(path_buf, sizeof path_buf, "%s/%s", base, rel);
    return path_buf;
}

const char *sfi_test_src(const char *rel)
{
    return join("SFI_SRCDIR", ".", rel);
}
const char *sfi_test_build(const char *rel)
{
    return join("SFI_BUILDDIR", ".", rel);
}

const char *sfi_test_shared(const char *rel)
{
    const char *p = join("SFI_SHARED", "../shared", rel);
    struct stat st;
    return stat(p, &st) == 0 ? p : NULL;
}

char *sfi_test_tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/sfi-test-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(tmpl))
        return NULL;
    return strdup(tmpl);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

void sfi_test_rmtree(const char *path)
{
    if (path)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *sfi_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        } else {
            buf = nb;
        }
    }
    fclose(f);
    if (!buf)
        return NULL;
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

int sfi_test_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, len, f);
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

int sfi_test_run(const char *cmd, char **out, char **err)
{
    char *dir = sfi_test_tmpdir();
    if (!dir)
        return -1;
    char o[4200], e[4200];
    snprintf(o, sizeof o, "%s/out", dir);
    snprintf(e, sizeof e, "%s/err", dir);
    size_t need = strlen(cmd) + strlen(o) + strlen(e) + 64;
    char *full = malloc(need);
    if (!full) {
        sfi_test_rmtree(dir);
        free(dir);
        return -1;
    }
    snprintf(full, need, "( %s ) </dev/null >'%s' 2>'%s'", cmd, o, e);
    int st = system(full);
    free(full);
    int rc;
    if (st == -1)
        rc = -1;
    else if (WIFEXITED(st))
        rc = WEXITSTATUS(st);
    else if (WIFSIGNALED(st))
        rc = 128 + WTERMSIG(st);
    else
        rc = -1;
    if (out)
        *out = sfi_test_read_file(o, NULL);
    if (err)
        *err = sfi_test_read_file(e, NULL);
    sfi_test_rmtree(dir);
    free(dir);
    return rc;
}

char *sfi_test_dir;

void sfi_test_dir_setup(void)
{
    sfi_test_dir = sfi_test_tmpdir();
    ck_assert_ptr_nonnull(sfi_test_dir);
}

void sfi_test_dir_teardown(void)
{
    sfi_test_rmtree(sfi_test_dir);
    free(sfi_test_dir);
    sfi_test_dir = NULL;
}

int sfi_test_run_in(const char *dir, const char *prog, const char *args, char **out, char **err)
{
    size_t n = strlen(dir) + strlen(prog) + strlen(args) + 64;
    char *cmd = malloc(n);
    if (!cmd)
        return -1;
    snprintf(cmd, n, "cd '%s' && SFI_TRACE= '%s' %s", dir, prog, args);
    int rc = sfi_test_run(cmd, out, err);
    free(cmd);
    return rc;
}

int sfi_test_is_png(const char *path)
{
    size_t n;
    char *d = sfi_test_read_file(path, &n);
    int ok = d && n > 1000 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8);
    free(d);
    return ok;
}

/* Deliberately a second copy of sfi_params_default's values, not a call
 * to it: a change to the library's defaults must fail the tests that pin
 * sfi(7)'s values until this copy is changed on purpose too. */
sfi_params sfi_test_method_defaults(void)
{
    sfi_params p;
    memset(&p, 0, sizeof p);
    p.n_sink = 4;
    p.n_recent = 256;
    p.K = 2048;
    p.T_max = 64;
    p.W_decode = 1;
    p.W_prefill = 16;
    p.alpha = 0.5f;
    p.gamma = 1.0f;
    p.beta = 1.0f;
    p.p = 2.0f;
    p.eta = 0.5f;
    p.lambda_clip = 0.02f;
    p.nms_radius = 2;
    p.alpha_soft = 0.5f;
    p.T = 1.0f;
    p.alpha_cross = 0.35f;
    p.eps = 1e-8f;
    strcpy(p.trigger_chars, ".?!;\n");
    return p;
}
