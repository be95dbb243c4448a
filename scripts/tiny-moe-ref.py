#!/usr/bin/env python3
"""A plain numpy forward pass of the tiny MoE GGUF files (scripts/tiny-moe.py), written from
llama.cpp's graphs (src/models/qwen3moe.cpp, qwen2moe.cpp, llama.cpp and build_moe_ffn), as a
second, readable check that the fixtures mean what tests/fixtures/moe/README.md says: it reads
a GGUF (F32, Q8_0 or Q4_K_M, dequantized by the gguf package), and for each row of a fixture
file runs greedy decoding from its prompt_ids and compares with the row by the fixtures' rule.

    python3 scripts/tiny-moe-ref.py models/tiny-moe/qwen3moe-f32.gguf tests/fixtures/moe/qwen3moe-f32-greedy.jsonl
    python3 scripts/tiny-moe-ref.py --stats models/tiny-moe/qwen3moe-f32.gguf IDS...   # scale diagnostics

Not needed to make or use the fixtures (llama.cpp is the oracle); slow (float64, one full
forward per token).
"""
import argparse
import json
import sys

import numpy as np

import gguf


def load(path):
    r = gguf.GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.")}
    arch = f["general.architecture"]
    t = {}
    for ten in r.tensors:
        a = gguf.quants.dequantize(ten.data, ten.tensor_type)
        t[ten.name] = np.asarray(a, dtype=np.float64).reshape(tuple(reversed([int(x) for x in ten.shape])))
    return arch, f, t


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, base, neox):
    # x: (T, H, D). neox: pairs (i, i + D/2) (qwen); else adjacent pairs (2i, 2i+1) (llama).
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, None] * inv[None, :]  # (T, D/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


class Model:
    def __init__(self, path):
        self.arch, self.f, self.t = load(path)
        a = self.arch
        self.n_layer = self.f[f"{a}.block_count"]
        self.n_head = self.f[f"{a}.attention.head_count"]
        self.n_head_kv = self.f[f"{a}.attention.head_count_kv"]
        self.eps = self.f[f"{a}.attention.layer_norm_rms_epsilon"]
        self.base = self.f.get(f"{a}.rope.freq_base", 10000.0)
        self.n_used = self.f[f"{a}.expert_used_count"]
        self.neox = a != "llama"
        # llama.cpp: qwen3moe and llama (mixtral) renormalize the top-k weights, qwen2moe not.
        self.norm_w = a in ("qwen3moe", "llama")
        self.output = self.t.get("output.weight", self.t["token_embd.weight"])

    def forward(self, ids, stats=None):
        t = self.t
        x = t["token_embd.weight"][ids]
        T = len(ids)
        pos = np.arange(T, dtype=np.float64)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = rmsnorm(x, t[p + "attn_norm.weight"], self.eps)
            q = h @ t[p + "attn_q.weight"].T
            k = h @ t[p + "attn_k.weight"].T
            v = h @ t[p + "attn_v.weight"].T
            if p + "attn_q.bias" in t:
                q, k, v = q + t[p + "attn_q.bias"], k + t[p + "attn_k.bias"], v + t[p + "attn_v.bias"]
            hd = q.shape[1] // self.n_head
            q = q.reshape(T, self.n_head, hd)
            k = k.reshape(T, self.n_head_kv, hd)
            v = v.reshape(T, self.n_head_kv, hd)
            if p + "attn_q_norm.weight" in t:
                q = rmsnorm(q, t[p + "attn_q_norm.weight"], self.eps)
                k = rmsnorm(k, t[p + "attn_k_norm.weight"], self.eps)
            q, k = rope(q, pos, self.base, self.neox), rope(k, pos, self.base, self.neox)
            g = self.n_head // self.n_head_kv
            k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
            s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(T, -1) @ t[p + "attn_output.weight"].T
            if stats is not None:
                stats.setdefault(f"L{il} |x| in", []).append(np.sqrt((x * x).mean()))
                stats.setdefault(f"L{il} |q|", []).append(np.sqrt((q * q).mean()))
                stats.setdefault(f"L{il} attn max weight", []).append(s.max(-1).mean())
                stats.setdefault(f"L{il} |attn out|", []).append(np.sqrt((o * o).mean()))
            x = x + o
            h = rmsnorm(x, t[p + "ffn_norm.weight"], self.eps)
            logits = h @ t[p + "ffn_gate_inp.weight"].T  # (T, E)
            pr = np.exp(logits - logits.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            sel = np.argsort(-pr, axis=-1, kind="stable")[:, : self.n_used]
            w = np.take_along_axis(pr, sel, -1)
            if self.norm_w:
                w = w / w.sum(-1, keepdims=True)
            moe = np.zeros_like(x)
            for e in range(logits.shape[1]):
                rows, slot = np.nonzero(sel == e)
                if len(rows) == 0:
                    continue
                he = h[rows]
                a = silu(he @ t[p + "ffn_gate_exps.weight"][e].T) * (he @ t[p + "ffn_up_exps.weight"][e].T)
                moe[rows] += w[rows, slot][:, None] * (a @ t[p + "ffn_down_exps.weight"][e].T)
            if p + "ffn_gate_inp_shexp.weight" in t:
                gate = 1.0 / (1.0 + np.exp(-(h @ t[p + "ffn_gate_inp_shexp.weight"])))
                a = silu(h @ t[p + "ffn_gate_shexp.weight"].T) * (h @ t[p + "ffn_up_shexp.weight"].T)
                moe = moe + gate[:, None] * (a @ t[p + "ffn_down_shexp.weight"].T)
            if stats is not None:
                srt = np.sort(logits, -1)[:, ::-1]
                stats.setdefault(f"L{il} router logit std", []).append(logits.std())
                stats.setdefault(f"L{il} router k-th minus (k+1)-th", []).append(
                    np.median(srt[:, self.n_used - 1] - srt[:, self.n_used]))
                stats.setdefault(f"L{il} |moe out|", []).append(np.sqrt((moe * moe).mean()))
            x = x + moe
        h = rmsnorm(x[-1:], t["output_norm.weight"], self.eps)
        out = (h @ self.output.T)[0]
        if stats is not None:
            srt = np.sort(out)[::-1]
            stats.setdefault("|x| final", []).append(np.sqrt((x * x).mean()))
            stats.setdefault("logit std", []).append(out.std())
            stats.setdefault("top1-top2", []).append(srt[0] - srt[1])
        return out - (out.max() + np.log(np.exp(out - out.max()).sum()))


def greedy(m, prompt, n, stats=None, forced=None):
    ids = list(prompt)
    steps = []
    for i in range(n):
        lp = m.forward(np.array(ids), stats)
        top = np.argsort(-lp, kind="stable")[:5]
        tok = int(top[0]) if forced is None else forced[i]
        steps.append((int(top[0]), lp, [int(x) for x in top]))
        ids.append(tok)
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stats", action="store_true")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("model")
    ap.add_argument("rest", nargs="+")
    args = ap.parse_args()
    m = Model(args.model)
    if args.stats:
        stats = {}
        steps = greedy(m, [int(x) for x in args.rest], args.n, stats)
        for k, v in stats.items():
            print(f"{k:32s} {np.mean(v):8.3f}")
        print("greedy:", [s[0] for s in steps])
        print("top1 logprobs:", [round(float(s[1][s[0]]), 3) for s in steps])
        return
    worst = 0
    for line in open(args.rest[0]):
        row = json.loads(line)
        ids = row["ids"]
        steps = greedy(m, row["prompt_ids"], len(ids), forced=ids)
        agreed = len(ids)
        diff = 0.0
        for i, ((ours, lp, top5), want) in enumerate(zip(steps, row["steps"])):
            if ours != ids[i]:
                theirs = [p[0] for p in want["top"]]
                ok = ours in theirs and ids[i] in top5
                agreed = i
                print(f"  diverged at {i}: ours {ours} llama.cpp {ids[i]} ({'allowed' if ok else 'NOT in top-5'})")
                if not ok:
                    worst = 1
                break
            diff = max(diff, abs(lp[ours] - want["logprob"]))
        print(f"{row['prompt'][:40]!r:44s} agreed {agreed}/{len(ids)}, max logprob diff {diff:.2e}")
    sys.exit(worst)


if __name__ == "__main__":
    main()
