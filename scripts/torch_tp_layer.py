#!/usr/bin/env python3
"""PyTorch's tensor-parallel transformer layer, the reference that
actorgraph-tp-bench's multi-GPU figures are compared with (tp2_vs_torch,
tp4_vs_torch in docs/BENCHMARKS.md).

One pre-norm transformer layer, Megatron-split over `--world` GPUs with
torch.distributed (NCCL, one process per GPU, spawned here: no torchrun
needed):
  attention: LayerNorm/RMSNorm -> column-parallel QKV (heads split across
  ranks) -> SDPA (causal) -> row-parallel output projection -> all-reduce ->
  residual;
  MLP: norm -> column-parallel up (GELU; or SwiGLU gate+up for --variant
  llama) -> row-parallel down -> all-reduce -> residual.
Two all-reduces per layer, as Megatron-LM does. Weights are random (the
figure is a time). Every rank times the layer with CUDA events after
warm-up; the layer's time is the slowest rank's median.

Prints a table and `torch_tp_layer_ms_<world>: X` (and, with --world-list,
one line per world size). Without torch or CUDA, or with fewer GPUs than a
world size needs, it says why and exits 0 for that size (skipped: the
caller compares only what was measured).

  python3 scripts/torch_tp_layer.py --world-list 1,2 [--d 8192 --heads 64
      --ff 32768 --seq 2048 --batch 2 --variant llama --iters 20]

NCCL_NVLS_ENABLE=0 is set for every process (NVLink multicast must stay off
on the shared GPU hosts).
"""
import argparse
import os
import statistics
import sys


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-list", default="1,2", help="comma-separated world sizes to run, e.g. 1,2,4")
    ap.add_argument("--d", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--ff", type=int, default=0, help="MLP width (default 4 x d)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--variant", choices=["gpt2", "llama"], default="llama",
                    help="llama: RMSNorm + SwiGLU MLP (actorgraph-tp-bench's layer); gpt2: LayerNorm + GELU")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--allreduce", action="store_true",
                    help="also time torch.distributed's NCCL all-reduce of 8 KiB .. 16 MiB f32 on the largest world: "
                         "torch_nccl_allreduce_us_<size> (NCCL's own figure beside actorgraph-tp-bench --allreduce)")
    return ap.parse_args()


def worker(rank, world, args, results):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port + world}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    dev = torch.device("cuda", rank)
    dt = torch.bfloat16
    d, h, ff = args.d, args.heads, (args.ff or 4 * args.d)
    assert h % world == 0 and ff % world == 0, "heads and ff must divide by the world size"
    hl, ffl, hd = h // world, ff // world, d // h
    g = torch.Generator(device=dev).manual_seed(1234 + rank)

    def w(*shape):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * 0.02).to(dt)

    w_qkv = w(d, 3 * hl * hd)          # column-parallel
    w_o = w(hl * hd, d)                # row-parallel
    if args.variant == "llama":
        w_gate, w_up = w(d, ffl), w(d, ffl)
    else:
        w_up = w(d, ffl)
    w_down = w(ffl, d)                 # row-parallel
    x = torch.randn(args.batch, args.seq, d, generator=g, device=dev, dtype=torch.float32).to(dt)

    def norm(t):
        if args.variant == "llama":
            return F.rms_norm(t, (d,))
        return F.layer_norm(t, (d,))

    def layer(x):
        b, t, _ = x.shape
        qkv = norm(x) @ w_qkv
        q, k, v = qkv.view(b, t, 3, hl, hd).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, hl * hd) @ w_o
        dist.all_reduce(a)
        x = x + a
        y = norm(x)
        if args.variant == "llama":
            m = F.silu(y @ w_gate) * (y @ w_up)
        else:
            m = F.gelu(y @ w_up, approximate="tanh")
        m = m @ w_down
        dist.all_reduce(m)
        return x + m

    with torch.no_grad():
        for _ in range(args.warmup):
            layer(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            layer(x)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
    med = torch.tensor([statistics.median(times)], device=dev)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if rank == 0:
        results[world] = med.item()
    if args.allreduce and world == results.get("allreduce_world", -1):
        # NCCL's own per-call time: 100 back-to-back all-reduces between two
        # CUDA events after a warm-up (the host enqueues ahead of the GPUs).
        for kib in (8, 64, 256, 1024, 16384):
            buf = torch.randn(kib * 256, device=dev, dtype=torch.float32)
            for _ in range(10):
                dist.all_reduce(buf)
            torch.cuda.synchronize()
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(100):
                dist.all_reduce(buf)
            e.record()
            e.synchronize()
            us = torch.tensor([s.elapsed_time(e) * 1000.0 / 100], device=dev)
            dist.all_reduce(us, op=dist.ReduceOp.MAX)
            if rank == 0:
                results[f"allreduce_{kib}"] = us.item()
    dist.destroy_process_group()


def main():
    args = parse()
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"torch_tp_layer: skipped: PyTorch is not installed ({e})")
        return 0
    if not torch.cuda.is_available():
        print("torch_tp_layer: skipped: no CUDA device")
        return 0
    ngpu = torch.cuda.device_count()
    ff = args.ff or 4 * args.d
    print(f"PyTorch {torch.__version__}, {ngpu} GPU(s) ({torch.cuda.get_device_name(0)}); layer {args.variant} "
          f"d {args.d} heads {args.heads} ff {ff} T {args.seq} B {args.batch} bf16, Megatron split, NCCL")
    print(f"{'world':>6} {'layer ms':>10}")
    for world in [int(s) for s in args.world_list.split(",") if s]:
        if world > ngpu:
            print(f"torch_tp_layer: world {world} skipped: only {ngpu} GPU(s) here")
            continue
        largest = max(int(w) for w in args.world_list.split(",") if w and int(w) <= ngpu)
        with mp.Manager() as m:
            results = m.dict()
            results["allreduce_world"] = largest if world > 1 else -1
            mp.spawn(worker, args=(world, args, results), nprocs=world, join=True)
            ms = results.get(world)
            sizes = {k: v for k, v in results.items() if isinstance(k, str) and k.startswith("allreduce_") and k != "allreduce_world"}
        print(f"{world:>6} {ms:>10.3f}")
        print(f"torch_tp_layer_ms_{world}: {ms:.3f}")
        for key, us in sizes.items():
            kib = int(key.split("_")[1])
            name = f"{kib // 1024}m" if kib >= 1024 else f"{kib}k"
            print(f"torch_nccl_allreduce_us_{name}_{world}gpu: {us:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
