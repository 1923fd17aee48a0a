#!/bin/sh
# The man pages: every EXAMPLES command runs as written from a built tree
# (and prints what the page shows, where it shows output), every page is
# clean groff, every cross reference names a page that exists, and every
# page is installed.
#
# Convention of an EXAMPLES section (man/*.[157]): commands sit in .nf
# blocks, each starting with "$ " (continued by a trailing backslash, \e
# in the source); the lines right after a command, up to the next command
# or the end of the block, are its exact standard output. A command runs in
# a scratch copy of the source tree (its directories linked, so outputs
# land in the scratch directory), with the build tree first on PATH and
# ../shared linked to $SFI_SHARED. A placeholder is written in italics
# (\fIWORD\fR) and must be one this script knows (PLACEHOLDERS below); it
# is replaced by a stand-in. Commands that need what this machine lacks are
# skipped with a SKIP line saying why (../shared, a CUDA device, torch and
# transformers, OpenBLAS), and so are the later commands of their block.
# Environment: SFI_SRCDIR, SFI_BUILDDIR, SFI_SHARED (set by make check),
# SFI_MAN_PAGES (a subset of pages, e.g. "sfi-sim.1").
set -u
src=$(cd "${SFI_SRCDIR:-.}" && pwd)
build=$(cd "${SFI_BUILDDIR:-.}" && pwd)
shared=${SFI_SHARED:-$src/../shared}
fail=0
ran=0
skipped=0
# printf, not echo: dash's echo would expand the backslashes of commands.
bad() { printf 'FAIL: %s\n' "$*"; fail=1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/sfi-man-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

have_shared=0
[ -d "$shared/models/sfi-small-qwen3" ] && have_shared=1
have_torch=0
"${PYTHON3:-python3}" -c 'import torch, transformers' 2>/dev/null && have_torch=1
have_blas=0
grep -q '^#define SFI_HAVE_OPENBLAS 1' "$build/config.h" 2>/dev/null && have_blas=1
have_gpu=0
[ -x "$build/sfi-gpu" ] && have_gpu=1

# PLACEHOLDERS: italic words an example may use, and their stand-ins.
placeholder() {
    case "$1" in
    MODEL_DIR) echo "../shared/models/sfi-small-qwen3" ;;
    *) return 1 ;;
    esac
}

pages=${SFI_MAN_PAGES:-}
if [ -z "$pages" ]; then
    pages=$(cd "$src/man" && ls *.1 *.5 *.7)
fi

# --- every page: groff warnings, cross references, installed -----------
for p in $pages; do
    f="$src/man/$p"
    if command -v groff >/dev/null 2>&1; then
        w=$(groff -man -Tutf8 -ww -z "$f" 2>&1)
        [ -z "$w" ] || bad "$p: groff: $w"
    fi
    # .BR name (N) naming one of ours (sfi*): the page must exist in man/
    # (others, such as sqlite3(1) or flock(2), belong to the system).
    sed -n 's/^\.BR \(sfi[a-z0-9_.-]*\) (\([1-9]\)).*/\1.\2/p' "$f" | sort -u | while read -r ref; do
        [ -f "$src/man/$ref" ] || echo "FAIL: $p: cross reference to $ref, which is not in man/"
    done | grep FAIL && fail=1
    grep -q "man/$p" "$src/man/local.mk" || bad "$p: not in man/local.mk (not installed)"
done

# --- the EXAMPLES -------------------------------------------------------
# extract PAGE: one record per command, "C<TAB>block<TAB>command" with the
# command's lines joined by \001, then its output lines as "O<TAB>line".
extract() {
    awk '
    function unroff(s,   out, i, c, n, w) {
        out = ""
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (c != "\\") { out = out c; continue }
            n = substr(s, i + 1, 1)
            if (n == "-") { out = out "-"; i++ }
            else if (n == "e" || n == "\\") { out = out "\\"; i++ }
            else if (n == "&") { i++ }
            else if (n == "f") {
                n = substr(s, i + 2, 1)
                if (n == "I") {          # placeholder: \fIWORD\fR
                    w = substr(s, i + 3)
                    sub(/\\f[RP].*/, "", w)
                    out = out "@@" w "@@"
                    i += 2 + length(w) + 3
                } else i += 2
            }
            else { out = out c }
        }
        return out
    }
    /^\.SH / { inex = ($0 ~ /^\.SH "?EXAMPLES"?/); nf = 0; cmd = 0; next }
    !inex { next }
    /^\.nf/ { nf = 1; block++; cmd = 0; next }
    /^\.fi/ { nf = 0; cmd = 0; next }
    { quoted = 0 }
    /^\.(B|I|BR|RB) / { # a font macro: its text counts (quotes dropped)
        t = $0; sub(/^\.[A-Z]+ /, "", t); quoted = (t ~ /^".* .*"$/); gsub(/^"|"$/, "", t); $0 = t
    }
    /^\./ { if (nf) cmd = 0; next }
    {
        line = unroff($0)
        if (!nf) {
            t = line; gsub(/^"|"$/, "", t)
            # "$ cmd", or a quoted bold command line (the old style):
            # examples outside .nf are not run, so they are errors.
            if (t ~ /^\$ / || (quoted && t ~ /^(sfi-|sqlite3 |python3 )/))
                printf "X\t%d\t%s\n", NR, t
            next
        }
        if (cont) { printf "\001%s", line; cont = (line ~ /\\$/); if (!cont) printf "\n"; next }
        if (line ~ /^\$ /) {
            printf "C\t%d\t%s", block, substr(line, 3)
            cont = (line ~ /\\$/); if (!cont) printf "\n"
            cmd = 1; next
        }
        if (line == "") { cmd = 0; next }
        if (cmd) printf "O\t%s\n", line
        else printf "X\t%d\t%s\n", NR, line
    }' "$1"
}

run_one() { # page work cmdfile outfile
    ( cd "$2/repo" && PATH="$build:$PATH" timeout 900 sh "$3" >"$4" 2>"$4.err" )
}

for p in $pages; do
    f="$src/man/$p"
    grep -q '^\.SH "\{0,1\}EXAMPLES' "$f" || continue
    work="$tmp/$p"
    mkdir -p "$work/repo"
    for e in "$src"/* ; do
        ln -s "$e" "$work/repo/$(basename "$e")"
    done
    [ $have_shared -eq 1 ] && ln -s "$shared" "$work/shared"
    extract "$f" >"$work/x" || bad "$p: cannot read EXAMPLES"
    if grep -q '^X' "$work/x"; then
        bad "$p: EXAMPLES lines that are neither a '\$ ' command in a .nf block nor its output:"
        grep '^X' "$work/x" | cut -f2- | sed 's/^/    line /'
    fi
    n=0
    skip_block=""
    # Append an end marker so the last command's output is checked.
    printf 'E\n' >>"$work/x"
    cur=""
    while IFS= read -r rec; do
        kind=${rec%%	*}
        if [ "$kind" = O ]; then
            printf '%s\n' "${rec#O	}" >>"$work/want.$n"
            continue
        fi
        # A command or the end: first finish the previous command.
        if [ -n "$cur" ]; then
            if [ -f "$work/want.$n" ] && [ -f "$work/got.$n" ]; then
                # Compared up to trailing newlines (sfi-ref decode adds none).
                [ "$(cat "$work/want.$n")" = "$(cat "$work/got.$n")" ] ||
                    bad "$p: '$cur' printed:
$(cat "$work/got.$n")
--- the page shows:
$(cat "$work/want.$n")"
            fi
            cur=""
        fi
        [ "$kind" = C ] || continue
        n=$((n + 1))
        rest=${rec#C	}
        blk=${rest%%	*}
        cmd=$(printf '%s' "${rest#*	}" | tr '\001' '\n')
        cur=$(printf '%s' "$cmd" | head -1)
        # Placeholders.
        for w in $(printf '%s' "$cmd" | grep -o '@@[A-Za-z_]*@@' | tr -d @ | sort -u); do
            if s=$(placeholder "$w"); then
                cmd=$(printf '%s' "$cmd" | sed "s|@@$w@@|$s|g")
            else
                bad "$p: unknown placeholder $w in '$cur'"
                continue 2
            fi
        done
        why=""
        if [ "$skip_block" = "$blk" ]; then
            why="follows a skipped command"
        elif [ $have_shared -eq 0 ] && printf '%s' "$cmd" | grep -q '\.\./shared'; then
            why="needs ../shared (SFI_SHARED=$shared)"
        elif printf '%s' "$cmd" | grep -q 'record_hf\.py\|sfi-record-hf' && [ $have_torch -eq 0 ]; then
            why="needs python3 with torch and transformers"
        elif printf '%s' "$cmd" | grep -q -- '--backend blas' && [ $have_blas -eq 0 ]; then
            why="needs a build with OpenBLAS"
        elif printf '%s' "$cmd" | grep -q '^sfi-gpu' && [ $have_gpu -eq 0 ]; then
            why="needs sfi-gpu (configured without CUDA)"
        fi
        if [ -n "$why" ]; then
            printf 'SKIP: %s: %s: %s\n' "$p" "$cur" "$why"
            skipped=$((skipped + 1))
            skip_block=$blk
            continue
        fi
        printf '%s\n' "$cmd" >"$work/cmd.$n"
        start=$(date +%s)
        run_one "$p" "$work" "$work/cmd.$n" "$work/got.$n"
        rc=$?
        secs=$(( $(date +%s) - start ))
        if [ $rc -eq 77 ] && printf '%s' "$cmd" | grep -q '^sfi-gpu'; then
            printf 'SKIP: %s: %s: no CUDA device\n' "$p" "$cur"
            skipped=$((skipped + 1))
            skip_block=$blk
            rm -f "$work/got.$n"
            continue
        fi
        ran=$((ran + 1))
        if [ $rc -ne 0 ]; then
            bad "$p: '$cur' exited $rc:
$(tail -5 "$work/got.$n.err")"
            rm -f "$work/got.$n"
            skip_block=$blk
            continue
        fi
        printf 'ok: %s: %s (%ss)\n' "$p" "$cur" "$secs"
    done <"$work/x"
done

echo "examples: $ran ran, $skipped skipped"
[ $fail -eq 0 ] || exit 1
[ $ran -gt 0 ] || { echo "SKIP: no example could run"; exit 77; }
exit 0
