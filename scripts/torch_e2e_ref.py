#!/usr/bin/env python3
"""PyTorch eager reference for actorgraph-e2e-bench figure 1 (transformer
forward on one GPU). Same shapes and math as ag::models::build_transformer
(variant llama): embedding gather, per layer RMSNorm -> q/k/v projections
(nn.Linear without bias) -> RoPE (rotate_half pairing, theta 10000) -> causal
attention written out (q k^T * 1/sqrt(dh), causal mask, softmax in f32, @ v)
-> o projection + residual, RMSNorm -> SwiGLU MLP (down(silu(gate(x)) * up(x)))
+ residual; final RMSNorm, lm_head, logits cast to f32. Storage dtype bf16 by
default; no torch.compile, no SDPA (unless --sdpa, reported separately).

On the GPU machine:
    python3 scripts/torch_e2e_ref.py --layers 12 --d-model 2048 --heads 16 \
        --ff 5632 --vocab 4096 --seq 512 --batch 8 --runs 20 --warmup 3

Prints `name: value` lines:
  torch_forward_ms         what one actorgraph job does: tokens and positions
                           uploaded from the host, forward, f32 logits copied
                           to a new host tensor (median over --runs, CUDA events)
  torch_forward_pinned_ms  as torch_forward_ms, but the logits land in a pinned
                           host tensor (pin_memory=True, from PyTorch's caching
                           host allocator; non_blocking copy): what an
                           actorgraph job on CUDA does by default
  torch_forward_device_ms  the forward alone, inputs already on the GPU,
                           logits left there (compare: e2e_forward_device_ms)
  torch_tokens_per_s       batch * seq / torch_forward_ms
  torch_forward_sdpa_device_ms   (--sdpa) as device_ms with
                           F.scaled_dot_product_attention(is_causal=True)
  torch_graph_device_ms    (--cuda-graph) the forward captured once as a CUDA
                           graph (torch.cuda.graph) and replayed: GPU time of
                           one replay (CUDA events)
  torch_graph_wall_ms      (--cuda-graph) host wall time of one job done the
                           fastest way with that graph: inputs copied from
                           pinned host memory into the graph's static inputs,
                           replay, f32 logits into a pinned host tensor, then
                           a synchronize (median, perf_counter)
"""
import argparse
import math
import statistics
import sys


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=0, help="0: = heads")
    p.add_argument("--ff", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--sdpa", action="store_true", help="also time SDPA attention (separate line)")
    p.add_argument("--cuda-graph", action="store_true", help="also time the forward replayed as a CUDA graph")
    return p.parse_args()


torch = F = None  # imported in main(), after the flags, so that --help works without PyTorch


def load_torch():
    global torch, F
    try:
        import torch as _torch
        import torch.nn.functional as _F
    except ImportError as e:  # the dev machine has no PyTorch: only the GPU machine runs this
        print(f"torch_e2e_ref.py: PyTorch is not installed here ({e}); run it on the GPU machine", file=sys.stderr)
        sys.exit(2)
    torch, F = _torch, _F


def rms_norm(x, w, eps):
    # HF LlamaRMSNorm: statistics in f32, result rounded to the storage type.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Model:
    def __init__(self, a, dev, dt):
        self.a = a
        self.H = a.heads
        self.Hkv = a.kv_heads or a.heads
        self.dh = a.d_model // a.heads
        d, ff, r = a.d_model, a.ff, 0.02
        g = torch.Generator(device=dev).manual_seed(1)

        def normal(*shape, mean=0.0, std=r):
            return (torch.randn(*shape, device=dev, generator=g, dtype=torch.float32) * std + mean).to(dt)

        self.embed = normal(a.vocab, d)
        self.layers = []
        for _ in range(a.layers):
            self.layers.append(dict(
                attn_norm=normal(d, mean=1.0, std=0.1),
                wq=normal(self.H * self.dh, d), wk=normal(self.Hkv * self.dh, d),
                wv=normal(self.Hkv * self.dh, d), wo=normal(d, self.H * self.dh),
                mlp_norm=normal(d, mean=1.0, std=0.1),
                w_gate=normal(ff, d), w_up=normal(ff, d), w_down=normal(d, ff)))
        self.norm = normal(d, mean=1.0, std=0.1)
        self.lm_head = normal(a.vocab, d)
        S = a.seq
        self.mask = torch.ones(S, S, device=dev, dtype=torch.bool).triu(1)  # True above the diagonal
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, self.dh, 2, device=dev, dtype=torch.float32) / self.dh))
        self.inv_freq = inv

    def attention(self, q, k, v, sdpa):
        # q [B,H,S,dh], k/v [B,Hkv,S,dh]
        rep = self.H // self.Hkv
        if rep > 1:  # HF repeat_kv: query head h reads kv head h // rep
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if sdpa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.dh))
        scores = scores.masked_fill(self.mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)

    def forward(self, tokens, positions, sdpa=False):
        a = self.a
        B, S, H, Hkv, dh = tokens.shape[0], tokens.shape[1], self.H, self.Hkv, self.dh
        x = self.embed[tokens]  # [B,S,d]
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [S, dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)  # [S, dh], broadcast over B and heads
        cos, sin = cos[None, None], sin[None, None]
        for L in self.layers:
            h = rms_norm(x, L["attn_norm"], a.eps)
            q = F.linear(h, L["wq"]).view(B, S, H, dh).transpose(1, 2)
            k = F.linear(h, L["wk"]).view(B, S, Hkv, dh).transpose(1, 2)
            v = F.linear(h, L["wv"]).view(B, S, Hkv, dh).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            o = self.attention(q, k, v, sdpa).transpose(1, 2).reshape(B, S, H * dh)
            x = x + F.linear(o, L["wo"])
            m = rms_norm(x, L["mlp_norm"], a.eps)
            x = x + F.linear(F.silu(F.linear(m, L["w_gate"])) * F.linear(m, L["w_up"]), L["w_down"])
        x = rms_norm(x, self.norm, a.eps)
        return F.linear(x, self.lm_head).float()  # logits [B,S,vocab] f32


def timed_ms(fn, runs, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        ms.append(start.elapsed_time(end))
    return statistics.median(ms)


def main():
    a = parse()
    load_torch()
    torch.set_grad_enabled(False)
    if not torch.cuda.is_available():
        print("torch_e2e_ref.py: torch.cuda.is_available() is False: no GPU", file=sys.stderr)
        sys.exit(2)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    model = Model(a, dev, dt)
    g = torch.Generator().manual_seed(7)
    tokens_host = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g, dtype=torch.int32)
    positions_host = torch.arange(a.seq, dtype=torch.int32)
    tokens_dev, positions_dev = tokens_host.to(dev), positions_host.to(dev)

    def job():  # what an actorgraph job does: inputs up, forward, f32 logits down into a new host tensor
        t, p = tokens_host.to(dev), positions_host.to(dev)
        return model.forward(t.long(), p).cpu()

    def job_pinned():  # the same, logits into pinned memory (actorgraph's default on CUDA)
        t, p = tokens_host.to(dev, non_blocking=True), positions_host.to(dev, non_blocking=True)
        logits = model.forward(t.long(), p)
        out = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=True)
        out.copy_(logits, non_blocking=True)
        return out

    def device_only():
        return model.forward(tokens_dev.long(), positions_dev)

    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {a.dtype}, "
          f"llama {a.layers} layers, d {a.d_model}, heads {a.heads}/{a.kv_heads or a.heads}, ff {a.ff}, "
          f"vocab {a.vocab}, seq {a.seq}, batch {a.batch}, runs {a.runs} after {a.warmup}", flush=True)
    fwd = timed_ms(job, a.runs, a.warmup)
    fwd_pinned = timed_ms(job_pinned, a.runs, a.warmup)
    dev_ms = timed_ms(device_only, a.runs, a.warmup)
    print(f"torch_forward_ms: {fwd:.4f}")
    print(f"torch_forward_pinned_ms: {fwd_pinned:.4f}")
    print(f"torch_forward_device_ms: {dev_ms:.4f}")
    print(f"torch_tokens_per_s: {a.batch * a.seq / (fwd / 1e3):.1f}")
    if a.sdpa:
        sd = timed_ms(lambda: model.forward(tokens_dev.long(), positions_dev, sdpa=True), a.runs, a.warmup)
        print(f"torch_forward_sdpa_device_ms: {sd:.4f}")
    if a.cuda_graph:
        graph_figures(a, model, tokens_host, positions_host, dev)


def graph_figures(a, model, tokens_host, positions_host, dev):
    import time
    static_tokens = tokens_host.to(dev).long()
    static_positions = positions_host.to(dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (PyTorch's recipe)
        for _ in range(3):
            model.forward(static_tokens, static_positions)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_logits = model.forward(static_tokens, static_positions)
    tokens_pinned = tokens_host.long().pin_memory()
    positions_pinned = positions_host.pin_memory()
    logits_pinned = torch.empty(static_logits.shape, dtype=static_logits.dtype, pin_memory=True)
    print(f"torch_graph_device_ms: {timed_ms(graph.replay, a.runs, a.warmup):.4f}")

    def job():
        static_tokens.copy_(tokens_pinned, non_blocking=True)
        static_positions.copy_(positions_pinned, non_blocking=True)
        graph.replay()
        logits_pinned.copy_(static_logits, non_blocking=True)
        torch.cuda.current_stream().synchronize()

    for _ in range(a.warmup):
        job()
    wall = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        job()
        wall.append((time.perf_counter() - t0) * 1e3)
    print(f"torch_graph_wall_ms: {statistics.median(wall):.4f}")


if __name__ == "__main__":
    main()
