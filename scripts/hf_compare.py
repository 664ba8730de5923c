#!/usr/bin/env python3
"""Compares actorgraph-generate with Hugging Face transformers on random-init
models that this script saves itself.

For each model (GPT-2; LLaMA with grouped-query attention; LLaMA with a tied
head; GPT-2 saved in bfloat16 and sharded; a Llama-3-style LLaMA with a tied
head and Llama 3's RoPE scaling; a LLaMA with linear RoPE scaling) it
  1. builds the model with transformers from a seed, perturbs every parameter
     (so that biases and norm weights are not 0 and 1), save_pretrained()s it
     as safetensors;
  2. runs `actorgraph-generate --dump-logits` on the prompt on each layout
     given (one device, 2 stages, tensor degree 2, 2 stages x 2 by default) and compares the prompt's logits with transformers' (float32,
     eager attention): max |difference| <= --atol + --rtol * max |logit|;
  3. decodes --steps greedy tokens both ways (transformers' generate() with
     do_sample=False; actorgraph by calling the program again on the prompt
     plus the tokens so far) and requires the same tokens.
Then it trains a small byte-level BPE with HF `tokenizers`, and requires the
prompt ids actorgraph-generate prints for text prompts to equal
GPT2TokenizerFast's; and trains a Llama-3-style tokenizer.json (Llama 3's
Split regex, ByteLevel, ignore_merges, <|begin_of_text|> by template), whose
ids must equal the `tokenizers` library's own (that part alone:
--tokenizers-only, which needs `tokenizers` only).

Skips (exit status 77, a printed reason) when torch, transformers or numpy
cannot be imported: CI does not install them. Locally:
    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install numpy transformers \\
        torch --extra-index-url https://download.pytorch.org/whl/cpu
    /tmp/hf/bin/python scripts/hf_compare.py --generate build/apps/actorgraph-generate
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generate", required=True, help="path of actorgraph-generate")
    p.add_argument("--workdir", default=None, help="folder for the saved models (default: a temp dir)")
    p.add_argument("--devices", default="cpu:1;sim:2;cpu:2 --tp 2;sim:4 --stages 2 --tp 2",
                   help="layouts, ';'-separated: a device spec, then any actorgraph-generate layout flags; "
                        "without flags a model runs pipelined over all devices of the spec (sim:2: 2 stages; "
                        "on a GPU machine e.g. 'cuda:0;cuda:0,1;cuda:0,1 --tp 2')")
    p.add_argument("--steps", type=int, default=4, help="greedy tokens to compare")
    p.add_argument("--atol", type=float, default=2e-4)
    p.add_argument("--rtol", type=float, default=2e-4)
    p.add_argument("--tokenizers-only", action="store_true",
                   help="only the Llama-3-style tokenizer.json comparison, which needs HF `tokenizers` alone")
    return p.parse_args()


def transformers_greedy(ref, prompt, steps, **kw):
    """model.generate's `steps` greedy tokens after `prompt` (no end-of-sequence stop)."""
    import torch
    with torch.no_grad():
        gen = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           do_sample=False, max_new_tokens=steps, min_new_tokens=steps, pad_token_id=0,
                           eos_token_id=None, **kw)
    return gen[0, len(prompt):].tolist()


def generate_run(args, folder, spec, prompt, steps, extra=()):
    """actorgraph-generate's `steps` greedy tokens after `prompt` on layout `spec`
    (one run through the generator): (tokens, stdout), or (None, what failed)."""
    devices, *layout = spec.split()
    cmd = [args.generate, "--model", folder, "--devices", devices, "--dtype", "f32", "--max-new-tokens", str(steps),
           "--eos-ids", "1000000", "--prompt-ids", ",".join(map(str, prompt))] + list(extra) + layout
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    line = [l for l in r.stdout.splitlines() if l.startswith("generated: ")]
    if r.returncode != 0 or not line:
        return None, r.stdout + r.stderr
    return [int(t) for t in line[0].split(": ")[1].split(",")], r.stdout


def compare_repetition_penalty(args, name, folder, ref, prompt, penalty=1.5, steps=8):
    """Greedy generation with transformers' repetition_penalty: actorgraph-generate's
    tokens (the generator, --max-new-tokens) against model.generate's, on every layout."""
    want = transformers_greedy(ref, prompt, steps, repetition_penalty=penalty)
    failures = []
    if transformers_greedy(ref, prompt, steps) == want:
        failures.append("%s: transformers' tokens are the same with and without repetition_penalty %s: the check shows nothing"
                        % (name, penalty))
    for spec in args.devices.split(";"):
        got, out = generate_run(args, folder, spec, prompt, steps, ["--repetition-penalty", str(penalty)])
        if got is None:
            failures.append("%s on %s with --repetition-penalty: actorgraph-generate failed:\n%s" % (name, spec, out))
            continue
        ok = got == want
        print("%-18s %-26s repetition_penalty %.1f: greedy %s vs %s %s" % (name, spec, penalty, got, want,
                                                                          "ok" if ok else "MISMATCH"))
        if not ok:
            failures.append("%s on %s: with repetition_penalty %s the tokens are %s, transformers %s" % (name, spec, penalty, got, want))
    return failures


def compare_window_ring(args, name, folder, ref, prompt, steps=12):
    """A sliding-window model generating past its cache's ring (the generator
    keeps window + prefill chunk - 1 rows, position p in row p % rows):
    actorgraph-generate's greedy tokens against model.generate's, on every layout."""
    want = transformers_greedy(ref, prompt, steps)
    failures = []
    for spec in args.devices.split(";"):
        got, out = generate_run(args, folder, spec, prompt, steps)
        cache = [l for l in out.splitlines() if l.startswith("kv_cache: ")] if got is not None else []
        if not cache:
            failures.append("%s on %s, %d tokens: actorgraph-generate failed:\n%s" % (name, spec, steps, out))
            continue
        positions, rows = [int(w) for w in re.findall(r"(\d+) (?:positions|rows)", cache[0])]
        ok = got == want and rows < positions
        print("%-18s %-26s %d tokens, cache ring of %d rows for %d positions: greedy %s vs %s %s" %
              (name, spec, steps, rows, positions, got, want, "ok" if ok else "MISMATCH"))
        if rows >= positions:
            failures.append("%s on %s: the cache holds %d rows for %d positions: no ring" % (name, spec, rows, positions))
        if got != want:
            failures.append("%s on %s: %d tokens past the ring are %s, transformers %s" % (name, spec, steps, got, want))
    return failures


def main():
    args = parse_args()
    if args.tokenizers_only:
        workdir = args.workdir or tempfile.mkdtemp(prefix="ag_hf_compare_")
        try:
            import tokenizers  # noqa: F401
        except ImportError as e:
            print("SKIP: --tokenizers-only needs HF tokenizers (%s)" % e)
            return SKIP
        failures = compare_llama3_tokenizer(args, workdir) + compare_qwen2_tokenizer(args, workdir)
        print("FAIL:\n  " + "\n  ".join(failures) if failures else "hf_compare: the Llama-3-style and Qwen2-style tokenizers match tokenizers")
        return 1 if failures else 0
    try:
        import numpy as np
        import torch
        import transformers
    except ImportError as e:
        print("SKIP: hf_compare needs numpy, torch and transformers (%s)" % e)
        return SKIP
    if not os.access(args.generate, os.X_OK):
        print("FAIL: %s is not an executable" % args.generate)
        return 1
    print("transformers %s, torch %s" % (transformers.__version__, torch.__version__))
    workdir = args.workdir or tempfile.mkdtemp(prefix="ag_hf_compare_")
    os.makedirs(workdir, exist_ok=True)

    def perturb(model, seed):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1:  # norms and biases: around 1 / 0 with spread
                    base = 1.0 if ("ln" in name or "norm" in name) and name.endswith("weight") else 0.0
                    p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
                else:  # large enough that attention is sharp and logits spread
                    p.copy_(0.15 * torch.randn(p.shape, generator=g))
        return model

    def gpt2(seed, vocab_size=97, **kw):
        cfg = transformers.GPT2Config(vocab_size=vocab_size, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                                      layer_norm_epsilon=1e-5, **kw)
        torch.manual_seed(seed)
        return perturb(transformers.GPT2LMHeadModel(cfg), seed)

    # The LLaMA-family models' common small shape (GQA: 4 heads over 2 kv heads).
    small = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rope_theta=5000.0)

    def causal_lm(config_cls, model_cls, seed, base, kw):
        cfg = config_cls(**{**small, **base, **kw})
        torch.manual_seed(seed)
        return perturb(model_cls(cfg), seed)

    def llama(seed, **kw):
        return causal_lm(transformers.LlamaConfig, transformers.LlamaForCausalLM, seed,
                         dict(rms_norm_eps=1e-5, tie_word_embeddings=False), kw)

    def qwen2(seed, **kw):
        # Qwen2: LLaMA's layer with q/k/v biases (Qwen2Attention), no sliding window.
        return causal_lm(transformers.Qwen2Config, transformers.Qwen2ForCausalLM, seed,
                         dict(rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False), kw)

    def qwen3(seed, **kw):
        # Qwen3: LLaMA's layer with an RMSNorm over each head's q and k, heads of head_dim.
        return causal_lm(transformers.Qwen3Config, transformers.Qwen3ForCausalLM, seed,
                         dict(head_dim=24, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False), kw)

    def mistral(seed, **kw):
        # Mistral: LLaMA's layer with a sliding window over the keys.
        return causal_lm(transformers.MistralConfig, transformers.MistralForCausalLM, seed,
                         dict(rms_norm_eps=1e-5, tie_word_embeddings=False), kw)

    def llama3_scaling():
        # Llama 3.1 / 3.2's RoPE scaling; an original context of 128 puts the
        # heads' 8 pairs (wavelengths 6.3 to 10,844 at theta 5000) in all
        # three regimes: kept, blended, slowed. transformers 5 takes it as
        # rope_parameters, 4.x as rope_scaling (each saves its own spelling).
        scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=128)
        return rope_kw(scaling)

    def rope_kw(scaling):
        if int(transformers.__version__.split(".")[0]) >= 5:
            return {"rope_parameters": dict(scaling, rope_theta=5000.0)}
        return {"rope_scaling": scaling}

    cases = [
        ("gpt2", gpt2(1), {}),
        ("gpt2_erf_gelu", gpt2(2, activation_function="gelu"), {}),
        ("llama_gqa", llama(3), {}),
        ("llama_tied_mha", llama(4, num_key_value_heads=4, tie_word_embeddings=True), {}),
        ("gpt2_bf16_sharded", gpt2(5).to(torch.bfloat16), {"max_shard_size": "60KB"}),
        ("llama3_rope_tied", llama(6, tie_word_embeddings=True, max_position_embeddings=256, **llama3_scaling()), {}),
        # Linear scaling (position interpolation, LongChat-style checkpoints).
        ("llama_rope_linear", llama(7, **rope_kw(dict(rope_type="linear", factor=4.0))), {}),
        # Heads wider than hidden_size / heads (head_dim, as Mistral NeMo's): q 96 wide on d 64.
        ("llama_wide_heads", llama(8, head_dim=24), {}),
        # Biases on the attention's projections: Qwen2's q/k/v, LLaMA's attention_bias (q/k/v/o).
        ("qwen2_tied", qwen2(9), {}),
        ("llama_attention_bias", llama(10, attention_bias=True), {}),
        # Qwen3's q/k norms over heads wider than hidden_size / heads.
        ("qwen3_tied", qwen3(11), {}),
        # Sliding windows shorter than the prompt: Mistral's, and Qwen2's on every layer.
        ("mistral_window_3", mistral(12, sliding_window=3), {}),
        ("qwen2_window_4", qwen2(13, use_sliding_window=True, sliding_window=4, max_window_layers=0), {}),
    ]
    prompt = [5, 17, 42, 8, 91, 3, 60]
    failures = []
    for name, model, save_kw in cases:
        folder = os.path.join(workdir, name)
        model.save_pretrained(folder, safe_serialization=True, **save_kw)
        # The reference runs in float32 with eager attention, from the saved files.
        # transformers 5 renamed from_pretrained's torch_dtype to dtype.
        dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
        ref = type(model).from_pretrained(folder, attn_implementation="eager", **{dtype_kw: torch.float32}).eval()
        with torch.no_grad():
            want = ref(torch.tensor([prompt])).logits[0].float().numpy()
        want_tokens = transformers_greedy(ref, prompt, args.steps)
        cfg = ref.config
        scaled = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if scaled.get("rope_type") in ("llama3", "linear"):
            # transformers applied the scaling: its frequencies are not plain RoPE's.
            dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            theta = scaled.get("rope_theta", getattr(cfg, "rope_theta", None))
            plain = 1.0 / (theta ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
            rotary = getattr(getattr(ref, "model", None), "rotary_emb", None)
            inv = getattr(rotary, "inv_freq", None)
            if inv is None:
                failures.append("%s: found no model.rotary_emb.inv_freq to check transformers' RoPE scaling" % name)
            else:
                changed = int((~torch.isclose(inv.float().cpu(), plain, rtol=1e-6)).sum())
                print("%-18s transformers' RoPE frequencies: %d of %d pairs scaled" % (name, changed, len(plain)))
                if changed == 0:
                    failures.append("%s: transformers did not apply the %s RoPE scaling" % (name, scaled.get("rope_type")))
        for spec in args.devices.split(";"):
            # Without layout flags the model is pipelined over every device of the spec.
            devices, *layout = spec.split()
            base = [args.generate, "--model", folder, "--devices", devices, "--dtype", "f32"] + layout
            out_npy = os.path.join(folder, "logits.npy")
            ids = list(prompt)
            got_tokens = []
            for step in range(args.steps):
                cmd = base + ["--prompt-ids", ",".join(map(str, ids))]
                if step == 0:
                    cmd += ["--dump-logits", out_npy]
                r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
                if r.returncode != 0:
                    failures.append("%s on %s: actorgraph-generate failed:\n%s%s" % (name, spec, r.stdout, r.stderr))
                    break
                line = [l for l in r.stdout.splitlines() if l.startswith("generated: ")]
                tok = int(line[0].split(": ")[1])
                got_tokens.append(tok)
                ids.append(tok)
            else:
                got = np.load(out_npy)
                err = float(np.max(np.abs(got - want)))
                scale = float(np.max(np.abs(want)))
                ok_logits = got.shape == want.shape and err <= args.atol + args.rtol * scale
                ok_tokens = got_tokens == want_tokens
                print("%-18s %-26s logits max_abs_err %.3g (max |logit| %.3g) %s; greedy %s vs %s %s" %
                      (name, spec, err, scale, "ok" if ok_logits else "MISMATCH", got_tokens, want_tokens,
                       "ok" if ok_tokens else "MISMATCH"))
                if not ok_logits:
                    failures.append("%s on %s: logits differ by %.3g" % (name, spec, err))
                if not ok_tokens:
                    failures.append("%s on %s: greedy tokens %s, transformers %s" % (name, spec, got_tokens, want_tokens))
        if name in ("gpt2", "llama_gqa"):
            failures += compare_repetition_penalty(args, name, folder, ref, prompt)
        if name in ("mistral_window_3", "qwen2_window_4"):
            failures += compare_window_ring(args, name, folder, ref, prompt)
    failures += compare_bpe_tokenizer(args, workdir, gpt2)
    failures += compare_llama3_tokenizer(args, workdir)
    failures += compare_qwen2_tokenizer(args, workdir)
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("hf_compare: all %d models match transformers" % len(cases))
    return 0


def compare_bpe_tokenizer(args, workdir, gpt2):
    """Trains a byte-level BPE with HF `tokenizers`, saves vocab.json +
    merges.txt beside a GPT-2 model of that vocabulary, and compares the
    prompt ids actorgraph-generate prints for --prompt with GPT2TokenizerFast's."""
    try:
        import tokenizers
        import transformers
    except ImportError as e:
        print("tokenizer comparison skipped: %s" % e)
        return []
    folder = os.path.join(workdir, "gpt2_tokenizer")
    corpus = ["The quick brown fox jumps over the lazy dog.", "We'll see what they've done, isn't it?",
              "Numbers 123 456 and 7.5% of   spaces\n\nnewlines", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f642"]
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus * 20, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"])
    vocab = bpe.get_vocab_size()
    gpt2(7, vocab_size=vocab).save_pretrained(folder, safe_serialization=True)
    bpe.save_model(folder)
    # From the folder's vocab.json + merges.txt; <|endoftext|> is its default special token.
    hf = transformers.GPT2TokenizerFast.from_pretrained(folder)
    texts = ["The lazy fox's numbers: 123,456!", "  two  spaces\tand\ttabs\n\n end  ", "they're we'll I'd 'S",
             "caf\u00e9 \u65e5\u672c \U0001f642\U0001f642 x\u00b2 \u00bd", "<|endoftext|>after"]
    return compare_prompt_ids(args, folder, texts, hf.encode, "bpe", "GPT2TokenizerFast")


def compare_prompt_ids(args, folder, texts, encode, label, reference):
    """The prompt ids actorgraph-generate prints for each text of `texts`
    against encode(text); returns the failures."""
    failures = []
    for text in texts:
        want = encode(text)
        r = subprocess.run([args.generate, "--model", folder, "--prompt", text], capture_output=True, text=True, errors="replace")
        line = [l for l in r.stdout.splitlines() if l.startswith("prompt_ids: ")]
        got = [int(x) for x in line[0].split(": ")[1].split(",")] if line else None
        ok = r.returncode == 0 and got == want
        print("%s %-44r %s" % (label, text, "ok" if ok else "MISMATCH %s vs %s %s" % (got, want, r.stderr)))
        if not ok:
            failures.append("%s: %r gives %s, %s %s" % (label, text, got, reference, want))
    return failures


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def saved_tiny_model(args, workdir, name, shape):
    """A tiny model of `shape` saved by actorgraph-save-model (beside
    --generate) into workdir/name: (its folder, what failed or None)."""
    folder = os.path.join(workdir, name)
    save = os.path.join(os.path.dirname(os.path.abspath(args.generate)), "actorgraph-save-model")
    r = subprocess.run([save, "--out", folder, "--shape", shape], capture_output=True, text=True)
    return folder, None if r.returncode == 0 else "actorgraph-save-model failed: %s%s" % (r.stdout, r.stderr)


def compare_llama3_tokenizer(args, workdir):
    """Trains a Llama-3-style tokenizer.json with HF `tokenizers` (its Split
    regex, ByteLevel, ignore_merges, <|begin_of_text|> by template, an added
    <|eot_id|>) beside a tiny LLaMA from actorgraph-save-model, and compares
    the prompt ids actorgraph-generate prints for --prompt with the library's
    own encode(). Needs only `tokenizers`."""
    try:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    except ImportError as e:
        print("llama3 tokenizer comparison skipped: %s" % e)
        return []
    folder, failed = saved_tiny_model(args, workdir, "llama3_tokenizer", "tiny-llama")
    if failed:
        return ["llama3 tokenizer: " + failed]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = ["The quick brown fox jumps over the lazy dog.", "We'll see what they've done, isn't it? DON'T!",
              "Numbers 1234567 and 7.5% of   spaces\n\nnewlines\r\n\tindented", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f642"]
    trainer = trainers.BpeTrainer(vocab_size=290, min_frequency=1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin_of_text|>", "<|eot_id|>"])
    tok.train_from_iterator(corpus * 20, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(os.path.join(folder, "tokenizer.json"))
    texts = ["The lazy fox's numbers: 1234567,456!", "  two  spaces\tand\ttabs\n\n end  ", "they're WE'LL I'd 'S",
             "caf\u00e9 \u65e5\u672c \U0001f642\U0001f642 x\u00b2 \u00bd", "line\r\n  \r\n\tnext...hello!\n\nWorld?\n",
             "<|eot_id|>after", "quick brown"]
    return compare_prompt_ids(args, folder, texts, lambda t: tok.encode(t).ids, "llama3 tokenizer", "tokenizers")


QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


def compare_qwen2_tokenizer(args, workdir):
    """The same for a Qwen2-style tokenizer.json (transformers' Qwen2
    converter: an NFC normalizer, Llama 3's Split regex with single digits,
    ByteLevel, no template), over text that NFC changes: decomposed accents,
    Hangul jamo, the Angstrom sign, marks out of canonical order."""
    try:
        from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    except ImportError as e:
        print("qwen2 tokenizer comparison skipped: %s" % e)
        return []
    folder, failed = saved_tiny_model(args, workdir, "qwen2_tokenizer", "tiny-qwen2")
    if failed:
        return ["qwen2 tokenizer: " + failed]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = ["The quick brown fox jumps over the lazy dog 2024.", "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m \uac01\ud55c\uad6d\uc5b4",
              "We'll see 1234567 and 7.5% of   spaces\n\nnewlines", "\u1ead\u1ec7 ti\u1ebfng Vi\u1ec7t"]
    trainer = trainers.BpeTrainer(vocab_size=290, min_frequency=1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(corpus * 20, trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    texts = ["cafe\u0301 nai\u0308ve", "\u212bngstro\u0308m 2024", "\u1100\u1161\u11a8\ud55c",
             "a\u0323\u0302 a\u0302\u0323 ti\u1ebfng", "<|im_start|>user 1234567<|im_end|>", "Hello, world!\n\n  ok",
             "\u0915\u093c \u0958"]
    return compare_prompt_ids(args, folder, texts, lambda t: tok.encode(t).ids, "qwen2 tokenizer", "tokenizers")


if __name__ == "__main__":
    sys.exit(main())
