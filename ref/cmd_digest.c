/* sfi-ref digest: SHA-256 of files (sha256sum's output format), and the
 * golden-digest suite of the reference core (--suite), whose output is the
 * committed file tests/golden/ref_core.sha256. */
#include <config.h>

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "sfi_digest.h"
#include "sfi_golden.h"
#include "sfi_ref_cli.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: sfi-ref digest FILE...\n"
                 "       sfi-ref digest --suite\n\n"
                 "Print SHA-256 digests as \"HEX  NAME\" lines (the format of sha256sum;\n"
                 "a name with a backslash, newline or CR is escaped as sha256sum does).\n\n"
                 "  FILE...      digest each file (\"-\" is standard input)\n"
                 "  -s, --suite  run the reference core's golden suite (seeded exp/log/sqrt,\n"
                 "               softmax, dense/sparse/prefill attention, Selector with every\n"
                 "               intermediate, trigger policies and fast sets) and print one\n"
                 "               digest per case; they must equal tests/golden/ref_core.sha256\n"
                 "               on every compiler, optimisation level and host\n"
                 "  -h, --help   print this help\n\n"
                 "Exit status: 0 ok, 1 a file could not be read (the others are still\n"
                 "printed) or the suite failed, 2 usage error. See sfi-ref-digest(1).\n");
}

static void emit(const char *name, const char *hex, void *ctx)
{
    (void)ctx;
    printf("%s  %s\n", hex, name);
}

/* One "HEX  NAME" line as sha256sum (coreutils 9) writes it: a name with
 * a backslash, newline or carriage return is escaped (\\, \n, \r) and
 * the line starts with a backslash, so every line stays one line and
 * `sha256sum -c` reads it back. */
static void print_line(const char *hex, const char *name)
{
    int esc = strpbrk(name, "\\\n\r") != NULL;
    printf("%s%s  ", esc ? "\\" : "", hex);
    for (const char *p = name; *p; p++) {
        if (esc && (*p == '\\' || *p == '\n' || *p == '\r'))
            printf("\\%c", *p == '\\' ? '\\' : *p == '\n' ? 'n' : 'r');
        else
            putchar(*p);
    }
    putchar('\n');
}

static int digest_stdin(char *hex, sfi_error *err)
{
    sfi_hasher h;
    if (sfi_hasher_init(&h, err) != SFI_OK)
        return 1;
    unsigned char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, stdin)) > 0)
        sfi_hasher_update(&h, buf, got);
    if (ferror(stdin)) {
        sfi_hasher_free(&h);
        sfi_error_set(err, SFI_EIO, "-: read error on standard input");
        return 1;
    }
    return sfi_hasher_final_hex(&h, hex, NULL, err) != SFI_OK;
}

int sfi_ref_cmd_digest(int argc, char **argv)
{
    static const struct option opts[] = {
        {"suite", no_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int suite = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "sh", opts, NULL)) != -1) {
        switch (c) {
        case 's': suite = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (suite == (optind < argc)) {
        fprintf(stderr, "sfi-ref digest: give either files or --suite\n");
        usage(stderr);
        return 2;
    }
    sfi_error err;
    sfi_error_clear(&err);
    if (suite) {
        if (sfi_golden_suite(emit, NULL, &err) != SFI_OK) {
            fprintf(stderr, "sfi-ref digest: %s\n", err.msg);
            return 1;
        }
        return fflush(stdout) == 0 ? 0 : 1;
    }
    int rc = 0;
    for (int i = optind; i < argc; i++) {
        char hex[SFI_DIGEST_HEX_LEN + 1];
        int bad = !strcmp(argv[i], "-") ? digest_stdin(hex, &err)
                                        : sfi_digest_file_hex(argv[i], hex, &err) != SFI_OK;
        if (bad) {
            fprintf(stderr, "sfi-ref digest: %s\n", err.msg);
            rc = 1;
            continue;
        }
        print_line(hex, argv[i]);
    }
    if (fflush(stdout) != 0)
        rc = 1;
    return rc;
}
