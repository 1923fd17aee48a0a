#!/usr/bin/env python3
"""Record SFI decode traces (sfi-trace(5)) from a local Hugging Face causal LM.

Greedy full-KV decoding with transformers (eager attention, so the dense
attention probabilities of every layer are observable through the model's
attention outputs), with each step labelled slow or fast by the same trigger
policy as ref/ (sfi(7) TRIGGERS: step 0 slow; step t slow when x_{t-1} is
a trigger token or T_max steps have passed since the last slow step). Levels:

  tokens  requests and steps;
  full    plus per step, layer and query head the top-M positions and
          probabilities of the dense attention and the tail mass, and with
          --snapshot-layers the query vectors (after RoPE) and the key/value
          caches of those layers.

(The summary level needs SFI's Selector, which lives in ref/: use
`sfi-ref run --trace-level summary`.)

Conventions match sfi-ref: step t feeds x_{t-1} (the last prompt token at
t = 0, whose forward pass is the prefill), attends over ctx_len = n_prompt + t
positions and produces x_t.

  record_hf.py --model DIR --out OUT.db [--prompt-ids 1,2,3 | --prompt-ids-file F
               | --prompt-text F] [--max-new N] [--level tokens|full] [--top-m M]
               [--snapshot-layers 0,3 [--snapshot-every N]] [--policy sfi]
               [--param T_max=64] [--device cpu|cuda] [--dtype float32|bfloat16]
  record_hf.py --compare A.db B.db [--top-m M] [--tol T]

--compare checks that two traces agree: the same prompts, tokens, step kinds
and reasons, and equal top-M position sets on every (step, layer, head)
recorded in both (positions whose probability is within --tol of the M-th
largest may swap: float rounding orders near-ties differently).
Exit status: 0 ok, 1 failure or disagreement, 2 usage.
"""

import argparse
import datetime
import fcntl
import hashlib
import json
import os
import sqlite3
import stat
import struct
import sys

SCHEMA_MAJOR, SCHEMA_MINOR = 1, 0
APPLICATION_ID = 0x53464954  # "SFIT"

# ref/sfi_state.h
PREFILL, SLOW, FAST = 0, 1, 2
R_NONE, R_FIRST, R_TRIGGER, R_TMAX, R_INTERVAL, R_ALWAYS, R_PROMPT = range(7)

# Kept identical to src/sfi_trace.c's schema_sql.
SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
CREATE TABLE requests(id INTEGER PRIMARY KEY, n_prompt INTEGER NOT NULL,
 prompt BLOB NOT NULL, n_steps INTEGER NOT NULL DEFAULT 0);
CREATE TABLE steps(request INTEGER NOT NULL, step INTEGER NOT NULL,
 ctx_len INTEGER NOT NULL, token INTEGER NOT NULL, kind INTEGER NOT NULL,
 reason INTEGER NOT NULL, PRIMARY KEY(request, step)) WITHOUT ROWID;
CREATE TABLE selections(request INTEGER NOT NULL, step INTEGER NOT NULL,
 layer INTEGER NOT NULL, kv_head INTEGER NOT NULL, n_selected INTEGER NOT NULL,
 selected BLOB NOT NULL, captured_mass REAL NOT NULL, lambda REAL NOT NULL,
 UNIQUE(request, step, layer, kv_head));
CREATE TABLE fast_mass(request INTEGER NOT NULL, step INTEGER NOT NULL,
 layer INTEGER NOT NULL, kv_head INTEGER NOT NULL, mass REAL NOT NULL,
 PRIMARY KEY(request, step, layer, kv_head)) WITHOUT ROWID;
CREATE TABLE topm(request INTEGER NOT NULL, step INTEGER NOT NULL,
 layer INTEGER NOT NULL, head INTEGER NOT NULL, m INTEGER NOT NULL,
 positions BLOB NOT NULL, probs BLOB NOT NULL, tail_mass REAL NOT NULL,
 UNIQUE(request, step, layer, head));
CREATE TABLE snapshots(request INTEGER NOT NULL, step INTEGER NOT NULL,
 layer INTEGER NOT NULL, kind TEXT NOT NULL, rows INTEGER NOT NULL,
 cols INTEGER NOT NULL, data BLOB NOT NULL, UNIQUE(request, step, layer, kind));
"""

DEFAULT_PARAMS = {"n_sink": 4, "n_recent": 256, "K": 2048, "T_max": 64, "W_decode": 1,
                  "W_prefill": 16, "alpha": 0.5, "gamma": 1.0, "beta": 1.0, "p": 2.0,
                  "eta": 0.5, "lambda_clip": 0.02, "nms_radius": 2, "alpha_soft": 0.5,
                  "T": 1.0, "alpha_cross": 0.35, "eps": 1e-8, "trigger_chars": ".?!;\n"}


def fail(msg, code=1):
    print("record_hf.py: " + msg, file=sys.stderr)
    sys.exit(code)


# ---------------------------------------------------------------- trigger set

def bytes_to_unicode():
    """GPT-2's byte <-> printable-unicode table used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def trigger_ids(tok_dir, chars, n_vocab):
    """is_trigger[n] of sfi(7) TRIGGERS from DIR/vocab.json (+ added tokens
    of tokenizer_config.json), as src/sfi_vocab.c builds it; None when DIR has
    no vocab.json (then only T_max/first make slow steps, as in sfi-ref)."""
    vpath = os.path.join(tok_dir, "vocab.json")
    if not os.path.exists(vpath):
        return None
    with open(vpath, encoding="utf-8") as f:
        vocab = json.load(f)
    inv = {v: k for k, v in bytes_to_unicode().items()}
    tokens = {}
    for text, i in vocab.items():
        try:
            tokens[i] = bytes(inv[c] for c in text)
        except KeyError:
            tokens[i] = text.encode("utf-8")
    cpath = os.path.join(tok_dir, "tokenizer_config.json")
    if os.path.exists(cpath):
        with open(cpath, encoding="utf-8") as f:
            cfg = json.load(f)
        for i, t in (cfg.get("added_tokens_decoder") or {}).items():
            tokens[int(i)] = t["content"].encode("utf-8")
    n = max(n_vocab, max(tokens) + 1 if tokens else 0)
    is_trig = bytearray(n)
    ends = [c.encode("utf-8") for c in chars]
    for i, b in tokens.items():
        hit = b"\n" in b
        s = b.rstrip(b" ")
        if not hit:
            hit = any(s.endswith(e) for e in ends)
        if hit:
            is_trig[i] = 1
    return is_trig


class Trigger:
    """ref/sfi_state.c's sfi_trigger_next."""

    def __init__(self, kind, t_max, interval, is_trig):
        self.kind, self.t_max, self.interval, self.is_trig = kind, t_max, interval, is_trig
        self.step, self.since = 0, 0

    def _trig(self, tok):
        return self.is_trig is not None and 0 <= tok < len(self.is_trig) and self.is_trig[tok]

    def next(self, prev):
        d = self.since + 1
        why = R_NONE
        if self.step == 0:
            why = R_FIRST
        elif self.kind == "sfi":
            if self._trig(prev):
                why = R_TRIGGER
            elif self.t_max >= 1 and d >= self.t_max:
                why = R_TMAX
        elif self.kind == "tmax":
            if self.t_max >= 1 and d >= self.t_max:
                why = R_TMAX
        elif self.kind == "boundary":
            if self._trig(prev):
                why = R_TRIGGER
        elif self.kind == "interval":
            if self.interval >= 1 and d >= self.interval:
                why = R_INTERVAL
        elif self.kind == "always":
            why = R_ALWAYS
        self.step += 1
        if why != R_NONE:
            self.since = 0
            return SLOW, why
        self.since = d
        return FAST, R_NONE


# ---------------------------------------------------------------- writer

def sha256_file(path):
    if not os.path.exists(path):
        return "(absent)"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def i32(values):
    return struct.pack("<%di" % len(values), *values)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def replaceable(path):
    """None when a new trace may be written at path, else why not: the rule
    of sfi_trace_replaceable (src/sfi_trace.c). Only an empty file or an sfi
    trace that no other writer records (flock) and no other program holds
    locked is replaced; a symbolic link is followed."""
    if not os.path.lexists(path):
        return None
    real = os.path.realpath(path)
    if not os.path.exists(real):
        return "a dangling symbolic link; not writing a trace through it"
    if not stat.S_ISREG(os.stat(real).st_mode):
        return "exists and is not a regular file; a trace is an SQLite database"
    if not os.access(real, os.W_OK):
        return "cannot replace: Permission denied"
    with open(real, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return "locked: another sfi process is recording this trace; not replacing it"
        head = f.read(16)
        if not head:
            return None
        if head != b"SQLite format 3\0":
            return "exists and is not an sfi trace; not replacing it (remove it or choose another name)"
        db = None
        try:
            db = sqlite3.connect(real, timeout=0, isolation_level=None)
            if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                return "an SQLite database that is not an sfi trace; not replacing it"
            db.execute("BEGIN EXCLUSIVE")
            db.execute("ROLLBACK")
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                return "locked by another program (database is locked); not replacing it"
            return "exists and cannot be read as an sfi trace (%s); not replacing it" % e
        except sqlite3.DatabaseError as e:
            return "exists and cannot be read as an sfi trace (%s); not replacing it" % e
        finally:
            if db is not None:
                db.close()
    return None


class Writer:
    """The trace writer of src/sfi_trace.c in Python: WAL, one transaction per
    step (a killed recorder leaves every finished step), complete=1 at the end;
    an existing file is replaced only under the rule of replaceable(), and the
    file is flock()ed while it is written."""

    def __init__(self, path, meta):
        why = replaceable(path)
        if why:
            fail("%s: %s" % (path, why))
        real = os.path.realpath(path)
        for suffix in ("", "-wal", "-shm", "-journal"):
            if os.path.exists(real + suffix):
                os.unlink(real + suffix)
        self.db = sqlite3.connect(real, isolation_level=None)
        # Held until finish(): a second writer sees the trace in use.
        self.lock = open(real, "rb")
        fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.db.execute("PRAGMA application_id=%d" % APPLICATION_ID)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("BEGIN")
        for stmt in SCHEMA.strip().split(";"):
            if stmt.strip():
                self.db.execute(stmt)
        for k, v in meta.items():
            self.db.execute("INSERT INTO meta(key, value) VALUES(?, ?)", (k, str(v)))
        self.db.execute("INSERT INTO meta(key, value) VALUES('complete', '0')")
        self.db.execute("PRAGMA user_version=%d" % SCHEMA_MAJOR)
        self.db.execute("COMMIT")
        self.n_requests = 0

    def add_request(self, prompt):
        rid = self.n_requests
        self.db.execute("BEGIN")
        self.db.execute("INSERT INTO requests(id, n_prompt, prompt, n_steps) VALUES(?, ?, ?, 0)",
                        (rid, len(prompt), i32(prompt)))
        self.db.execute("COMMIT")
        self.n_requests += 1
        return rid

    def step(self, rid, t, ctx_len, token, kind, reason, topm=(), snaps=()):
        """One step and its records in one transaction."""
        self.db.execute("BEGIN")
        self.db.execute("INSERT INTO steps VALUES(?, ?, ?, ?, ?, ?)",
                        (rid, t, ctx_len, token, kind, reason))
        self.db.executemany("INSERT INTO topm VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                            [(rid, t, l, h, len(pos), i32(pos), f32(prob), tail)
                             for (l, h, pos, prob, tail) in topm])
        self.db.executemany("INSERT INTO snapshots VALUES(?, ?, ?, ?, ?, ?, ?)",
                            [(rid, t, l, k, rows, cols, data) for (l, k, rows, cols, data) in snaps])
        self.db.execute("UPDATE requests SET n_steps = ? WHERE id = ?", (t + 1, rid))
        self.db.execute("COMMIT")

    def finish(self):
        self.db.execute("UPDATE meta SET value = '1' WHERE key = 'complete'")
        self.db.execute("PRAGMA journal_mode=DELETE")
        self.db.close()
        self.lock.close()  # after SQLite's connection (POSIX locks)


# ---------------------------------------------------------------- recording

def parse_params(items):
    prm = dict(DEFAULT_PARAMS)
    for kv in items or []:
        if "=" not in kv:
            fail("--param %s: expected KEY=VALUE" % kv, 2)
        k, v = kv.split("=", 1)
        if k not in prm:
            fail("--param %s: unknown key (known: %s)" % (k, ", ".join(prm)), 2)
        if k == "trigger_chars":
            prm[k] = v.replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")
        else:
            try:
                prm[k] = type(DEFAULT_PARAMS[k])(v)
            except ValueError:
                fail("--param %s: '%s' is not a %s" % (k, v, type(DEFAULT_PARAMS[k]).__name__), 2)
    return prm


def read_prompts(args, model_dir):
    if args.prompt_ids:
        return [[int(x) for x in args.prompt_ids.replace(",", " ").split()]]
    if args.prompt_ids_file:
        prompts = []
        with open(args.prompt_ids_file) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        if args.one_prompt:
            lines = [" ".join(lines)]
        for ln in lines:
            prompts.append([int(x) for x in ln.replace(",", " ").split()])
        return prompts
    if args.prompt_text:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.tokenizer or model_dir)
        with open(args.prompt_text, encoding="utf-8") as f:
            return [tok(f.read())["input_ids"]]
    fail("one of --prompt-ids, --prompt-ids-file, --prompt-text is needed", 2)


def record(args):
    import torch
    from transformers import AutoModelForCausalLM

    prm = parse_params(args.param)
    if args.level not in ("tokens", "full"):
        fail("--level %s: record_hf.py records tokens or full (summary needs ref/'s "
             "Selector: use sfi-ref run --trace-level summary)" % args.level, 2)
    model_dir = args.model
    cfg_path = os.path.join(model_dir, "config.json")
    if not os.path.exists(cfg_path):
        fail("%s: no config.json (not a Hugging Face checkpoint directory)" % model_dir)
    with open(cfg_path, encoding="utf-8") as f:
        config_text = f.read()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype,
                                                 attn_implementation="eager")
    model.to(args.device).eval()
    c = model.config
    L, H, KV = c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
    hd = getattr(c, "head_dim", None) or c.hidden_size // H
    tok_dir = args.tokenizer or model_dir
    is_trig = trigger_ids(tok_dir, prm["trigger_chars"], c.vocab_size)
    prompts = read_prompts(args, model_dir)
    for p in prompts:
        if not p or any(x < 0 or x >= c.vocab_size for x in p):
            fail("a prompt is empty or has ids outside [0, %d)" % c.vocab_size)
    snap_layers = sorted({int(x) for x in args.snapshot_layers.split(",")}) \
        if args.snapshot_layers else []
    if any(l < 0 or l >= L for l in snap_layers):
        fail("--snapshot-layers: layers must lie in [0, %d)" % L, 2)
    if snap_layers and args.level != "full":
        fail("--snapshot-layers needs --level full", 2)
    import transformers
    meta = {
        "schema_version": "%d.%d" % (SCHEMA_MAJOR, SCHEMA_MINOR),
        "tool": "record_hf.py",
        "tool_version": "transformers " + transformers.__version__ + ", torch " + torch.__version__,
        "model_config": config_text,
        "tokenizer": "%s; vocab.json %s; merges.txt %s" % (
            os.path.basename(os.path.abspath(tok_dir)),
            sha256_file(os.path.join(tok_dir, "vocab.json")),
            sha256_file(os.path.join(tok_dir, "merges.txt"))),
        "params": json.dumps(prm),
        "policy": args.policy,
        "level": args.level,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "n_vocab": c.vocab_size, "n_layers": L, "n_heads": H, "n_kv_heads": KV,
        "head_dim": hd, "top_m": args.top_m if args.level == "full" else 0,
        "topm_heads": "query",
    }
    full = args.level == "full"

    # Query vectors after RoPE of the snapshot layers, caught by hooks on
    # the attention modules (the model does not return them).
    qcap = {}

    def make_hook(layer):
        from transformers.models.qwen3 import modeling_qwen3 as mq

        def hook(module, a, kw, out):
            hs = kw.get("hidden_states", a[0] if a else None)
            cos, sin = kw["position_embeddings"]
            shp = (*hs.shape[:-1], -1, module.head_dim)
            q = module.q_norm(module.q_proj(hs).view(shp)).transpose(1, 2)
            q, _ = mq.apply_rotary_pos_emb(q, q, cos, sin)
            qcap[layer] = q[0, :, -1, :].float().cpu()
        return hook

    hooks = [model.model.layers[l].self_attn.register_forward_hook(make_hook(l), with_kwargs=True)
             for l in snap_layers]
    w = Writer(args.out, meta)
    total = slow = 0
    with torch.no_grad():
        for prompt in prompts:
            rid = w.add_request(prompt)
            trig = Trigger(args.policy, prm["T_max"], args.interval, is_trig)
            # Prefill all but the last prompt token without attention
            # outputs (they would take n_prompt^2 x heads x layers floats);
            # the last prompt token is step 0's forward pass, as in sfi-ref.
            past = None
            if len(prompt) > 1:
                ids = torch.tensor([prompt[:-1]], device=args.device)
                past = model(input_ids=ids, use_cache=True).past_key_values
            out = model(input_ids=torch.tensor([prompt[-1:]], device=args.device),
                        past_key_values=past, use_cache=True, output_attentions=full)
            past = out.past_key_values
            prev = prompt[-1]
            n_ctx = len(prompt)
            for t in range(args.max_new):
                kind, reason = trig.next(prev)
                if t > 0:
                    out = model(input_ids=torch.tensor([[prev]], device=args.device),
                                past_key_values=past, use_cache=True, output_attentions=full)
                    past = out.past_key_values
                    n_ctx += 1
                logits = out.logits[0, -1].float()
                token = int(torch.argmax(logits).item())
                topm, snaps = [], []
                if full:
                    for l in range(L):
                        a = out.attentions[l][0, :, -1, :n_ctx].float()  # [H, n_ctx]
                        m = min(args.top_m, n_ctx)
                        # Descending probability, ties by ascending position
                        # (stable sort of positions by -p), as sfi-ref.
                        order = torch.sort(-a, dim=-1, stable=True).indices[:, :m]
                        for h in range(H):
                            pos = order[h].tolist()
                            prob = a[h, order[h]].tolist()
                            tail = min(1.0, max(0.0, 1.0 - float(sum(prob))))
                            topm.append((l, h, pos, prob, tail))
                    snap_now = snap_layers and (t % args.snapshot_every == 0 or
                                                t == args.max_new - 1)
                    for l in (snap_layers if snap_now else []):
                        q = qcap[l]
                        snaps.append((l, "q", H, hd, f32(q.reshape(-1).tolist())))
                        kc, vc = past.layers[l].keys, past.layers[l].values
                        for kind_s, tens in (("k", kc), ("v", vc)):
                            x = tens[0, :, :n_ctx, :].float().cpu().contiguous()
                            snaps.append((l, kind_s, KV * n_ctx, hd,
                                          x.numpy().astype("<f4").tobytes()))
                w.step(rid, t, n_ctx, token, kind, reason, topm, snaps)
                total += 1
                slow += kind == SLOW
                prev = token
                if args.stop_token >= 0 and token == args.stop_token:
                    break
    for h in hooks:
        h.remove()
    w.finish()
    print("%s: %d requests, %d steps, %d slow (fraction %.4f), level %s"
          % (args.out, len(prompts), total, slow, slow / max(total, 1), args.level))
    return 0


# ---------------------------------------------------------------- compare

def load(path):
    if not os.path.exists(path):
        fail("%s: no such file" % path)
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    try:
        if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            fail("%s: not an sfi trace" % path)
    except sqlite3.DatabaseError as e:
        fail("%s: %s" % (path, e))
    return db


def compare(a_path, b_path, top_m, tol):
    a, b = load(a_path), load(b_path)
    problems = []
    ra = a.execute("SELECT id, prompt FROM requests ORDER BY id").fetchall()
    rb = b.execute("SELECT id, prompt FROM requests ORDER BY id").fetchall()
    if ra != rb:
        problems.append("requests/prompts differ")
    sa = a.execute("SELECT request, step, ctx_len, token, kind, reason FROM steps "
                   "ORDER BY request, step").fetchall()
    sb = b.execute("SELECT request, step, ctx_len, token, kind, reason FROM steps "
                   "ORDER BY request, step").fetchall()
    n = min(len(sa), len(sb))
    if len(sa) != len(sb):
        problems.append("step counts differ: %d vs %d" % (len(sa), len(sb)))
    for i in range(n):
        if sa[i] != sb[i]:
            problems.append("step %s differs: %s vs %s (request, step, ctx_len, token, kind, "
                            "reason)" % (sa[i][:2], sa[i], sb[i]))
            break
    tb = {}
    for r, s, l, h, pos, prob in b.execute(
            "SELECT request, step, layer, head, positions, probs FROM topm"):
        tb[(r, s, l, h)] = (pos, prob)
    n_cmp = n_bad = 0
    for r, s, l, h, pos, prob in a.execute(
            "SELECT request, step, layer, head, positions, probs FROM topm"):
        other = tb.get((r, s, l, h))
        if other is None:
            continue
        pa = struct.unpack("<%di" % (len(pos) // 4), pos)
        qa = struct.unpack("<%df" % (len(prob) // 4), prob)
        pb = struct.unpack("<%di" % (len(other[0]) // 4), other[0])
        qb = struct.unpack("<%df" % (len(other[1]) // 4), other[1])
        m = min(top_m, len(pa), len(pb))
        if m == 0:
            continue
        n_cmp += 1
        # Near-ties at the M-th place may swap; everything clearly inside must
        # be in both sets.
        cut_a = qa[m - 1] + tol
        cut_b = qb[m - 1] + tol
        sure_a = {p for p, q in zip(pa[:m], qa[:m]) if q > cut_a}
        sure_b = {p for p, q in zip(pb[:m], qb[:m]) if q > cut_b}
        if not (sure_a <= set(pb[:m]) and sure_b <= set(pa[:m])):
            n_bad += 1
            if n_bad <= 3:
                problems.append("top-%d of request %d step %d layer %d head %d differ: %s vs %s"
                                % (m, r, s, l, h, sorted(pa[:m]), sorted(pb[:m])))
        else:
            dmax = max(abs(qa[i] - qb[pb.index(p)]) for i, p in enumerate(pa[:m]) if p in pb[:m])
            if dmax > max(tol, 1e-3):
                n_bad += 1
                if n_bad <= 3:
                    problems.append("top-%d probabilities of request %d step %d layer %d head %d "
                                    "differ by %g" % (m, r, s, l, h, dmax))
    if n_bad > 3:
        problems.append("... %d top-M records differ in all" % n_bad)
    kinds = sum(1 for x in sa[:n] if x[4] == SLOW)
    if problems:
        for p in problems:
            print("record_hf.py --compare: " + p, file=sys.stderr)
        return 1
    print("agree: %d requests, %d steps (%d slow), %d top-%d records compared"
          % (len(ra), n, kinds, n_cmp, top_m))
    return 0


def main():
    ap = argparse.ArgumentParser(
        description="Record SFI decode traces (sfi-trace(5)) from a Hugging Face causal LM, "
                    "or compare two traces.")
    ap.add_argument("--model", help="Hugging Face checkpoint directory")
    ap.add_argument("--out", help="trace to write (an existing sfi trace no one is writing "
                                   "is replaced; anything else is refused)")
    ap.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
    ap.add_argument("--prompt-ids", help="prompt token ids, comma or space separated")
    ap.add_argument("--prompt-ids-file", help="file of prompts, one line of ids per request")
    ap.add_argument("--one-prompt", action="store_true",
                    help="with --prompt-ids-file: all lines form one prompt")
    ap.add_argument("--prompt-text", help="text file tokenized with the model's tokenizer")
    ap.add_argument("--max-new", type=int, default=16, help="tokens to generate (default 16)")
    ap.add_argument("--stop-token", type=int, default=-1, help="stop after this token")
    ap.add_argument("--level", default="tokens", help="tokens (default) or full")
    ap.add_argument("--top-m", type=int, default=4096, help="M of the full level (default 4096)")
    ap.add_argument("--snapshot-layers", help="full level: layers whose q/k/v to store, e.g. 0,3")
    ap.add_argument("--snapshot-every", type=int, default=1,
                    help="snapshots on steps t with t %% N == 0 and the last step (default 1)")
    ap.add_argument("--policy", default="sfi",
                    choices=["sfi", "tmax", "boundary", "interval", "always", "never"])
    ap.add_argument("--interval", type=int, default=64, help="interval policy's period")
    ap.add_argument("--param", action="append", help="SFI parameter KEY=VALUE (T_max, ...)")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two traces")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="--compare: probability tolerance for near-ties (default 1e-4)")
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(args.compare[0], args.compare[1], args.top_m, args.tol))
    if not args.model or not args.out:
        ap.print_usage(sys.stderr)
        fail("--model and --out are needed (or --compare A B)", 2)
    if args.max_new < 1 or args.top_m < 1 or args.snapshot_every < 1:
        fail("--max-new, --top-m and --snapshot-every must be >= 1", 2)
    # Before torch and the model load: a refused --out fails at once.
    why = replaceable(args.out)
    if why:
        fail("%s: %s" % (args.out, why))
    # Written in place, one transaction per step: a run that dies leaves a
    # valid trace of the steps it finished, with complete = 0.
    sys.exit(record(args))


if __name__ == "__main__":
    main()
