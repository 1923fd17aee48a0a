#!/usr/bin/env python3
"""Builds the Hugging Face conformance fixtures of sfi-ref (tests/fixtures/hf).

Run once on a machine with torch + transformers (no network needed):

    python3 tests/make_hf_fixtures.py [--out tests/fixtures/hf]
        [--real-model ../shared/models/sfi-small-qwen3]

It writes, from fixed seeds:
  * tiny random-weight checkpoints (config.json + model.safetensors) of
    Qwen3ForCausalLM (f32, separate lm_head) and Qwen3MoeForCausalLM (bf16,
    tied embeddings; one with norm_topk_prob and an mlp-only layer, one
    without renormalization and decoder_sparse_step 2);
  * for each, prompts of ids in [0, vocab) (no tokenizer involved), the
    logits transformers computes at every prompt position (float64 model,
    stored as little-endian float32: MODEL.PROMPT.logits.f32, [n][vocab])
    and its greedy continuation;
  * for the real trained model (when present): token ids of a few prompts
    (its own tokenizer) and transformers' greedy continuation in dense mode,
    plus a 4096-token prompt of real text (the GPL-3 text, Debian's
    /usr/share/common-licenses/GPL-3) for the benchmark note.

Everything is summarized in expected.json, which the C tests read.

Weights are drawn with std 1/sqrt(fan_in) (not transformers' 0.02, which
gives near-uniform logits and so near-ties in greedy decoding), norms
around 1, and rounded to what the stored dtype holds before the reference
logits are computed, so the C side sees exactly the weights torch used.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from transformers import (Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

VOCAB = 512
N_NEW = 24


def randomize(model, seed, dtype, tied):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights
                w = 1.0 + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            else:
                fan_in = p.shape[-1]
                w = torch.randn(p.shape, generator=g, dtype=torch.float64) / fan_in ** 0.5
                if name.endswith("embed_tokens.weight") and not tied:
                    # unit-scale embeddings; tied ones double as the
                    # lm_head and keep its 1/sqrt(fan_in) scale
                    w = w * fan_in ** 0.5
            # round to the stored dtype so the checkpoint holds exactly these
            p.copy_(w.to(dtype).to(torch.float64).to(p.dtype))


def prompts_for(seed, n_prompts):
    g = torch.Generator().manual_seed(seed + 1000)
    lens = [40, 23, 57][:n_prompts]
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lens]


@torch.no_grad()
def reference(model64, ids):
    x = torch.tensor([ids], dtype=torch.long)
    logits = model64(input_ids=x).logits[0]          # [n, vocab] float64
    seq = list(ids)
    greedy = []
    margins = []
    for _ in range(N_NEW):
        lg = model64(input_ids=torch.tensor([seq])).logits[0, -1]
        top = torch.topk(lg, 2)
        tok = int(torch.argmax(lg))   # first maximum: ties to the smaller id
        greedy.append(tok)
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(tok)
    return logits, greedy, margins


def build(kind, name, out, seed, dtype, **cfg_extra):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=96, max_position_embeddings=256,
                  rope_theta=10000.0, rms_norm_eps=1e-6,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
    common.update(cfg_extra)
    if kind == "dense":
        cfg = Qwen3Config(**common)
        model = Qwen3ForCausalLM(cfg)
    else:
        cfg = Qwen3MoeConfig(**common)
        model = Qwen3MoeForCausalLM(cfg)
    model.eval()
    randomize(model, seed, dtype, cfg.tie_word_embeddings)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.to(dtype).save_pretrained(d, safe_serialization=True)
    # The reference loads the saved checkpoint back, as a user would, in
    # float64 (converting the in-memory model would also round buffers such
    # as RoPE's inv_freq to the storage dtype).
    cls = Qwen3ForCausalLM if kind == "dense" else Qwen3MoeForCausalLM
    model64 = cls.from_pretrained(d, dtype=torch.float64, attn_implementation="eager")
    model64.eval()
    # the grouped-mm experts kernel has no float64; the eager loop does
    model64.config._experts_implementation = "eager"
    entry = {"dir": name, "kind": kind, "dtype": str(dtype).replace("torch.", ""),
             "prompts": []}
    for i, ids in enumerate(prompts_for(seed, 2)):
        logits, greedy, margins = reference(model64, ids)
        fn = "%s.p%d.logits.f32" % (name, i)
        logits.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(out, fn))
        entry["prompts"].append({
            "ids": ids, "logits": fn, "n": len(ids), "vocab": VOCAB,
            "max_abs_logit": float(logits.abs().max()),
            "greedy": greedy, "greedy_min_margin": min(margins)})
    return entry


@torch.no_grad()
def real_model(path, out):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    model = Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float64,
                                             attn_implementation="eager")
    model.eval()
    texts = ["The kernel scheduler decides which task runs next.",
             "To open a file in Python, use the built-in",
             "In Perl, a hash is",
             "Documentation/admin-guide: how to configure the network interface.\n"]
    res = []
    for t in texts:
        ids = tok(t)["input_ids"]
        seq = list(ids)
        greedy, margins = [], []
        for _ in range(32):
            lg = model(input_ids=torch.tensor([seq])).logits[0, -1]
            top = torch.topk(lg, 2)
            greedy.append(int(torch.argmax(lg)))
            margins.append(float(top.values[0] - top.values[1]))
            seq.append(greedy[-1])
        res.append({"text": t, "ids": ids, "greedy": greedy,
                    "greedy_min_margin": min(margins)})
    gpl = "/usr/share/common-licenses/GPL-3"
    long_ids = None
    if os.path.exists(gpl):
        ids = tok(open(gpl, encoding="utf-8").read())["input_ids"][:4096]
        if len(ids) == 4096:
            long_ids = "real-4k.ids"
            with open(os.path.join(out, long_ids), "w") as f:
                f.write(" ".join(map(str, ids)) + "\n")
    return {"dir": os.path.basename(os.path.normpath(path)), "prompts": res,
            "prompt_4k": long_ids}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "fixtures", "hf"))
    ap.add_argument("--real-model",
                    default=os.path.join(here, "..", "..", "shared", "models", "sfi-small-qwen3"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    models = [
        build("dense", "tiny-qwen3", a.out, 11, torch.float32, tie_word_embeddings=False),
        build("moe", "tiny-qwen3-moe", a.out, 12, torch.bfloat16, tie_word_embeddings=True,
              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1),
        build("moe", "tiny-qwen3-moe-nonorm", a.out, 13, torch.float32,
              tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
              moe_intermediate_size=32, norm_topk_prob=False, decoder_sparse_step=2,
              mlp_only_layers=[]),
    ]
    doc = {"generator": "tests/make_hf_fixtures.py",
           "torch": torch.__version__, "transformers": transformers.__version__,
           "n_new": N_NEW, "models": models}
    if os.path.isdir(a.real_model):
        doc["real_model"] = real_model(a.real_model, a.out)
    else:
        print("note: %s absent, real-model greedy tokens not recorded" % a.real_model,
              file=sys.stderr)
    with open(os.path.join(a.out, "expected.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
