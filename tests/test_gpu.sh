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
