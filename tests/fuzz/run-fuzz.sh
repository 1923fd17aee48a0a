#!/bin/sh
# `make fuzz`: builds libsfi's sources and each harness with clang's
# libFuzzer, ASan and UBSan, then fuzzes each harness for FUZZ_SECONDS,
# starting from the committed seeds (a working copy of the corpus under the
# build tree grows; the seeds in the source tree are never written).
#
# usage: run-fuzz.sh SRCDIR BUILDDIR SECONDS HARNESS...
# environment: FUZZ_CC, FUZZ_CPPFLAGS, FUZZ_LIBS, FUZZ_SOURCES (library .c
# files, relative to SRCDIR or BUILDDIR), FUZZ_JOBS (parallel harnesses).
set -e
srcdir=$1 builddir=$2 seconds=$3
shift 3
cc=${FUZZ_CC:-clang}
out=$builddir/tests/fuzz/out
mkdir -p "$out/obj"
# -O1 -g: libFuzzer's usual trade-off between speed and useful reports.
cflags="-std=c11 -g -O1 -ffp-contract=off -fno-omit-frame-pointer \
-fsanitize=address,undefined -fno-sanitize-recover=undefined"

probe='#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }'
if ! echo "$probe" | $cc -x c - -fsanitize=fuzzer -o "$out/probe" 2>/dev/null; then
    echo "run-fuzz.sh: $cc cannot link -fsanitize=fuzzer; on Debian run 'apt-get install clang libclang-rt-14-dev'" >&2
    exit 1
fi

# The library once, instrumented for coverage (fuzzer-no-link).
objs=
for s in $FUZZ_SOURCES; do
    # Command-line front ends (cmd_*.c) parse nothing the harnesses reach
    # and need their programs' own flags; leave them out.
    case $s in */cmd_*.c|*/main.c) continue ;; *.c) ;; *) continue ;; esac
    if [ -f "$builddir/$s" ]; then f=$builddir/$s; else f=$srcdir/$s; fi
    o=$out/obj/`echo "$s" | tr / _ | sed 's/\.c$/.o/'`
    if [ ! -f "$o" ] || [ "$f" -nt "$o" ]; then
        echo "  FUZZCC   $s"
        $cc $cflags -fsanitize=fuzzer-no-link $FUZZ_CPPFLAGS -c "$f" -o "$o"
    fi
    objs="$objs $o"
done

# The file-based harnesses write their input to $TMPDIR on every run:
# memory-backed storage makes them several times faster.
if [ -z "$TMPDIR" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then
    TMPDIR=/dev/shm
    export TMPDIR
fi

# An archive, so that each harness links only the objects it needs.
rm -f "$out/libsfi-fuzz.a"
${AR:-ar} rcs "$out/libsfi-fuzz.a" $objs

status=0
summary=$out/summary.txt
: > "$summary"
for h in "$@"; do
    echo "  FUZZLD   fuzz_$h"
    $cc $cflags -fsanitize=fuzzer $FUZZ_CPPFLAGS "$srcdir/tests/fuzz/fuzz_$h.c" "$out/libsfi-fuzz.a" \
        $FUZZ_LIBS -o "$out/fuzz_$h"
    mkdir -p "$out/corpus/$h" "$out/artifacts/$h"
    dict=
    [ -f "$srcdir/tests/fuzz/$h.dict" ] && dict="-dict=$srcdir/tests/fuzz/$h.dict"
    seeds="$srcdir/tests/fuzz/corpus/$h"
    regs=
    [ -d "$srcdir/tests/fuzz/regressions/$h" ] && regs="$srcdir/tests/fuzz/regressions/$h"
    echo "  FUZZ     fuzz_$h for ${seconds}s (log: $out/fuzz_$h.log)"
    # -max_len 64 KiB: real configs/headers are far smaller; -rss_limit_mb
    # and -timeout make a huge allocation or a hang a finding.
    if "$out/fuzz_$h" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 $dict \
        -artifact_prefix="$out/artifacts/$h/" "$out/corpus/$h" "$seeds" $regs \
        > "$out/fuzz_$h.log" 2>&1; then
        res=ok
    else
        res="FAILED (see $out/fuzz_$h.log and $out/artifacts/$h/)"
        status=1
    fi
    # The last status line holds the executions and libFuzzer's coverage
    # (cov: edges, ft: features) reached.
    last=`grep -E '^#[0-9]+' "$out/fuzz_$h.log" | tail -1`
    execs=`sed -n 's/^stat::number_of_executed_units: *//p' "$out/fuzz_$h.log"`
    echo "fuzz_$h: $res; executions ${execs:-?}; last: $last" | tee -a "$summary"
done
exit $status
