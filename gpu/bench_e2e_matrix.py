#!/usr/bin/env python3
"""Whole-decode-step measurements of `sfi-gpu run --bench` over a matrix of
model shapes, batch sizes, contexts and modes, written as an sfi-sim profile
("step_measurements", the format of gpu/profiles/h100-e2e.json) that
`sfi-sim validate` reads.

Every configuration is one `sfi-gpu run --synthetic PRESET --replay TRACE
--replay-ctx CTX --batch B --mode M --bench --json` process (random bf16
weights made on the GPU, teacher-forced on the trace's token stream). A
configuration the engine refuses (it does not fit the GPU's memory) is
recorded under "skipped" with the engine's message, not measured. The output
file is rewritten after every configuration, so a run cut short keeps what it
measured.

    gpu/bench_e2e_matrix.py --sfi-gpu ./sfi-gpu --out h100-steps.json \\
        --models Qwen3-0.6B,Qwen3-1.7B,Qwen3-4B --batches 1,4,16 \\
        --contexts 8192,16384,32768 --modes dense,sfi

--tp N runs every configuration with `sfi-gpu run --tp N` (tensor
parallelism over GPUs 0..N-1) and records "tp": N in its entries (sfi-sim
validate prices an entry at its tp; entries without the key are tp 1), with
the bytes each GPU sends into all-reduces and all-gathers per step.

The profile's "gpu" (the GPU sfi-sim validate prices the steps on) is the
device the runs use, from `nvidia-smi --query-gpu=name` (GPUs 0..N-1, which
must be alike) mapped to sfi-sim's GPU names (H100-SXM, H200, B200); a
device sfi-sim does not know is recorded by its own name, for `sfi-sim
validate --gpu FILE` to describe. --gpu NAME overrides the detection. --name
defaults to the output file's name without .json.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time


def sim_gpu_name(dev):
    """sfi-sim's name (sim/sfi_hw.c presets) for an nvidia-smi device name,
    else the device's own: an H100 other than the SXM part (PCIe, NVL) has
    other bandwidths than sfi-sim's H100-SXM."""
    d = dev.upper()
    if "H200" in d:
        return "H200"
    if "B200" in d:
        return "B200"
    if "H100" in d and ("SXM" in d or "HBM3" in d) and "NVL" not in d:
        return "H100-SXM"
    return dev


def detect_gpus(n):
    """(name, driver) of GPUs 0..n-1 from nvidia-smi, or an error message
    (nvidia-smi missing or listing fewer, GPUs that differ)."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True)
    except OSError as e:
        return None, "nvidia-smi: %s" % e
    rows = [[x.strip() for x in ln.split(",")] for ln in p.stdout.strip().splitlines() if ln.strip()]
    if p.returncode != 0 or len(rows) < n:
        return None, "nvidia-smi lists %d GPUs, the runs use %d" % (len(rows), n)
    names = {r[0] for r in rows[:n]}
    if len(names) > 1:
        return None, "GPUs 0..%d differ (%s): one profile holds one GPU" % (
            n - 1, ", ".join(sorted(names)))
    return (rows[0][0], rows[0][1] if len(rows[0]) > 1 else "driver ?"), None


def run_one(a, model, layers, batch, ctx, mode):
    cmd = [a.sfi_gpu, "run", "--synthetic", model, "--replay", a.trace, "--replay-ctx",
           str(ctx), "--batch", str(batch), "--max-new", str(a.new_tokens), "--mode", mode,
           "--bench", "--json", "--no-digest", "--tokenizer", a.tokenizer]
    if a.tp > 1:
        cmd += ["--tp", str(a.tp)]
    if layers:
        cmd += ["--layers", str(layers)]
    cmd += a.extra
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return None, msg, wall, " ".join(cmd)
    last = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not last:
        return None, "no JSON line in the output", wall, " ".join(cmd)
    return json.loads(last[-1]), None, wall, " ".join(cmd)


def entry(a, model, layers, batch, ctx, mode, out):
    b = out["bench"]
    e = {"model": model, "context": ctx, "batch": batch, "new_tokens": a.new_tokens,
         "mode": mode, "dtype": "bf16", "tp": a.tp}
    if layers:
        e["layers"] = layers
    e.update({"replay": a.trace, "tokenizer": a.tokenizer,
              "decode_tokens_per_s": round(b["decode_tokens_per_s"], 1),
              "prefill_tokens": b["prefill_tokens"], "prefill_s": round(b["prefill_s"], 3),
              "copy_gb_per_s": round(b["copy_gb_per_s"], 1),
              "weight_bytes": b["weight_bytes"],
              "weight_bytes_all": b.get("weight_bytes_all", b["weight_bytes"]),
              "kv_bytes_per_position": b["kv_bytes_per_position"], "steps": {}})
    if "attn_split_rows" in b:
        e["attn_split_rows"] = b["attn_split_rows"]
    if "cond_graph" in b:  # one GPU's SFI fast steps ran the graph's fast body
        e["cond_graph"] = b["cond_graph"]
    if a.tp > 1:
        e["allreduce_bytes_per_step"] = b.get("allreduce_bytes_per_step", 0)
        e["gather_bytes_per_step"] = b.get("gather_bytes_per_step", 0)
    for cls, c in b["classes"].items():
        e["steps"][cls] = {"n": c["steps"], "mean_ms": round(c["mean_ms"], 4),
                           "p50_ms": round(c["p50_ms"], 4), "p99_ms": round(c["p99_ms"], 4),
                           "bytes_per_step": int(c["bytes_per_step"]),
                           "fraction_of_copy": round(c["fraction_of_copy"], 4)}
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sfi-gpu", default="./sfi-gpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default=None,
                    help="the profile's name [the --out file's name without .json]")
    ap.add_argument("--gpu", default=None,
                    help="the profile's \"gpu\" (an sfi-sim GPU name or file) [the device "
                    "the runs use, from nvidia-smi]")
    ap.add_argument("--trace", default="traces/kjv-32k.db")
    # the trigger set comes from the tokenizer's vocabulary: without it a
    # synthetic model's SFI run has slow steps from T_max only
    ap.add_argument("--tokenizer", default="tests/fixtures/qwen3-tokenizer")
    ap.add_argument("--models", default="Qwen3-0.6B,Qwen3-1.7B,Qwen3-4B",
                    help="presets, each optionally PRESET:LAYERS (a layer cut)")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--contexts", default="8192,16384,32768")
    ap.add_argument("--modes", default="dense,sfi")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor parallelism: sfi-gpu run --tp N over GPUs 0..N-1 (1)")
    ap.add_argument("--max-batch-tokens", type=int, default=0,
                    help="skip configurations with batch * context above this (0: none)")
    ap.add_argument("--append", action="store_true",
                    help="add to the measurements already in --out")
    ap.add_argument("extra", nargs="*", help="more sfi-gpu run options (after --)")
    a = ap.parse_args()
    found, why = detect_gpus(max(a.tp, 1))
    if a.gpu is None and not found:
        sys.exit("bench_e2e_matrix.py: %s (--gpu NAME names the GPU instead)" % why)
    dev, driver = found if found else (a.gpu, "driver not read (%s)" % why)
    gpu = a.gpu if a.gpu is not None else sim_gpu_name(dev)
    name = a.name or os.path.splitext(os.path.basename(a.out))[0]
    prof = {"sfi_profile": 1, "name": name, "gpu": gpu, "source": "", "note": "",
            "measurements": [], "step_measurements": []}
    if a.append and os.path.exists(a.out):
        with open(a.out) as f:
            prof = json.load(f)
        if prof.get("gpu") != gpu:
            sys.exit("bench_e2e_matrix.py: %s holds steps of %s, this device is %s: one profile "
                     "holds one GPU" % (a.out, prof.get("gpu"), gpu))
    prof["source"] = (
        "gpu/bench_e2e_matrix.py: sfi-gpu run --synthetic PRESET --replay %s --replay-ctx CTX "
        "--batch B --max-new %d --mode MODE --bench --tokenizer %s%s on %s, %s; random bf16 weights of the "
        "preset (made on the GPU), teacher-forced on the trace; steps 3..%d timed with CUDA "
        "events; copy bandwidth per entry (1 GiB device-to-device copies, bytes read + "
        "written)" % (a.trace, a.new_tokens, a.tokenizer, " --tp %d" % a.tp if a.tp > 1 else "",
                      ("%d x " % a.tp if a.tp > 1 else "one ") + dev + ", " + driver,
                      datetime.date.today().isoformat(), a.new_tokens - 1))
    prof["note"] = ("Whole decode steps of the GPU engine. Step classes: dense = dense mode; "
                    "slow = a step where at least one request is slow; fast = every request "
                    "fast. bytes_per_step: weights + every request's K/V rows" +
                    (" (per GPU: its share of the heads, MLP and LM head)." if a.tp > 1 else "."))

    note = prof["note"]
    skipped = []

    def save():
        # sfi-sim reads profiles strictly (unknown keys are errors): the
        # configurations that were refused go into the note
        out = dict(prof)
        if skipped:
            out["note"] = note + " Not measured (the engine refused them: they do not fit " \
                "the GPU): " + "; ".join(skipped) + "."
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        os.replace(tmp, a.out)

    for spec in a.models.split(","):
        model, _, layers = spec.partition(":")
        layers = int(layers) if layers else 0
        for ctx in [int(x) for x in a.contexts.split(",")]:
            for batch in [int(x) for x in a.batches.split(",")]:
                if a.max_batch_tokens and batch * ctx > a.max_batch_tokens:
                    continue
                for mode in a.modes.split(","):
                    out, err, wall, cmd = run_one(a, model, layers, batch, ctx, mode)
                    tag = "%s%s%s ctx %d batch %d %s" % (
                        model, ":%d" % layers if layers else "",
                        " tp %d" % a.tp if a.tp > 1 else "", ctx, batch, mode)
                    if err:
                        print("%-40s skipped (%.0f s): %s" % (tag, wall, err), flush=True)
                        skipped.append(tag)
                    else:
                        e = entry(a, model, layers, batch, ctx, mode, out)
                        prof["step_measurements"].append(e)
                        cls = " ".join("%s %.3f ms (%.1f%%)" % (k, v["mean_ms"],
                                                               100 * v["fraction_of_copy"])
                                       for k, v in e["steps"].items())
                        print("%-40s %8.1f tok/s  %s  [%.0f s]" %
                              (tag, e["decode_tokens_per_s"], cls, wall), flush=True)
                    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
