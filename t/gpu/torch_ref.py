#!/usr/bin/env python3
"""A PyTorch reference for kvgate's logits and speed (issue 30 section 5).

Loads a llama2.c checkpoint (kvgate-generate --export-llama2c: F32, the legacy layout)
into Hugging Face transformers' LlamaForCausalLM, runs token ids through it in bfloat16
on the GPU with attn_implementation="sdpa", writes the logits at the last position (one
per line, as kvgate-generate --prompt-logits does) and compares them with kvgate's;
optionally times a prefill and decode steps.

    torch_ref.py --check-export FILE [--json OUT]       stdlib only: header, sizes, the
                                                        q/k row permutation (see below)
    torch_ref.py --probe [--device D] [--json OUT]      exit 0 when torch, transformers and
                                                        the device are there, else 3 and why
    torch_ref.py --compare-files A B [--tol X]          stdlib only: two logit files
    torch_ref.py --stdlib-forward FILE --ids "1 2 3" [--logits-out F] [--compare NAME=FILE]
                                                        stdlib only, tiny models: the same
                                                        mapping in double precision (below)
    torch_ref.py --model FILE --ids "1 2 3" [--logits-out F] [--compare NAME=FILE ...]
                 [--tol X] [--bench-prefill N] [--bench-decode M] [--bench-batches 1,32]
                 [--bench-ctx C] [--device cuda] [--json OUT]

The checkpoint: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size
(negative: an own classifier follows), seq_len), then F32 token embedding, attention norms,
wq, wk, wv, wo, FFN norms, w1 (gate), w2 (down), w3 (up), the final norm, the legacy
freq_cis tables (seq_len * head_size floats, ignored), and the classifier when untied.
RMSNorm epsilon 1e-5 and RoPE theta 10000: what engine/model_llama2c.c sets for every
llama2.c checkpoint (its exporter refuses models with other values).

RoPE: llama2.c and kvgate rotate adjacent pairs (2i, 2i+1) of each head by angle
pos * theta^(-2i/hd); transformers' rotate_half rotates (i, i + hd/2) by the same angle
pos * theta^(-2i/hd). Row j of the permuted head (HF) is row src(j) of the llama2.c head:
src(j) = 2j for j < hd/2, 2(j - hd/2) + 1 otherwise. Then HF's rotation of P q is P of
llama2.c's rotation of q, and (P q) . (P k) = q . k, so attention scores are unchanged.
--check-export verifies this numerically on the file's head size.

Exit status: 0 pass, 1 a failed check or comparison, 2 usage or I/O errors, 3 torch,
transformers or CUDA not available (--probe and the model mode; the reason on stderr and in
--json as {"available": false, "reason": ...}).
"""
import argparse
import json
import math
import os
import random
import struct
import sys
import time

THETA = 10000.0     # engine/model_llama2c.c: c->rope_theta
EPS = 1e-5          # engine/model_llama2c.c: c->norm_eps


# ---- the checkpoint (stdlib) ----

def read_header(path):
    with open(path, "rb") as f:
        raw = f.read(28)
    if len(raw) != 28:
        raise ValueError("%s: shorter than the 28-byte llama2.c header" % path)
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq = struct.unpack("<7i", raw)
    shared = vocab > 0
    vocab = abs(vocab)
    for name, v in (("dim", dim), ("hidden_dim", hidden), ("n_layers", n_layers), ("n_heads", n_heads),
                    ("n_kv_heads", n_kv), ("vocab_size", vocab), ("seq_len", seq)):
        if v <= 0:
            raise ValueError("%s: header %s = %d" % (path, name, v))
    if dim % n_heads or n_heads % n_kv:
        raise ValueError("%s: dim %d, %d heads, %d kv heads do not divide" % (path, dim, n_heads, n_kv))
    hs = dim // n_heads
    if hs % 2:
        raise ValueError("%s: odd head size %d" % (path, hs))
    return {"dim": dim, "hidden_dim": hidden, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv,
            "vocab_size": vocab, "seq_len": seq, "head_size": hs, "shared_classifier": shared}


def layout(h):
    """[(name, rows, cols, per_layer)] in file order, and the total float count."""
    dim, hid, L, hs = h["dim"], h["hidden_dim"], h["n_layers"], h["head_size"]
    kvd = h["n_kv_heads"] * hs
    parts = [("tok_embeddings", h["vocab_size"], dim, False),
             ("rms_att", 1, dim, True),
             ("wq", h["n_heads"] * hs, dim, True),
             ("wk", kvd, dim, True),
             ("wv", kvd, dim, True),
             ("wo", dim, h["n_heads"] * hs, True),
             ("rms_ffn", 1, dim, True),
             ("w1", hid, dim, True),
             ("w2", dim, hid, True),
             ("w3", hid, dim, True),
             ("rms_final", 1, dim, False),
             ("freq_cis", 2 * h["seq_len"], hs // 2, False)]
    if not h["shared_classifier"]:
        parts.append(("wcls", h["vocab_size"], dim, False))
    out, off = [], 28
    for name, r, c, per_layer in parts:
        for l in range(L if per_layer else 1):
            out.append({"name": name, "layer": l if per_layer else None, "rows": r, "cols": c, "offset": off})
            off += 4 * r * c
    return out, off


def hf_row_src(j, hd):
    """The llama2.c row (within a head of hd rows) that HF's row j takes."""
    half = hd // 2
    return 2 * j if j < half else 2 * (j - half) + 1


def rope_adjacent(x, pos):       # llama2.c run.c / kvgate KVG_ROPE_ADJACENT
    hd, y = len(x), list(x)
    for i in range(hd // 2):
        a = pos * THETA ** (-2.0 * i / hd)
        c, s = math.cos(a), math.sin(a)
        y[2 * i] = x[2 * i] * c - x[2 * i + 1] * s
        y[2 * i + 1] = x[2 * i] * s + x[2 * i + 1] * c
    return y


def rope_hf(x, pos):             # transformers: x * cos + rotate_half(x) * sin, cos = cat(f, f)
    hd, half = len(x), len(x) // 2
    inv = [THETA ** (-2.0 * i / hd) for i in range(half)]
    cos = [math.cos(pos * f) for f in inv] * 2
    sin = [math.sin(pos * f) for f in inv] * 2
    rot = [-v for v in x[half:]] + list(x[:half])
    return [x[j] * cos[j] + rot[j] * sin[j] for j in range(hd)]


def check_permutation(hd, trials=4, seed=1):
    """The permutation is a bijection, and HF's RoPE on permuted q/k equals the permuted
    adjacent RoPE, and q.k after rotation is unchanged. Returns (ok, details)."""
    src = [hf_row_src(j, hd) for j in range(hd)]
    if sorted(src) != list(range(hd)):
        return False, {"bijection": False}
    rng = random.Random(seed)
    worst_vec = worst_dot = 0.0
    for t in range(trials):
        pos = rng.randrange(0, 4096) if t else 7
        q = [rng.uniform(-1, 1) for _ in range(hd)]
        k = [rng.uniform(-1, 1) for _ in range(hd)]
        pq, pk = [q[s] for s in src], [k[s] for s in src]
        rq_adj, rk_adj = rope_adjacent(q, pos), rope_adjacent(k, pos)
        rq_hf, rk_hf = rope_hf(pq, pos), rope_hf(pk, pos)
        want = [rq_adj[s] for s in src]
        worst_vec = max(worst_vec, max(abs(a - b) for a, b in zip(rq_hf, want)))
        d_adj = sum(a * b for a, b in zip(rq_adj, rk_adj))
        d_hf = sum(a * b for a, b in zip(rq_hf, rk_hf))
        worst_dot = max(worst_dot, abs(d_adj - d_hf))
    # the identity is no proof: the unpermuted vector under HF's pairing must differ
    q = [rng.uniform(-1, 1) for _ in range(hd)]
    unperm = max(abs(a - b) for a, b in zip(rope_hf(q, 5), rope_adjacent(q, 5))) if hd > 2 else 1.0
    ok = worst_vec < 1e-9 and worst_dot < 1e-9 and unperm > 1e-3
    return ok, {"bijection": True, "head_size": hd, "max_rotated_diff": worst_vec, "max_score_diff": worst_dot,
                "unpermuted_diff": unperm, "src_rows": src if hd <= 16 else src[:16] + ["..."]}


def check_export(path):
    res = {"file": path}
    h = read_header(path)
    res["header"] = h
    parts, want = layout(h)
    size = os.path.getsize(path)
    res["size"] = size
    res["expected_size"] = want
    ok = size == want
    if not ok:
        res["why"] = "the file has %d bytes, the header says %d" % (size, want)
    # norms read back finite, and a sample of each tensor's first row
    bad = []
    if ok:
        with open(path, "rb") as f:
            for p in parts:
                if p["name"] == "freq_cis":
                    continue
                n = min(p["cols"], 64)
                f.seek(p["offset"])
                vals = struct.unpack("<%df" % n, f.read(4 * n))
                if not all(math.isfinite(v) for v in vals) or (p["name"] != "rms_att" and not any(vals)):
                    bad.append("%s[%s]" % (p["name"], p["layer"]))
        if bad:
            ok = False
            res["why"] = "non-finite or all-zero values in " + ", ".join(bad[:8])
    pok, pres = check_permutation(h["head_size"])
    res["rope_permutation"] = pres
    if not pok:
        ok = False
        res.setdefault("why", "the q/k row permutation does not turn adjacent RoPE into rotate_half")
    res["ok"] = ok
    return res


def stdlib_forward(path, ids):
    """The last position's logits, computed in double precision with transformers' Llama
    conventions on the permuted weights (q/k rows through hf_row_src, rotate_half RoPE,
    repeat_kv's head grouping): the mapping build_model uses, checked here against kvgate
    without torch. Pure Python: tiny models only (stories260K: about a second)."""
    import array
    h = read_header(path)
    parts, _ = layout(h)
    data = array.array("f")
    with open(path, "rb") as f:
        f.seek(28)
        data.frombytes(f.read())
    if sys.byteorder != "little":
        data.byteswap()

    def mat(p, perm_heads=0):
        o, r, c = (p["offset"] - 28) // 4, p["rows"], p["cols"]
        rows = [data[o + i * c:o + (i + 1) * c].tolist() for i in range(r)]
        if perm_heads:
            hd = r // perm_heads
            rows = [rows[(i // hd) * hd + hf_row_src(i % hd, hd)] for i in range(r)]
        return rows

    by = {(p["name"], p["layer"]): p for p in parts}
    dim, hs, H, KV = h["dim"], h["head_size"], h["n_heads"], h["n_kv_heads"]
    emb = mat(by[("tok_embeddings", None)])
    cls = emb if h["shared_classifier"] else mat(by[("wcls", None)])
    layers = []
    for l in range(h["n_layers"]):
        layers.append({"att": mat(by[("rms_att", l)])[0], "ffn": mat(by[("rms_ffn", l)])[0],
                       "wq": mat(by[("wq", l)], H), "wk": mat(by[("wk", l)], KV), "wv": mat(by[("wv", l)]),
                       "wo": mat(by[("wo", l)]), "w1": mat(by[("w1", l)]), "w2": mat(by[("w2", l)]),
                       "w3": mat(by[("w3", l)]), "k": [], "v": []})
    final = mat(by[("rms_final", None)])[0]

    def mv(w, x):
        return [sum(a * b for a, b in zip(row, x)) for row in w]

    def rms(x, w):
        r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + EPS)
        return [v * r * g for v, g in zip(x, w)]

    x = None
    for pos, t in enumerate(ids):
        x = list(emb[t])
        for L in layers:
            xn = rms(x, L["att"])
            q, k, v = mv(L["wq"], xn), mv(L["wk"], xn), mv(L["wv"], xn)
            q = sum((rope_hf(q[i * hs:(i + 1) * hs], pos) for i in range(H)), [])
            k = sum((rope_hf(k[i * hs:(i + 1) * hs], pos) for i in range(KV)), [])
            L["k"].append(k)
            L["v"].append(v)
            out = []
            for hh in range(H):
                g = hh // (H // KV)                       # repeat_kv
                qh = q[hh * hs:(hh + 1) * hs]
                sc = [sum(a * b for a, b in zip(qh, kk[g * hs:(g + 1) * hs])) / math.sqrt(hs) for kk in L["k"]]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                z = sum(e)
                out += [sum(e[j] / z * L["v"][j][g * hs + d] for j in range(len(e))) for d in range(hs)]
            x = [a + b for a, b in zip(x, mv(L["wo"], out))]
            xn = rms(x, L["ffn"])
            a1, a3 = mv(L["w1"], xn), mv(L["w3"], xn)
            x = [a + b for a, b in zip(x, mv(L["w2"], [u / (1.0 + math.exp(-u)) * w for u, w in zip(a1, a3)]))]
    return mv(cls, rms(x, final))


# ---- logits (stdlib) ----

def read_logits(path):
    with open(path) as f:
        return [float(x) for x in f.read().split()]


def compare(got, ref, tol):
    """kvgate-gpu-check's rule: max|got - ref| <= tol * max(1, max|ref|), and the argmaxes
    agree or ref's margin between the two is within tol * scale (a near tie)."""
    if len(got) != len(ref):
        return {"ok": False, "why": "%d logits vs %d" % (len(got), len(ref))}
    if not got or not all(math.isfinite(v) for v in got) or not all(math.isfinite(v) for v in ref):
        return {"ok": False, "why": "empty or non-finite logits"}
    scale = max(1.0, max(abs(v) for v in ref))
    d = max(abs(a - b) for a, b in zip(got, ref))
    ag = max(range(len(got)), key=got.__getitem__)
    ar = max(range(len(ref)), key=ref.__getitem__)
    margin = ref[ar] - ref[ag]
    arg_ok = ag == ar or margin <= tol * scale
    ok = d <= tol * scale and arg_ok
    r = {"ok": ok, "max_abs_diff": d, "scale": scale, "rel": d / scale, "tol": tol,
         "argmax": ag, "argmax_ref": ar, "argmax_equal": ag == ar, "n": len(got)}
    if not ok:
        r["why"] = ("max|diff| %.4g > tol %.3g * scale %.4g" % (d, tol, scale)) if d > tol * scale else \
            "argmax %d vs %d, the reference's margin %.4g" % (ag, ar, margin)
    return r


def write_json(path, obj):
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(path + ".tmp", path)


# ---- torch ----

def probe(device):
    """(modules, None) or (None, reason)."""
    try:
        import torch
    except Exception as e:              # noqa: BLE001 - any import failure is a reason
        return None, "python3 has no torch (%s: %s)" % (type(e).__name__, e)
    try:
        import transformers
    except Exception as e:              # noqa: BLE001
        return None, "python3 has torch %s but no transformers (%s: %s)" % (torch.__version__, type(e).__name__, e)
    if device.startswith("cuda") and not torch.cuda.is_available():
        return None, "torch %s sees no CUDA device (built for CUDA %s)" % (torch.__version__, torch.version.cuda)
    return (torch, transformers), None


def build_model(torch, transformers, path, h, device):
    import mmap
    import warnings
    from transformers import LlamaConfig, LlamaForCausalLM

    hs = h["head_size"]
    kw = dict(vocab_size=h["vocab_size"], hidden_size=h["dim"], intermediate_size=h["hidden_dim"],
              num_hidden_layers=h["n_layers"], num_attention_heads=h["n_heads"],
              num_key_value_heads=h["n_kv_heads"], head_dim=hs, max_position_embeddings=h["seq_len"],
              rms_norm_eps=EPS, rope_theta=THETA, hidden_act="silu", attention_bias=False, mlp_bias=False,
              tie_word_embeddings=h["shared_classifier"], bos_token_id=1, eos_token_id=2)
    try:
        cfg = LlamaConfig(attn_implementation="sdpa", **kw)
    except TypeError:
        cfg = LlamaConfig(**kw)
    if isinstance(getattr(cfg, "rope_parameters", None), dict):     # transformers 5
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": THETA}
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        try:
            cfg._attn_implementation = "sdpa"
        except AttributeError:
            pass
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    parts, _ = layout(h)
    f = open(path, "rb")
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def load(p, perm_heads=0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # a read-only buffer: we only read it
            t = torch.frombuffer(mm, dtype=torch.float32, count=p["rows"] * p["cols"], offset=p["offset"])
        t = t.view(p["rows"], p["cols"]).to(device)
        if perm_heads:
            # HF row j of each head is llama2.c row hf_row_src(j): the mapping that
            # --check-export and --stdlib-forward check without torch
            idx = [(i // hs) * hs + hf_row_src(i % hs, hs) for i in range(p["rows"])]
            t = t.index_select(0, torch.tensor(idx, device=t.device))
        return t.to(torch.bfloat16)

    by = {}
    for p in parts:
        by[(p["name"], p["layer"])] = p
    m = model.model
    with torch.no_grad():
        m.embed_tokens.weight.copy_(load(by[("tok_embeddings", None)]))
        for l, layer in enumerate(m.layers):
            layer.input_layernorm.weight.copy_(load(by[("rms_att", l)]).view(-1))
            layer.self_attn.q_proj.weight.copy_(load(by[("wq", l)], h["n_heads"]))
            layer.self_attn.k_proj.weight.copy_(load(by[("wk", l)], h["n_kv_heads"]))
            layer.self_attn.v_proj.weight.copy_(load(by[("wv", l)]))
            layer.self_attn.o_proj.weight.copy_(load(by[("wo", l)]))
            layer.post_attention_layernorm.weight.copy_(load(by[("rms_ffn", l)]).view(-1))
            layer.mlp.gate_proj.weight.copy_(load(by[("w1", l)]))
            layer.mlp.down_proj.weight.copy_(load(by[("w2", l)]))
            layer.mlp.up_proj.weight.copy_(load(by[("w3", l)]))
        m.norm.weight.copy_(load(by[("rms_final", None)]).view(-1))
        if h["shared_classifier"]:
            model.lm_head.weight = m.embed_tokens.weight
        else:
            model.lm_head.weight.copy_(load(by[("wcls", None)]))
    try:
        mm.close()
    except BufferError:         # a tensor still views it: the process ends soon anyway
        pass
    f.close()
    # What transformers will really use: the rotary frequencies and the norms' epsilon.
    inv = getattr(getattr(m, "rotary_emb", None), "inv_freq", None)
    want = 1.0 / (THETA ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    facts = {"attn_implementation": getattr(model.config, "_attn_implementation", None),
             "rms_norm_eps": float(m.norm.variance_epsilon) if hasattr(m.norm, "variance_epsilon") else None}
    if inv is not None:
        facts["inv_freq_max_rel_err"] = float(((inv.double().cpu() - want) / want).abs().max())
    facts["attention_scaling"] = float(getattr(getattr(m, "rotary_emb", None), "attention_scaling", 1.0))
    return model, facts


def bench(torch, model, h, device, n_prefill, n_decode, batches, ctx):
    from transformers import DynamicCache
    out = {}
    gen = torch.Generator(device="cpu").manual_seed(1)
    V = h["vocab_size"]
    n_params = sum(p.numel() for p in model.parameters())
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def new_cache():
        try:
            return DynamicCache()
        except TypeError:           # a version that wants arguments: the model makes its own
            return None

    def prefill(ids, cache):
        o = model.model(input_ids=ids, past_key_values=cache, use_cache=True)
        return model.lm_head(o.last_hidden_state[:, -1:, :]), o.past_key_values

    def step(nxt, cache):
        o = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        return o.logits[:, -1, :].argmax(-1, keepdim=True), o.past_key_values

    with torch.inference_mode():
        if n_prefill > 0:
            ids = torch.randint(3, min(V, 32000), (1, n_prefill), generator=gen).to(device)
            prefill(ids[:, :64], new_cache())            # warm-up (kernels, cuBLAS handles)
            times = []
            for _ in range(2):
                sync()
                t0 = time.perf_counter()
                prefill(ids, new_cache())
                sync()
                times.append(time.perf_counter() - t0)
            t = min(times)
            # matmul FLOPs: 2 * params per token, less the embedding and the classifier (one
            # position only); causal attention: QK^T and PV over half the square
            n_matmul = n_params - V * h["dim"] * (1 if h["shared_classifier"] else 2)
            flops = 2.0 * n_matmul * n_prefill \
                + 2.0 * h["n_layers"] * h["n_heads"] * h["head_size"] * n_prefill * n_prefill
            out["prefill"] = {"tokens": n_prefill, "seconds": t, "tok_per_s": n_prefill / t,
                              "tflops": flops / t / 1e12}
        if n_decode > 0:
            out["decode"] = []
            for b in batches:
                ids = torch.randint(3, min(V, 32000), (b, ctx), generator=gen).to(device)
                logits, cache = prefill(ids, new_cache())
                nxt = logits[:, -1, :].argmax(-1, keepdim=True)
                for _ in range(2):                        # warm-up steps
                    nxt, cache = step(nxt, cache)
                sync()
                t0 = time.perf_counter()
                for _ in range(n_decode):
                    nxt, cache = step(nxt, cache)
                sync()
                t = time.perf_counter() - t0
                out["decode"].append({"batch": b, "context": ctx, "steps": n_decode, "ms_per_step": 1e3 * t / n_decode,
                                      "tok_per_s": b * n_decode / t})
                del cache
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
    out["params"] = n_params
    return out


def run_model(a):
    res = {"available": False, "file": a.model}
    mods, why = probe(a.device)
    if not mods:
        res["reason"] = why
        write_json(a.json, res)
        print("torch reference: not available: " + why, file=sys.stderr)
        return 3
    torch, transformers = mods
    res.update(available=True, torch=torch.__version__, transformers=transformers.__version__,
               torch_cuda=torch.version.cuda, dtype="bfloat16", attn="sdpa")
    if a.device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name(torch.device(a.device))
    h = read_header(a.model)
    res["header"] = h
    ids = [int(x) for x in a.ids.replace(",", " ").split()]
    if not ids or min(ids) < 0 or max(ids) >= h["vocab_size"]:
        print("--ids: empty or out of the vocabulary (%d)" % h["vocab_size"], file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    model, facts = build_model(torch, transformers, a.model, h, a.device)
    res["load_seconds"] = time.perf_counter() - t0
    res["model_facts"] = facts
    print("torch %s, transformers %s, %s: %s, %d layers, attention %s, loaded in %.1f s" % (
        torch.__version__, transformers.__version__, a.device, res.get("gpu", "cpu"), h["n_layers"],
        facts.get("attn_implementation"), res["load_seconds"]))
    ok = True
    if facts.get("inv_freq_max_rel_err", 0.0) > 1e-5 or facts.get("attention_scaling", 1.0) != 1.0:
        ok = False
        res["why"] = "transformers' rotary frequencies are not theta 10000's: %s" % facts
    if facts.get("rms_norm_eps") is not None and abs(facts["rms_norm_eps"] - EPS) > 1e-12:
        ok = False
        res["why"] = "transformers' RMSNorm epsilon is %s, not %s" % (facts["rms_norm_eps"], EPS)
    with torch.inference_mode():
        t0 = time.perf_counter()
        logits = model(input_ids=torch.tensor([ids], device=a.device)).logits[0, -1].float().cpu().tolist()
        res["forward_seconds"] = time.perf_counter() - t0
    if a.logits_out:
        with open(a.logits_out, "w") as f:
            f.write("".join("%.9g\n" % v for v in logits))
    res["n_ids"] = len(ids)
    res["argmax"] = max(range(len(logits)), key=logits.__getitem__)
    res["compare"] = {}
    for spec in a.compare or []:
        name, _, path = spec.partition("=")
        c = compare(logits, read_logits(path), a.tol)
        res["compare"][name] = c
        # the first named comparison decides (kvgate's CUDA logits); the others are figures
        if spec == a.compare[0] and not c["ok"]:
            ok = False
            res.setdefault("why", "%s: %s" % (name, c.get("why")))
        print("torch vs %s: max|diff| %.4g, rel %.4g (tol %.3g), argmax %d vs %d: %s"
              % (name, c.get("max_abs_diff", float("nan")), c.get("rel", float("nan")), a.tol,
                 c.get("argmax", -1), c.get("argmax_ref", -1), "pass" if c["ok"] else "FAIL"))
    write_json(a.json, dict(res, ok=ok))
    if a.bench_prefill or a.bench_decode:
        batches = [int(x) for x in a.bench_batches.split(",") if x]
        try:
            res["bench"] = bench(torch, model, h, a.device, a.bench_prefill, a.bench_decode, batches, a.bench_ctx)
        except Exception as e:      # noqa: BLE001 - the logits verdict stands; the step fails
            res["bench"] = {"error": "%s: %s" % (type(e).__name__, e)}
            res["ok"] = ok
            res["bench_failed"] = True
            write_json(a.json, res)
            print("torch bench: error: %s" % res["bench"]["error"])
            return 1
        b = res["bench"]
        if "prefill" in b:
            print("torch prefill %d: %.1f ms, %.0f tok/s, %.1f TFLOP/s" % (
                b["prefill"]["tokens"], 1e3 * b["prefill"]["seconds"], b["prefill"]["tok_per_s"], b["prefill"]["tflops"]))
        for d in b.get("decode", []):
            print("torch decode batch %d at %d: %.2f ms/step, %.0f tok/s" % (
                d["batch"], d["context"], d["ms_per_step"], d["tok_per_s"]))
    res["ok"] = ok
    write_json(a.json, res)
    print("torch reference: %s" % ("pass" if ok else "FAIL: " + res.get("why", "")))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-export", metavar="FILE")
    ap.add_argument("--compare-files", nargs=2, metavar=("GOT", "REF"))
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--stdlib-forward", metavar="FILE")
    ap.add_argument("--model", metavar="FILE")
    ap.add_argument("--ids", default="")
    ap.add_argument("--logits-out")
    ap.add_argument("--compare", action="append", metavar="NAME=FILE")
    ap.add_argument("--tol", type=float, default=0.03)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--bench-prefill", type=int, default=0)
    ap.add_argument("--bench-decode", type=int, default=0)
    ap.add_argument("--bench-batches", default="1")
    ap.add_argument("--bench-ctx", type=int, default=512)
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        if a.check_export:
            r = check_export(a.check_export)
            write_json(a.json, r)
            h, p = r["header"], r["rope_permutation"]
            print("%s: dim %d, hidden %d, %d layers, %d/%d heads of %d, vocab %d (%s classifier), seq %d, %d bytes: %s"
                  % (a.check_export, h["dim"], h["hidden_dim"], h["n_layers"], h["n_heads"], h["n_kv_heads"],
                     h["head_size"], h["vocab_size"], "shared" if h["shared_classifier"] else "own", h["seq_len"],
                     r["size"], "size ok" if r["size"] == r["expected_size"] else "size WRONG"))
            print("rope permutation (head %d): rotated max diff %.3g, score max diff %.3g, unpermuted %.3g: %s"
                  % (p["head_size"], p.get("max_rotated_diff", -1), p.get("max_score_diff", -1),
                     p.get("unpermuted_diff", -1), "ok" if r["ok"] else "FAIL"))
            if not r["ok"]:
                print("check-export: FAIL: " + r.get("why", ""))
            return 0 if r["ok"] else 1
        if a.compare_files:
            c = compare(read_logits(a.compare_files[0]), read_logits(a.compare_files[1]), a.tol)
            write_json(a.json, c)
            print(json.dumps(c))
            return 0 if c["ok"] else 1
        if a.stdlib_forward:
            ids = [int(x) for x in a.ids.replace(",", " ").split()]
            logits = stdlib_forward(a.stdlib_forward, ids)
            if a.logits_out:
                with open(a.logits_out, "w") as f:
                    f.write("".join("%.9g\n" % v for v in logits))
            res = {"n_ids": len(ids), "argmax": max(range(len(logits)), key=logits.__getitem__), "compare": {}}
            ok = True
            for spec in a.compare or []:
                name, _, path = spec.partition("=")
                c = res["compare"][name] = compare(logits, read_logits(path), a.tol)
                ok = ok and c["ok"]
                print("stdlib (transformers' conventions) vs %s: max|diff| %.4g, rel %.4g, argmax %d vs %d: %s"
                      % (name, c.get("max_abs_diff", -1), c.get("rel", -1), c.get("argmax", -1), c.get("argmax_ref", -1),
                         "pass" if c["ok"] else "FAIL"))
            res["ok"] = ok
            write_json(a.json, res)
            return 0 if ok else 1
        if a.probe:
            mods, why = probe(a.device)
            if not mods:
                write_json(a.json, {"available": False, "reason": why})
                print(why)
                return 3
            write_json(a.json, {"available": True, "torch": mods[0].__version__, "transformers": mods[1].__version__})
            print("torch %s, transformers %s" % (mods[0].__version__, mods[1].__version__))
            return 0
        if a.model:
            return run_model(a)
    except (OSError, ValueError) as e:
        print("torch_ref: %s" % e, file=sys.stderr)
        return 2
    ap.print_usage(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
