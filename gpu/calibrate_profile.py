#!/usr/bin/env python3
"""Re-express a `sfi-gpu bench` profile's efficiencies in sfi-sim's cost model.

`sfi-gpu bench` writes efficiencies from its own byte counts (see
sfi-gpu(1)). sfi-sim predicts a kernel as bytes / (bandwidth * efficiency)
plus a launch cost, with its own byte model per kernel class. This script
asks `sfi-sim validate` for the time each measurement would take under the
default profile (t_def, efficiency e_def, launch cost L) and sets, per
kernel class, the efficiency that reproduces the measured time t_meas:

    e = e_def * (t_def - L) / (t_meas - L)      (median over the class)

so that `sfi-sim validate --profile` then agrees with the measurements.
Runs on the build machine (no GPU needed). The profile is rewritten through
a temporary file and a rename.

usage: calibrate_profile.py SFI_SIM PROFILE.json [DEFAULT_PROFILE.json]
"""
import json
import os
import statistics
import subprocess
import sys

CLASS = {  # measurement kernel name -> efficiency class (sim/sfi_hw.h)
    "attn_dense": "attn_dense",
    "attn_dense_nologits": "attn_dense",
    "attn_sparse": "attn_sparse",
    "selector": "selector",
    "topk": "topk",
    "reorg": "reorg",
}


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    sim, path = argv[1], argv[2]
    default_path = argv[3] if len(argv) == 4 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "sim", "profiles", "default.json")
    try:
        with open(path) as f:
            prof = json.load(f)
        with open(default_path) as f:
            dflt = json.load(f)
    except (OSError, ValueError) as e:
        print(f"calibrate_profile: {e}", file=sys.stderr)
        return 1
    launch_us = float(dflt.get("launch_us", 3.0))
    out = subprocess.run([sim, "validate", "--profile", path], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"calibrate_profile: {sim} validate failed:\n{out.stderr}", file=sys.stderr)
        return 1
    ratios = {}
    for line in out.stdout.splitlines():
        cols = line.split()
        if not cols or line.startswith("#") or cols[0] == "kernel" or cols[0] not in CLASS:
            continue
        try:
            t_meas, t_def = float(cols[7]), float(cols[8])
        except (IndexError, ValueError):
            continue
        c = CLASS[cols[0]]
        e_def = float(dflt["efficiency"][c])
        if t_meas > launch_us and t_def > launch_us:
            ratios.setdefault(c, []).append(e_def * (t_def - launch_us) / (t_meas - launch_us))
    if not ratios:
        print("calibrate_profile: no measurement could be compared", file=sys.stderr)
        return 1
    eff = prof.setdefault("efficiency", {})
    for c, r in sorted(ratios.items()):
        old = eff.get(c)
        eff[c] = round(min(1.0, max(0.01, statistics.median(r))), 3)
        print(f"{c:12s} {old!s:>8} -> {eff[c]:.3f}  (from {len(r)} measurement(s))")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(prof, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
