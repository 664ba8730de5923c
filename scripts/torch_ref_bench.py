#!/usr/bin/env python3
"""PyTorch reference timings for the ops of actorgraph-cuda-bench (same shapes,
same byte counting), on the GPU machine:  python3 scripts/torch_ref_bench.py
Prints `name: value` lines (value in TFLOP/s or GB/s; read + write bytes)."""
import torch
import torch.nn.functional as F


def timed(fn, iters=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    out = []
    for label, dt, tf32, n in [("f32", torch.float32, False, 4096), ("tf32", torch.float32, True, 4096),
                               ("bf16", torch.bfloat16, False, 4096), ("f16", torch.float16, False, 4096),
                               ("bf16", torch.bfloat16, False, 8192)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device=dev, dtype=dt)
        b = torch.randn(n, n, device=dev, dtype=dt)
        s = timed(lambda: a @ b)
        out.append((f"torch_matmul_{n}_{label}_tflops", 2 * n ** 3 / s / 1e12))
    torch.backends.cuda.matmul.allow_tf32 = False
    for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        for op, rows, cols in [("rms_norm", 16384, 8192), ("layer_norm", 16384, 8192), ("softmax", 16384, 8192),
                               ("softmax", 64, 1 << 20), ("softmax_causal", 8192, 8192), ("add", 16384, 8192)]:
            x = torch.randn(rows, cols, device=dev, dtype=dt)
            if op == "rms_norm":
                fn = lambda: F.rms_norm(x, (cols,), eps=1e-6)
            elif op == "layer_norm":
                fn = lambda: F.layer_norm(x, (cols,), eps=1e-5)
            elif op == "softmax":
                fn = lambda: torch.softmax(x, dim=-1)
            elif op == "softmax_causal":
                mask = torch.ones(rows, cols, device=dev, dtype=torch.bool).triu(1)
                fn = lambda: torch.softmax((x * 0.125).masked_fill(mask, float("-inf")), dim=-1)
            else:
                fn = lambda: x + x
            s = timed(fn)
            out.append((f"torch_{op}_{rows}x{cols}_{name}_gbps", 2 * x.numel() * x.element_size() / s / 1e9))
    for k, v in out:
        print(f"{k}: {v:.3f}")


if __name__ == "__main__":
    main()
