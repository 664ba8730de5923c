#!/usr/bin/env python3
"""Independent numpy check of ag::models::build_transformer.

Runs dump_transformer (C++: builds small GPT-2 / LLaMA / LLaMA-GQA models,
evaluates them with ag::evaluate_reference and writes weights, inputs and
logits), then recomputes the logits here following HF transformers'
modeling_gpt2.py (GPT2LMHeadModel) and modeling_llama.py (LlamaForCausalLM)
line by line, in float64, and fails if max |C++ - numpy| > 1e-4.

Nothing here is shared with the C++ code: not the graph, not the op
definitions. Only the weight names of the dump (mapped to HF's roles below).

usage: transformer_ref.py --dump-tool PATH --workdir DIR
   or: transformer_ref.py --dir DIR          (check an existing dump)
"""

import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

TOLERANCE = 1e-4


def load(case_dir):
    with open(os.path.join(case_dir, "index.json")) as f:
        index = json.load(f)
    tensors = {}
    for t in index["tensors"]:
        dt = np.int32 if t["dtype"] == "i32" else np.float32
        a = np.fromfile(os.path.join(case_dir, t["file"]), dtype=np.dtype(dt).newbyteorder("<"))
        shape = tuple(t["shape"])
        if a.size != int(np.prod(shape)):
            raise ValueError(f"{t['name']}: {a.size} elements on disk, shape {shape}")
        tensors[t["name"]] = a.reshape(shape).astype(np.float64 if dt == np.float32 else np.int64)
    return index, tensors


# ---------------------------------------------------------------- GPT-2
# modeling_gpt2.py: GPT2Model.forward, GPT2Block, GPT2Attention, GPT2MLP.

def gelu_new(x):
    # ACT2FN["gelu_new"] = NewGELUActivation
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * np.power(x, 3.0))))


def layer_norm(x, weight, bias, eps):
    # nn.LayerNorm: biased variance over the last dim
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def conv1d(x, weight, bias):
    # transformers.pytorch_utils.Conv1D: weight [nx, nf]; addmm(bias, x, weight)
    return x @ weight + bias


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def causal_mask(s):
    # bias = tril(ones(S, S)); keep j <= i
    return np.tril(np.ones((s, s), dtype=bool))


def gpt2_attention(cfg, w, p, hidden):
    b, s, d = hidden.shape
    heads = cfg["n_heads"]
    head_dim = d // heads
    qkv = conv1d(hidden, w[p + "attn.w_qkv"], w[p + "attn.b_qkv"])  # c_attn
    query, key, value = np.split(qkv, 3, axis=2)  # .split(self.split_size, dim=2)

    def split_heads(t):  # view(B, S, H, dh).transpose(1, 2)
        return t.reshape(b, s, heads, head_dim).transpose(0, 2, 1, 3)

    query, key, value = split_heads(query), split_heads(key), split_heads(value)
    attn_weights = query @ key.transpose(0, 1, 3, 2)
    attn_weights = attn_weights / math.sqrt(value.shape[-1])  # scale_attn_weights
    mask_value = np.finfo(np.float32).min
    attn_weights = np.where(causal_mask(s), attn_weights, mask_value)
    attn_weights = softmax(attn_weights)
    attn_output = attn_weights @ value
    attn_output = attn_output.transpose(0, 2, 1, 3).reshape(b, s, d)  # merge heads
    return conv1d(attn_output, w[p + "attn.w_proj"], w[p + "attn.b_proj"])  # c_proj


def gpt2_mlp(w, p, hidden):
    h = gelu_new(conv1d(hidden, w[p + "mlp.w_fc"], w[p + "mlp.b_fc"]))  # c_fc, act
    return conv1d(h, w[p + "mlp.w_proj"], w[p + "mlp.b_proj"])  # c_proj


def gpt2_forward(cfg, w, tokens, positions):
    eps = cfg["eps"]
    inputs_embeds = w["wte"][tokens]  # wte(input_ids)
    position_embeds = w["wpe"][positions]  # wpe(position_ids)
    hidden = inputs_embeds + position_embeds[None, :, :]
    for i in range(cfg["n_layers"]):
        p = f"l{i + 1}."  # HF block h.{i}
        residual = hidden
        hidden = layer_norm(hidden, w[p + "ln_1.w"], w[p + "ln_1.b"], eps)
        hidden = gpt2_attention(cfg, w, p, hidden) + residual
        residual = hidden
        hidden = layer_norm(hidden, w[p + "ln_2.w"], w[p + "ln_2.b"], eps)
        hidden = residual + gpt2_mlp(w, p, hidden)
    hidden = layer_norm(hidden, w["ln_f.w"], w["ln_f.b"], eps)
    return hidden @ w["wte"].T  # lm_head tied to wte: Linear(d, V), weight = wte


# ---------------------------------------------------------------- LLaMA
# modeling_llama.py: LlamaModel.forward, LlamaDecoderLayer, LlamaAttention,
# LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding (default rope type).

def linear(x, weight):
    # nn.Linear(bias=False): weight [out, in]
    return x @ weight.T


def rms_norm(x, weight, eps):
    variance = (x ** 2).mean(-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))  # x * rsqrt(var + eps)


def rotary_cos_sin(positions, dim, base):
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float64) / dim))
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]  # (inv_freq @ position_ids).T
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return np.concatenate([-x2, x1], axis=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos = cos[None, None, :, :]  # unsqueeze(unsqueeze_dim=1) -> [1, 1, S, dh]
    sin = sin[None, None, :, :]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(hidden, n_rep):
    b, kv_heads, s, head_dim = hidden.shape
    if n_rep == 1:
        return hidden
    hidden = np.broadcast_to(hidden[:, :, None, :, :], (b, kv_heads, n_rep, s, head_dim))
    return hidden.reshape(b, kv_heads * n_rep, s, head_dim)


def silu(x):
    return x / (1.0 + np.exp(-x))


def llama_attention(cfg, w, p, hidden, cos, sin):
    b, s, _ = hidden.shape
    heads, kv_heads = cfg["n_heads"], cfg["n_kv_heads"]
    head_dim = cfg["head_dim"]  # HF's head_dim: d_model // heads unless the config says otherwise
    # Biases where the model has them: Qwen2's q/k/v (nn.Linear(bias=True)), LlamaConfig's attention_bias (o's too).
    def proj(x, name):
        out = linear(x, w[p + "attn.w" + name])
        return out + w[p + "attn.b" + name] if p + "attn.b" + name in w else out
    query = proj(hidden, "q").reshape(b, s, heads, head_dim)
    key = proj(hidden, "k").reshape(b, s, kv_heads, head_dim)
    if p + "attn.q_norm.w" in w:  # Qwen3: q_norm / k_norm over each head's dims, before the transpose and RoPE
        query = rms_norm(query, w[p + "attn.q_norm.w"], cfg["eps"])
        key = rms_norm(key, w[p + "attn.k_norm.w"], cfg["eps"])
    query, key = query.transpose(0, 2, 1, 3), key.transpose(0, 2, 1, 3)
    value = proj(hidden, "v").reshape(b, s, kv_heads, head_dim).transpose(0, 2, 1, 3)
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    n_rep = heads // kv_heads
    key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    scaling = head_dim ** -0.5
    attn_weights = (query @ key.transpose(0, 1, 3, 2)) * scaling
    keep = causal_mask(s)
    if cfg.get("sliding_window", 0) > 0:  # masking_utils.sliding_window_overlay: kv_idx > q_idx - sliding_window
        q_idx, kv_idx = np.arange(s)[:, None], np.arange(s)[None, :]
        keep = keep & (kv_idx > q_idx - cfg["sliding_window"])
    attn_weights = attn_weights + np.where(keep, 0.0, -np.inf)  # causal (and sliding-window) mask
    attn_weights = softmax(attn_weights)
    attn_output = (attn_weights @ value).transpose(0, 2, 1, 3).reshape(b, s, heads * head_dim)
    return proj(attn_output, "o")  # o_proj


def llama_mlp(w, p, x):
    return linear(silu(linear(x, w[p + "mlp.w_gate"])) * linear(x, w[p + "mlp.w_up"]), w[p + "mlp.w_down"])


def llama_forward(cfg, w, tokens, positions):
    eps = cfg["eps"]
    hidden = w["embed_tokens"][tokens]  # embed_tokens
    cos, sin = rotary_cos_sin(positions, cfg["head_dim"], cfg["rope_theta"])
    for i in range(cfg["n_layers"]):
        p = f"l{i + 1}."  # HF layers.{i}
        residual = hidden
        hidden = rms_norm(hidden, w[p + "attn_norm.w"], eps)  # input_layernorm
        hidden = residual + llama_attention(cfg, w, p, hidden, cos, sin)
        residual = hidden
        hidden = rms_norm(hidden, w[p + "mlp_norm.w"], eps)  # post_attention_layernorm
        hidden = residual + llama_mlp(w, p, hidden)
    hidden = rms_norm(hidden, w["norm.w"], eps)
    return linear(hidden, w["lm_head"])


# ---------------------------------------------------------------- driver

def check_case(case_dir):
    cfg, t = load(case_dir)
    forward = {"gpt2": gpt2_forward, "llama": llama_forward}[cfg["variant"]]
    expected = forward(cfg, t, t["tokens"], t["positions"])
    actual = t["logits"]
    if expected.shape != actual.shape:
        print(f"{case_dir}: shape {actual.shape} (C++) vs {expected.shape} (numpy)")
        return False
    err = np.abs(expected - actual)
    worst = np.unravel_index(np.argmax(err), err.shape)
    scale = np.abs(expected).max()
    ok = err.max() <= TOLERANCE and np.isfinite(actual).all()
    print(f"{os.path.basename(case_dir)}: {cfg['variant']} L={cfg['n_layers']} d={cfg['d_model']} "
          f"H={cfg['n_heads']} Hkv={cfg['n_kv_heads']} dh={cfg['head_dim']}: max_abs_err {err.max():.3e} at {tuple(map(int, worst))} "
          f"(max |logit| {scale:.3f}) {'ok' if ok else 'FAIL (tolerance %g)' % TOLERANCE}")
    # A dump of all-zero or constant logits would pass trivially: refuse it.
    if actual.std() < 1e-3:
        print(f"{case_dir}: logits are nearly constant (std {actual.std():.2e}); the check would be vacuous")
        return False
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump-tool", help="path of the dump_transformer executable")
    ap.add_argument("--workdir", help="where dump_transformer writes (with --dump-tool)")
    ap.add_argument("--dir", help="check an existing dump instead")
    args = ap.parse_args()
    if args.dump_tool:
        if not args.workdir:
            ap.error("--dump-tool needs --workdir")
        root = args.workdir
        r = subprocess.run([args.dump_tool, root])
        if r.returncode != 0:
            print(f"dump_transformer failed with exit status {r.returncode}")
            return 1
    elif args.dir:
        root = args.dir
    else:
        ap.error("give --dump-tool and --workdir, or --dir")
    cases = sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "index.json")))
    if not cases:
        print(f"no dumps under {root}")
        return 1
    results = [check_case(os.path.join(root, c)) for c in cases]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
