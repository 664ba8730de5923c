#!/usr/bin/env python3
"""PyTorch reference for actorgraph-generate-bench (scripts/gen-bench.sh).

A LLaMA-shaped decoder written directly in PyTorch (default: the LLaMA 1B
shape of issue 12: 16 layers, d 2048, ff 8192, 32 heads, 8 kv heads, vocab
32000, bf16, random weights; --qkv-bias for Qwen2's q/k/v biases, --qk-norm
for Qwen3's q/k norms, --head-dim for heads of another width than d / heads), batch 1,
run the fastest way we know:

- decode: a static KV cache [layers, 2, 1, kv_heads, max_len, head_dim], one
  decode step (embedding, RMSNorm, q/k/v, RoPE, cache write with index_copy_,
  SDPA with GQA over the cache masked by position, o_proj, SwiGLU MLP, head)
  captured once as a CUDA graph and replayed per token; the context is
  --context tokens; the figure is the median replay time per token.
- prefill: one forward pass of --prefill tokens (causal SDPA), best of 5.
- bandwidth: a device-to-device copy of 1 GiB (read + write bytes / time),
  best of 10: the "measured bandwidth" of decode_vs_bandwidth_floor.

Prints `name: value` lines:
  measured_bandwidth_gbs, torch_decode_ms_per_token, torch_prefill_tokens_per_s
or `torch_decode_bench: skipped: <reason>` (exit 0) without torch or a GPU.
"""
import argparse
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--qkv-bias", action="store_true", help="biases on q, k and v (Qwen2's attention)")
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--qk-norm", action="store_true", help="RMSNorm over each head's q and k before RoPE (Qwen3's)")
    ap.add_argument("--head-dim", type=int, default=0, help="head width (0: d / heads)")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        print(f"torch_decode_bench: skipped: no torch ({e})")
        return 0
    if not torch.cuda.is_available():
        print("torch_decode_bench: skipped: torch sees no CUDA device")
        return 0

    dev = torch.device("cuda")
    dt = torch.bfloat16
    torch.manual_seed(0)
    L, d, ff, H, Hkv, V = a.layers, a.d, a.ff, a.heads, a.kv_heads, a.vocab
    dh = a.head_dim or d // H
    max_len = a.context + a.new_tokens

    def w(*shape):
        return (torch.randn(*shape, device=dev, dtype=torch.float32) * 0.02).to(dt)

    embed = w(V, d)
    head = w(V, d)
    norm_w = torch.ones(d, device=dev, dtype=dt)
    layers = []
    for _ in range(L):
        layers.append(dict(
            an=torch.ones(d, device=dev, dtype=dt), mn=torch.ones(d, device=dev, dtype=dt),
            wqkv=w((H + 2 * Hkv) * dh, d), wo=w(d, H * dh), wgu=w(2 * ff, d), wd=w(d, ff),
            bqkv=w((H + 2 * Hkv) * dh) if a.qkv_bias else None,
            qn=torch.ones(dh, device=dev, dtype=dt) if a.qk_norm else None,
            kn=torch.ones(dh, device=dev, dtype=dt) if a.qk_norm else None))
    inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, dh, 2, device=dev, dtype=torch.float32) / dh))

    def rms(x, g):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt) * g

    def rope(x, pos):  # x [B, heads, S, dh], pos [S]
        f = pos.float()[:, None] * inv_freq[None, :]
        emb = torch.cat([f, f], dim=-1)
        cos, sin = emb.cos().to(dt), emb.sin().to(dt)
        x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def block(x, lw, pos, cache=None, mask=None):
        B, S, _ = x.shape
        h = rms(x, lw["an"])
        qkv = h @ lw["wqkv"].t() if lw["bqkv"] is None else torch.addmm(lw["bqkv"], h.view(B * S, -1), lw["wqkv"].t()).view(B, S, -1)
        q, k, v = qkv.split([H * dh, Hkv * dh, Hkv * dh], dim=-1)
        q = q.view(B, S, H, dh).transpose(1, 2)
        k = k.view(B, S, Hkv, dh).transpose(1, 2)
        v = v.view(B, S, Hkv, dh).transpose(1, 2)
        if lw["qn"] is not None:
            q, k = rms(q, lw["qn"]), rms(k, lw["kn"])
        q, k = rope(q, pos), rope(k, pos)
        if cache is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            kc, vc = cache
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
        x = x + o.transpose(1, 2).reshape(B, S, H * dh) @ lw["wo"].t()
        h = rms(x, lw["mn"])
        g, u = (h @ lw["wgu"].t()).split([ff, ff], dim=-1)
        return x + (F.silu(g) * u) @ lw["wd"].t()

    # ---- bandwidth --------------------------------------------------------------
    n = 1 << 29  # bf16 elements: 1 GiB
    src = torch.empty(n, device=dev, dtype=dt)
    dst = torch.empty_like(src)
    best = None
    for _ in range(12):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        t = s.elapsed_time(e) / 1e3
        best = t if best is None else min(best, t)
    bw = 2 * n * 2 / best
    del src, dst
    print(f"measured_bandwidth_gbs: {bw / 1e9:.1f}")

    with torch.inference_mode():
        # ---- prefill ------------------------------------------------------------
        ids = torch.randint(0, V, (1, a.prefill), device=dev)
        pos = torch.arange(a.prefill, device=dev)

        def forward(ids, pos):
            x = embed[ids]
            for lw in layers:
                x = block(x, lw, pos)
            return rms(x, norm_w) @ head.t()

        times = []
        for _ in range(6):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            forward(ids, pos)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        print(f"torch_prefill_tokens_per_s: {a.prefill / min(times[1:]):.1f}")

        # ---- decode: static cache, CUDA graph --------------------------------------
        kcache = [torch.zeros(1, Hkv, max_len, dh, device=dev, dtype=dt) for _ in range(L)]
        vcache = [torch.zeros(1, Hkv, max_len, dh, device=dev, dtype=dt) for _ in range(L)]
        tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
        p = torch.zeros(1, dtype=torch.long, device=dev)
        ar = torch.arange(max_len, device=dev)

        def step():
            mask = (ar <= p)[None, None, None, :]  # [1,1,1,max_len] bool: positions filled so far
            x = embed[tok]
            for lw, kc, vc in zip(layers, kcache, vcache):
                x = block(x, lw, p, (kc, vc), mask)
            logits = rms(x, norm_w) @ head.t()
            return logits.argmax(-1)

        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(st)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        times = []
        for i in range(a.new_tokens):
            p.fill_(a.context + i)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            graph.replay()
            e.record()
            e.synchronize()
            tok.copy_(out.view(1, 1))
            times.append(s.elapsed_time(e))
        print(f"torch_decode_ms_per_token: {statistics.median(times):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
