#!/bin/sh
# sfi-gpu: command-line contract everywhere, the GPU-vs-reference suite
# where a CUDA device exists. Exit 77 (skip) without a device.
bin="${SFI_BUILDDIR:-.}/sfi-gpu"
if [ ! -x "$bin" ]; then
    echo "SKIP: sfi-gpu not built (configured without CUDA)"
    exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }

"$bin" --help >/dev/null || fail "--help exited non-zero"
"$bin" --help | grep -q 'check \[--bit-exact\]' || fail "--help does not list check"
"$bin" --version | grep -q '^sfi-gpu ' || fail "--version"
"$bin" frobnicate >/dev/null 2>&1
[ $? -eq 2 ] || fail "unknown command must exit 2"
"$bin" check --no-such-option >/dev/null 2>&1
[ $? -eq 2 ] || fail "bad check option must exit 2"
"$bin" bench --profile >/dev/null 2>&1
[ $? -eq 2 ] || fail "incomplete bench option must exit 2"
# Each command's --help works without a device and exits 0.
h=$("$bin" check --help) || fail "check --help exited non-zero"
echo "$h" | grep -q -- '--bit-exact' || fail "check --help does not list --bit-exact"
h=$("$bin" bench --help) || fail "bench --help exited non-zero"
echo "$h" | grep -q -- '--profile FILE' || fail "bench --help does not list --profile"

# sfi-gpu run: usage and input errors are reported before any device is
# needed (so they hold on machines without a GPU too)
"$bin" run --help | grep -q -- '--synthetic' || fail "run --help does not list --synthetic"
"$bin" run --max-new 4 >/dev/null 2>&1
[ $? -eq 2 ] || fail "run without a model must exit 2"
"$bin" run --synthetic Qwen3-0.6B --prompt-ids x --max-new 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "run --max-new 0 must exit 2"
"$bin" run --synthetic Qwen3-0.6B --prompt-ids x --max-new 4 --dtype f16 >/dev/null 2>&1
[ $? -eq 2 ] || fail "run --dtype f16 must exit 2"
tmp=${TMPDIR:-/tmp}/sfi-gpu-test.$$
mkdir -p "$tmp" || fail "mkdir $tmp"
trap 'rm -rf "$tmp"' EXIT
printf '1 2 x\n' > "$tmp/bad.ids"
msg=$("$bin" run --synthetic Qwen3-0.6B --prompt-ids "$tmp/bad.ids" --max-new 4 2>&1)
[ $? -eq 1 ] || fail "a malformed --prompt-ids file must exit 1"
echo "$msg" | grep -q "bad.ids:1: byte 5" || fail "malformed ids: message does not name file and byte: $msg"
printf '1 2\0003\n' > "$tmp/nul.ids"
msg=$("$bin" run --synthetic Qwen3-0.6B --prompt-ids "$tmp/nul.ids" --max-new 4 2>&1)
[ $? -eq 1 ] || fail "a NUL byte in --prompt-ids must exit 1 (not truncate the prompt)"
echo "$msg" | grep -q "0x00" || fail "NUL byte: message does not say so: $msg"
printf '5 6 7\n' > "$tmp/ok.ids"
msg=$("$bin" run --synthetic nope --prompt-ids "$tmp/ok.ids" --max-new 4 2>&1)
[ $? -eq 1 ] || fail "an unknown preset must exit 1"
echo "$msg" | grep -q "unknown model preset 'nope'" || fail "unknown preset: $msg"
msg=$("$bin" run --synthetic Qwen3-0.6B --prompt-ids "$tmp/ok.ids" --max-new 4 --param K=0 2>&1)
[ $? -eq 2 ] || fail "an out-of-range --param must exit 2"
msg=$("$bin" run --synthetic Qwen3-0.6B --replay "$tmp/ok.ids" --max-new 4 2>&1)
[ $? -eq 1 ] || fail "a non-trace --replay must exit 1"
echo "$msg" | grep -q "ok.ids" || fail "bad --replay: message does not name the file: $msg"

out=$("$bin" check --quick 2>&1)
rc=$?
echo "$out"
if [ $rc -eq 77 ]; then
    echo "$out" | grep -q 'no CUDA device' || fail "exit 77 without saying why"
    echo "SKIP: no CUDA device"
    exit 77
fi
[ $rc -eq 0 ] || fail "sfi-gpu check --quick exited $rc"
echo "$out" | grep -q '^check: all .* cases passed' || fail "no summary line"
exit 0
