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
transformers).

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


def actorgraph_ms(bench, folder, context, tokens, threads, layout_kind):
    if layout_kind == "threads":
        layout = ["--devices", "cpu:1", "--cpu-threads", str(threads)]
    else:
        layout = ["--devices", "cpu:%d" % threads, "--cpu-threads", "1"] + (["--tp", str(threads)] if threads > 1 else [])
    r = subprocess.run([bench, "--mode", "decode", "--model", folder, "--context", str(context),
                        "--new-tokens", str(tokens), "--prefill", "0"] + layout, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("cpu_decode_bench: actorgraph-generate-bench failed:\n" + r.stdout + r.stderr)
    for line in r.stdout.splitlines():
        if line.startswith("decode_ms_per_token: "):
            return float(line.split(": ")[1])
    sys.exit("cpu_decode_bench: no decode_ms_per_token line in:\n" + r.stdout)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/apps/actorgraph-generate-bench")
    ap.add_argument("--save", default="build/apps/actorgraph-save-model")
    ap.add_argument("--models-dir", default="/tmp/ag-cpu-models")
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
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
        ours, theirs = [], []
        for _ in range(a.rounds):
            ours.append(actorgraph_ms(a.bench, folder, a.context, a.tokens, a.threads, a.layout))
            if model is not None:
                theirs.append(torch_ms(model, a.context, a.tokens))
        rows.append((name, statistics.median(ours), statistics.median(theirs) if theirs else None))
        del model
    ours_label = "cpu:1 x%d threads ms" % a.threads if a.layout == "threads" else "actorgraph cpu:%d ms" % a.threads
    print("%-8s %22s %22s %10s" % ("model", ours_label, "PyTorch %d thread(s) ms" % a.threads, "ratio"))
    for name, ours, theirs in rows:
        print("%-8s %22.2f %22s %10s" % (name, ours, "%.2f" % theirs if theirs else "-",
                                         "%.3f" % (ours / theirs) if theirs else "-"))
    print("cpu_decode_threads: %d (%s)" % (a.threads, "one device" if a.layout == "threads" else "tensor parallel"))
    for name, ours, theirs in rows:
        print("cpu_decode_ms_per_token_%s: %.2f" % (name, ours))
        if theirs:
            print("torch_cpu_decode_ms_per_token_%s: %.2f" % (name, theirs))
            print("cpu_decode_vs_torch_%s: %.3f" % (name, ours / theirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
