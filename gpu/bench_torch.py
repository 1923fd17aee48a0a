#!/usr/bin/env python3
"""PyTorch SDPA on the shapes of `sfi-gpu bench` (same device session).

Decode attention of one query per request over a contiguous bf16 KV cache
[batch, kv_heads, ctx, dim]. Two formulations are timed and the faster one
is reported, each under every SDPA backend that accepts it:
  gqa:     q [batch, heads, 1, dim] with enable_gqa=True;
  grouped: q [batch, kv_heads, group, dim] (the group's query heads as a
           short query sequence; no mask: identical math for decode).
Prints one line per context: "sdpa ctx=N us=T backend=NAME form=F".
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_us(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--ctx", default="16384,32768,65536,131072")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return 77
    dev = "cuda"
    B, H, HK, D = a.batch, a.heads, a.kv_heads, a.dim
    G = H // HK
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for ctx in sorted({int(c) for c in a.ctx.split(",") if c}):
        k = torch.randn(B, HK, ctx, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, HK, ctx, D, device=dev, dtype=torch.bfloat16)
        forms = {
            "gqa": (torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16),
                    dict(enable_gqa=True)),
            "grouped": (torch.randn(B, HK, G, D, device=dev, dtype=torch.bfloat16), {}),
        }
        best = None
        for fname, (q, kw) in forms.items():
            for be in backends:
                if be == SDPBackend.MATH and ctx > 32768:
                    continue  # materialises the score matrix; never the fastest
                try:
                    with sdpa_kernel([be]):
                        t = time_us(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
                except Exception as e:  # backend refuses these shapes
                    print(f"  ctx={ctx} {fname} {be.name}: not available ({type(e).__name__})")
                    continue
                print(f"  ctx={ctx} {fname} {be.name}: {t:.1f} us")
                if best is None or t < best[0]:
                    best = (t, be.name, fname)
        del k, v
        torch.cuda.empty_cache()
        if best:
            print(f"sdpa ctx={ctx} us={best[0]:.2f} backend={best[1]} form={best[2]}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
