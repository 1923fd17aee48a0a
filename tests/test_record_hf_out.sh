#!/bin/sh
# traces/record_hf.py's --out follows the trace rule of sfi-ref run --trace
# (issue 20.3): only an empty file or an sfi trace no one records or locks
# is replaced, and a trace either recorder holds is "locked" to the other.
# Needs python3 only (not torch: the rule is checked before the model loads).
set -u
src=${SFI_SRCDIR:-.}
build=${SFI_BUILDDIR:-.}
py=${PYTHON3:-python3}
if ! "$py" -c 'import sqlite3, fcntl' 2>/dev/null; then
    echo "SKIP: python3 with sqlite3 is not available"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sfi-hfout-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
echo "The cat sat." > "$tmp/p.txt"
cp "$src/traces/licenses-8k.db" "$tmp/t.db"
: > "$tmp/empty.db"
"$py" -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("CREATE TABLE x(a)"); c.commit()' "$tmp/other.db"
ln -s nowhere.db "$tmp/dangling.db"
"$py" - "$src/traces" "$tmp" <<'PY' || fail "record_hf.replaceable"
import sys
sys.path.insert(0, sys.argv[1])
import record_hf as r
t = sys.argv[2]
cases = {"p.txt": "is not an sfi trace", "t.db": None, "empty.db": None, "none.db": None,
         "other.db": "an SQLite database that is not an sfi trace", ".": "not a regular file",
         "dangling.db": "a dangling symbolic link"}
for name, want in cases.items():
    got = r.replaceable(t + "/" + name)
    ok = got is None if want is None else (got is not None and want in got)
    assert ok, (name, got)
PY
# The Python writer refuses before loading anything (no torch needed) and
# leaves the file as it was.
"$py" "$src/traces/record_hf.py" --model "$src/tests/fixtures/hf/tiny-qwen3" --out "$tmp/p.txt" \
    --prompt-ids 1,2,3 >"$tmp/out" 2>"$tmp/err" && fail "record_hf.py replaced p.txt"
grep -q "p.txt: exists and is not an sfi trace" "$tmp/err" || fail "message: $(cat "$tmp/err")"
[ "$(cat "$tmp/p.txt")" = "The cat sat." ] || fail "p.txt changed"
# A trace under the Python writer's flock is locked for sfi-ref run.
echo "5 6 7" > "$tmp/p.ids"
"$py" - "$tmp/t.db" "$build/sfi-ref" "$src/tests/fixtures/hf/tiny-qwen3" "$tmp/p.ids" <<'PY' || fail "flock seen by sfi-ref"
import fcntl, subprocess, sys
with open(sys.argv[1], "rb") as f:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    p = subprocess.run([sys.argv[2], "run", "--model", sys.argv[3], "--prompt-ids", sys.argv[4],
                        "--max-new", "1", "--trace", sys.argv[1]], capture_output=True, text=True)
    assert p.returncode == 1 and "locked: another sfi process" in p.stderr, (p.returncode, p.stderr)
PY
"$build/sfi-sim" trace check "$tmp/t.db" >/dev/null || fail "t.db damaged"
echo "PASS: record_hf.py --out follows the trace rule"
