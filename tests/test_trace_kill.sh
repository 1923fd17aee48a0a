#!/bin/sh
# A recording sfi-ref run killed with SIGKILL mid-run leaves a valid trace:
# every finished step, complete = 0 (sfi-sim trace check passes, check
# --complete fails). Needs the real model in ../shared (skips without it).
set -u
build=${SFI_BUILDDIR:-.}
model="${SFI_SHARED:-../shared}/models/sfi-small-qwen3"
if [ ! -f "$model/model.safetensors" ]; then
    echo "SKIP: $model is not available"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sfi-kill-XXXXXX") || exit 1
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
echo "10 20 30 40 50 60 70 80 90 100 110 120" >"$tmp/p.ids"
"$build/sfi-ref" run --model "$model" --prompt-ids "$tmp/p.ids" --max-new 20000 \
    --trace "$tmp/t.db" --trace-level summary >/dev/null 2>"$tmp/err" &
pid=$!
# Wait (at most 120 s) until a few steps are committed, reading the trace
# while sfi-ref writes it.
n=0
i=0
while [ $i -lt 600 ]; do
    if [ -s "$tmp/t.db" ]; then
        n=$("$build/sfi-sim" trace info --json "$tmp/t.db" 2>/dev/null |
            sed -n 's/^  "steps": \([0-9]*\),*$/\1/p')
        [ "${n:-0}" -ge 5 ] && break
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/err"; fail "sfi-ref run ended early"; }
    sleep 0.2
    i=$((i + 1))
done
[ "${n:-0}" -ge 5 ] || fail "no steps recorded within 120 s"
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=
"$build/sfi-sim" trace check "$tmp/t.db" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "killed trace does not check"; }
grep -q "incomplete" "$tmp/out" || fail "killed trace claims to be complete: $(cat "$tmp/out")"
steps=$(sed -n 's/.* \([0-9]*\) steps, .*/\1/p' "$tmp/out")
[ "${steps:-0}" -ge "$n" ] || fail "trace lost committed steps: $steps < $n"
if "$build/sfi-sim" trace check --complete "$tmp/t.db" >/dev/null 2>&1; then
    fail "check --complete accepted an incomplete trace"
fi
echo "PASS: killed after $steps committed steps (saw $n while running)"
