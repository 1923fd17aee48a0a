#!/bin/sh
# Issue 19's measurements and checks on one host with 2 GPUs (NVLink), run
# from the source tree root with sfi-gpu built there (or $SFI_GPU):
#   1. sfi-gpu check --bit-exact: the one-GPU engine unchanged (tp 1)
#   2. tests/test_gpu_tp.sh: --tp 2 against one GPU in f32 (--check-tp) on
#      the trained model ($SFI_SHARED/models/sfi-small-qwen3) and the MoE
#      fixture, SFI and dense mode
#   3. sfi-gpu bench-allreduce: ncclAllReduce latency and bus bandwidth
#   4. whole decode steps (gpu/bench_e2e_matrix.py, batch 16, 8K and 32K,
#      dense and SFI): Qwen3-4B shape at tp 1 and tp 2, Qwen3-30B-A3B shape
#      (cut to 8 layers, as h100-steps.json has it: its MoE prefill is
#      slow) at tp 2; written as step_measurements sfi-sim validate reads
# Output under $OUT (default ./tp-out): one log per part, allreduce.json,
# tp1-steps.json, tp2-steps.json (their "gpu" is the device's, from
# nvidia-smi; gpu/profiles/h200-tp-steps.json merges one run's). About 8
# minutes on 2 x H100; each half stays under 10 minutes with its timeouts:
#   gpu/tp_device.sh checks   parts 1-3
#   gpu/tp_device.sh bench    part 4
#   gpu/tp_device.sh          both
#
# NCCL: sfi-gpu opens libnccl.so.2 at run time; on the device machines it
# is PyTorch's (python3 -c 'import nvidia.nccl'), put on LD_LIBRARY_PATH
# here. NVLink multicast (NVLS) stays off.
set -u
what=${1:-all}
case "$what" in
checks | bench | all) ;;
*)
    echo "usage: gpu/tp_device.sh [checks|bench|all]" >&2
    exit 2
    ;;
esac
OUT=${OUT:-./tp-out}
mkdir -p "$OUT"
bin=${SFI_GPU:-./sfi-gpu}
export SFI_SHARED=${SFI_SHARED:-../shared}
export NCCL_NVLS_ENABLE=0
if [ -z "${SFI_NCCL_LIB:-}" ]; then
    d=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    if [ -n "$d" ] && [ -d "$d" ]; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
fi
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
{
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
    nvidia-smi topo -m
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

t0=$(date +%s)
if [ "$what" != bench ]; then
log "1. sfi-gpu check --bit-exact (tp 1)"
timeout 180 "$bin" check --bit-exact > "$OUT/check-bit-exact.log" 2>&1
echo "exit $?" >> "$OUT/check-bit-exact.log"
tail -3 "$OUT/check-bit-exact.log" | tee -a "$OUT/summary.txt"

log "2. tests/test_gpu_tp.sh (--tp 2 --check-tp, f32) [$(($(date +%s) - t0)) s]"
SFI_BUILDDIR=$(dirname "$bin") SFI_SRCDIR=. timeout 180 sh tests/test_gpu_tp.sh \
    > "$OUT/test_gpu_tp.log" 2>&1
echo "exit $?" >> "$OUT/test_gpu_tp.log"
grep -E 'check request|check-tp|SKIP|FAIL|exit' "$OUT/test_gpu_tp.log" | tail -30 |
    tee -a "$OUT/summary.txt"

log "3. sfi-gpu bench-allreduce [$(($(date +%s) - t0)) s]"
timeout 60 "$bin" bench-allreduce --gpus 2 --max-bytes 67108864 > "$OUT/allreduce.txt" 2>&1
echo "exit $?" >> "$OUT/allreduce.txt"
cat "$OUT/allreduce.txt" | tee -a "$OUT/summary.txt"
timeout 60 "$bin" bench-allreduce --gpus 2 --max-bytes 67108864 --json > "$OUT/allreduce.json" \
    2> "$OUT/allreduce-json.err"
fi
[ "$what" = checks ] && exit 0

m="--trace traces/kjv-32k.db --tokenizer tests/fixtures/qwen3-tokenizer --batches 16 \
--contexts 8192,32768 --modes dense,sfi --new-tokens 128"
log "4a. Qwen3-4B, tp 1 [$(($(date +%s) - t0)) s]"
# shellcheck disable=SC2086
timeout 120 python3 gpu/bench_e2e_matrix.py --sfi-gpu "$bin" --out "$OUT/tp1-steps.json" \
    --models Qwen3-4B $m 2>&1 | tee -a "$OUT/summary.txt"
log "4b. Qwen3-4B and Qwen3-30B-A3B:8, tp 2 [$(($(date +%s) - t0)) s]"
# shellcheck disable=SC2086
timeout 360 python3 gpu/bench_e2e_matrix.py --sfi-gpu "$bin" --out "$OUT/tp2-steps.json" \
    --tp 2 --models Qwen3-4B,Qwen3-30B-A3B:8 $m 2>&1 |
    tee -a "$OUT/summary.txt"
log "done [$(($(date +%s) - t0)) s]"
