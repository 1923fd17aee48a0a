#!/usr/bin/env python3
"""What a user would run instead of sfi-gpu run: Hugging Face transformers'
`generate` on the same model shape with random bf16 weights, timed on the
same GPU (run it in the same device session as `sfi-gpu run --bench`).

For each context length: a batch of random prompts of that many tokens,
greedy decoding, two ways:
  static:  a static KV cache, with which generate compiles the decoding
           step (torch.compile, "reduce-overhead": CUDA graphs), the fastest
           transformers path;
  dynamic: eager PyTorch with the default dynamic cache.
Decode tokens/s = batch * (n2 - n1) / (t(n2) - t(n1)), from generate calls
of n1 and n2 new tokens (each the best of two) after a warm-up that ran every
timed length once (so prefill cancels and no compilation is timed); prefill
tokens/s from a one-token generate.
Prints one JSON object per (context, way).
"""
import argparse
import json
import sys
import time

import torch


def load_config(path):
    from transformers import Qwen3Config
    with open(path) as f:
        c = json.load(f)
    c.pop("architectures", None)
    cfg = Qwen3Config(**{k: v for k, v in c.items() if not k.startswith("_")})
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="src/presets/Qwen3-0.6B.json")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", default="8192,16384")
    ap.add_argument("--ways", default="static,dynamic")
    ap.add_argument("--n1", type=int, default=8)
    ap.add_argument("--n2", type=int, default=40)
    a = ap.parse_args()
    from transformers import Qwen3ForCausalLM
    torch.manual_seed(0)
    cfg = load_config(a.config)
    cfg.torch_dtype = torch.bfloat16
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    ctxs = [int(x) for x in a.ctx.split(",")]
    for way in a.ways.split(","):
        if way == "static":
            # a static cache makes generate compile the decoding forward itself
            # (CUDA graphs, "reduce-overhead"); wrapping model.forward by hand
            # breaks on the graphs' reused outputs across generate calls
            from transformers import CompileConfig
            model.generation_config.cache_implementation = "static"
            model.generation_config.compile_config = CompileConfig(fullgraph=True,
                                                                   mode="reduce-overhead")
        else:
            model.generation_config.cache_implementation = None
            model.generation_config.compile_config = None
        for ctx in ctxs:
            ids = torch.randint(0, cfg.vocab_size, (a.batch, ctx), device="cuda")
            mask = torch.ones_like(ids)

            def gen(n):
                torch.cuda.synchronize()
                t = time.perf_counter()
                with torch.no_grad():
                    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                         min_new_tokens=n, do_sample=False, pad_token_id=0)
                torch.cuda.synchronize()
                assert out.shape[1] == ctx + n, out.shape
                return time.perf_counter() - t

            import transformers
            rec = {"way": way, "ctx": ctx, "batch": a.batch, "config": a.config,
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "gpu": torch.cuda.get_device_name()}
            try:
                # warm-up with every length that is timed: a static cache is
                # sized by ctx + max_new_tokens, so each length compiles (and
                # captures graphs) once; an earlier version that warmed up
                # with n1 alone timed n2's compilation
                t0 = time.perf_counter()
                for n in (a.n1, a.n2, 1):
                    gen(n)
                rec["warmup_s"] = time.perf_counter() - t0
                # best of two: the second call of a length shows no compile
                t1 = min(gen(a.n1), gen(a.n1))
                t2 = min(gen(a.n2), gen(a.n2))
                tp = min(gen(1), gen(1))
                rec["decode_tok_s"] = a.batch * (a.n2 - a.n1) / (t2 - t1)
                rec["prefill_tok_s"] = a.batch * ctx / tp
            except Exception as ex:  # report, go on with the next setup
                rec["error"] = repr(ex)[:300]
            print(json.dumps(rec), flush=True)
            torch.cuda.empty_cache()
        torch._dynamo.reset()


if __name__ == "__main__":
    sys.exit(main())
