#!/usr/bin/env python3
"""Decode on the CPU backend against PyTorch on the CPU, side by side.

Two models, saved with actorgraph-save-model when missing (random weights):
  gpt2   GPT-2 124M in f32 (12 layers, d 768, vocab 50257);
  llama  LLaMA-1B's first 4 layers in bf16 (d 2048, ff 8192, 32 heads, 8 kv
         heads, vocab 32000: 0.75 GB).
For each, alternating, --rounds times: `actorgraph-generate-bench --mode
decode --devices cpu:1 --cpu-threads 1` (one stream, one thread; with
--threads N: `cpu:N --tp N --cpu-threads 1`, tensor parallelism over N cpu
devices of one thread each, or with --layout threads `cpu:1 --cpu-threads
N`, one device whose kernels use N threads) and the same model in
Hugging Face transformers (eager, its KV cache, torch.set_num_threads(N)),
both decoding after a prompt of --context tokens; medians per token.

Prints a table and `name: value` lines:
  cpu_decode_ms_per_token_<model>, torch_cpu_decode_ms_per_token_<model>,
  cpu_decode_vs_torch_<model>
(the PyTorch lines are skipped, with the reason printed, without torch and
transformers). With --prefill N, also a prompt of N tokens whose every
position's logits come back (actorgraph-generate-bench's
prefill_with_logits_tokens_per_s, best of 3 after 4 warm-ups; PyTorch's
forward, best of 3 after one; each every round, medians over the rounds):
cpu_prefill_tokens_per_s_<model>,
torch_cpu_prefill_tokens_per_s_<model>, cpu_prefill_speedup_vs_torch_<model>
(ours over PyTorch's rate: above 1 is faster).

    python3 scripts/cpu_decode_bench.py --bench build/apps/actorgraph-generate-bench \\
        --save build/apps/actorgraph-save-model
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

MODELS = {
    "gpt2": (["--shape", "gpt2-124m", "--dtype", "f32"], "float32"),
    "llama": (["--shape", "llama-1b", "--layers", "4"], "bfloat16"),
}


def actorgraph_run(bench, folder, context, tokens, threads, layout_kind, prefill=0):
    """Decode ms per token, and the prefill's tokens per second with every
    position's logits (None without --prefill)."""
    if layout_kind == "threads":
        layout = ["--devices", "cpu:1", "--cpu-threads", str(threads)]
    else:
        layout = ["--devices", "cpu:%d" % threads, "--cpu-threads", "1"] + (["--tp", str(threads)] if threads > 1 else [])
    r = subprocess.run([bench, "--mode", "decode", "--model", folder, "--context", str(context),
                        "--new-tokens", str(tokens), "--prefill", str(prefill)] + layout, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("cpu_decode_bench: actorgraph-generate-bench failed:\n" + r.stdout + r.stderr)
    found = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition(": ")
        if key in ("decode_ms_per_token", "prefill_with_logits_tokens_per_s"):
            found[key] = float(value)
    if "decode_ms_per_token" not in found or (prefill and "prefill_with_logits_tokens_per_s" not in found):
        sys.exit("cpu_decode_bench: a figure is missing from:\n" + r.stdout)
    return found["decode_ms_per_token"], found.get("prefill_with_logits_tokens_per_s")


def torch_model(name, folder, threads):
    import torch
    import transformers
    torch.set_num_threads(threads)
    dtype = getattr(torch, MODELS[name][1])
    kw = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": dtype}
    return transformers.AutoModelForCausalLM.from_pretrained(folder, **kw).eval()


def torch_ms(model, context, tokens):
    import torch
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(1))
    times = []
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(tokens):
            t0 = time.perf_counter()
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def torch_prefill_tokens_per_s(model, prompt):
    import torch
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(2))
    best = None
    with torch.inference_mode():
        for i in range(4):  # one warm-up, then the best of 3 (every position's logits, as ours)
            t0 = time.perf_counter()
            model(ids, use_cache=False)
            dt = time.perf_counter() - t0
            if i > 0:
                best = dt if best is None else min(best, dt)
    return prompt / best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/apps/actorgraph-generate-bench")
    ap.add_argument("--save", default="build/apps/actorgraph-save-model")
    ap.add_argument("--models-dir", default="/tmp/ag-cpu-models")
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=0, help="prompt tokens of the prefill figures (0: none)")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch's threads and ours (see --layout)")
    ap.add_argument("--layout", choices=["tp", "threads"], default="tp",
                    help="tp: cpu:N --tp N, a thread each; threads: cpu:1 whose kernels use N threads")
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        have_torch = True
    except ImportError as e:
        print("cpu_decode_bench: PyTorch side skipped: needs torch and transformers (%s)" % e)
        have_torch = False
    rows = []
    for name in a.models.split(","):
        folder = os.path.join(a.models_dir, name)
        if not os.path.exists(os.path.join(folder, "config.json")):
            subprocess.run([a.save, "--out", folder] + MODELS[name][0], check=True, capture_output=True)
        model = torch_model(name, folder, a.threads) if have_torch else None
        ours, theirs, our_prefill, their_prefill = [], [], [], []
        for r in range(a.rounds):
            # The prefill figures every round too, alternated with PyTorch's
            # like the decode ones: PyTorch's own rate moved by a fifth from
            # one run to the next on the 2-core machine (session 60).
            ms, rate = actorgraph_run(a.bench, folder, a.context, a.tokens, a.threads, a.layout, a.prefill)
            ours.append(ms)
            if rate:
                our_prefill.append(rate)
            if model is not None:
                theirs.append(torch_ms(model, a.context, a.tokens))
                if a.prefill:
                    their_prefill.append(torch_prefill_tokens_per_s(model, a.prefill))
        rows.append((name, statistics.median(ours), statistics.median(theirs) if theirs else None,
                     statistics.median(our_prefill) if our_prefill else None,
                     statistics.median(their_prefill) if their_prefill else None))
        del model
    ours_label = "cpu:1 x%d threads ms" % a.threads if a.layout == "threads" else "actorgraph cpu:%d ms" % a.threads
    print("%-8s %22s %22s %10s" % ("model", ours_label, "PyTorch %d thread(s) ms" % a.threads, "ratio"))
    for name, ours, theirs, _, _ in rows:
        print("%-8s %22.2f %22s %10s" % (name, ours, "%.2f" % theirs if theirs else "-",
                                         "%.3f" % (ours / theirs) if theirs else "-"))
    if a.prefill:
        print("%-8s %22s %22s %10s" % ("prefill", "tokens/s (%d)" % a.prefill, "PyTorch tokens/s", "speedup"))
        for name, _, _, ours, theirs in rows:
            print("%-8s %22.1f %22s %10s" % (name, ours, "%.1f" % theirs if theirs else "-",
                                             "%.3f" % (ours / theirs) if theirs else "-"))
    print("cpu_decode_threads: %d (%s)" % (a.threads, "one device" if a.layout == "threads" else "tensor parallel"))
    for name, ours, theirs, our_rate, their_rate in rows:
        print("cpu_decode_ms_per_token_%s: %.2f" % (name, ours))
        if theirs:
            print("torch_cpu_decode_ms_per_token_%s: %.2f" % (name, theirs))
            print("cpu_decode_vs_torch_%s: %.3f" % (name, ours / theirs))
        if our_rate:
            print("cpu_prefill_tokens_per_s_%s: %.1f" % (name, our_rate))
            if their_rate:
                print("torch_cpu_prefill_tokens_per_s_%s: %.1f" % (name, their_rate))
                print("cpu_prefill_speedup_vs_torch_%s: %.3f" % (name, our_rate / their_rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
