"""Device script: prefill latency P50/P99 of 64 prompt tokens at batch 1 and 8
on a CUDA GPU, for SmolLM2-135M (the embedded GGUF, via the transformers runtime's conversion)
and for a randomly initialised Llama-3-8B-shaped model (config only, nothing downloaded), bf16,
after warm-up; eager and with ``torch.compile`` (``--compile`` adds ``reduce-overhead``: CUDA
graphs). Then the stage's own signal (``TorchRuntime.score`` on the 183-token prompt) on the GPU.
Under 5 minutes on one large GPU (the 8B model needs ~16 GB in bf16).

A prefill for a signal needs the last position's logits only (``logits_to_keep=1``), as the
runtime asks. Anchors printed beside the figures: NVIDIA NIM Llama-3.1-8B time-to-first-token
10.3 ms; a published Llama-3-8B AWQ P99 of 82.6 ms on an A10G. UNTESTED ON A GPU so far:
``--smoke`` runs the same code on the CPU with a tiny Llama config (what CI-less checks here can
do; ``tests/trading_core/test_inference.py`` runs it).

Usage: gpu_inference.py [--smoke] [--repeats N] [--compile MODE ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from tailsight.trading_core.inference.features import BookFeatures, render
from tailsight.trading_core.inference.runtime import load_runtime

ANCHORS = "anchors: NIM Llama-3.1-8B TTFT 10.3 ms; Llama-3-8B AWQ P99 82.6 ms (A10G)"
PROMPT_TOKENS = 64
BATCHES = (1, 8)
WARMUP = 3  # iterations before timing: cuBLAS/cuDNN set-up, allocator, torch.compile's compile
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
LLAMA3_8B_PARAMETERS = 8_030_261_248  # Meta-Llama-3-8B's published count
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)
COMPILE_MODES = ("eager", "default", "reduce-overhead", "max-autotune")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny config: the code runs")
    parser.add_argument("--repeats", type=int, default=50, help="timed prefills per row")
    parser.add_argument(
        "--compile",
        action="append",
        choices=COMPILE_MODES,
        help="variants to time (repeatable; default eager and default, eager only with --smoke)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2")
    if args.compile is None:
        args.compile = ["eager"] if args.smoke else ["eager", "default"]
    return args


def llama_config(shape: dict[str, Any]) -> Any:
    """A ``transformers.LlamaConfig`` of ``shape`` (no weights)."""
    import transformers

    return transformers.LlamaConfig(**shape)


def random_llama(shape: dict[str, Any], device: str, dtype: Any) -> Any:
    """A randomly initialised Llama of ``shape``, built on ``device`` in ``dtype`` directly (an
    8B model built in fp32 first would need 32 GB)."""
    import torch
    import transformers

    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(llama_config(shape), dtype=dtype)


def _time(net: Any, batch: int, repeats: int, device: str) -> tuple[float, float]:
    import numpy as np
    import torch

    ids = torch.randint(0, net.config.vocab_size, (batch, PROMPT_TOKENS), device=device)
    with torch.inference_mode():
        for _ in range(WARMUP):
            net(input_ids=ids, logits_to_keep=1, use_cache=False)
        samples = []
        for _ in range(repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter_ns()
            net(input_ids=ids, logits_to_keep=1, use_cache=False)
            if device == "cuda":
                torch.cuda.synchronize()
            samples.append((time.perf_counter_ns() - start) / 1e6)
    return float(np.percentile(samples, 50)), float(np.percentile(samples, 99))


def _signal(runtime: Any, repeats: int) -> tuple[int, float, float]:
    """The stage's real signal: the 183-token prompt through ``runtime.score``."""
    import numpy as np

    features = BookFeatures(
        "ACME",
        ((1_874_000, 900, 4), (1_873_900, 300, 2)),
        ((1_874_200, 100, 1), (1_874_300, 700, 3)),
        (("B", 1_874_200, 100), ("S", 1_874_000, 50)),
    )
    prompt = runtime.render(render(features))
    scores = [runtime.score(prompt) for _ in range(repeats + WARMUP)][WARMUP:]
    samples = [s.prefill_ns / 1e6 for s in scores]
    p50, p99 = float(np.percentile(samples, 50)), float(np.percentile(samples, 99))
    return scores[0].prompt_tokens, p50, p99


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    import torch
    import transformers

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device (use --smoke on a CPU machine)", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (smoke)"
    print(f"{where}; torch {torch.__version__}, transformers {transformers.__version__}")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    runtime = None
    models = []
    if args.smoke:
        models.append(("tiny-llama (smoke)", lambda: random_llama(TINY, device, dtype)))
    else:
        runtime = load_runtime(runtime="transformers", device="cuda")  # bf16, warmed up
        models.append(("SmolLM2-135M", lambda: runtime.net))
        models.append(
            ("Llama-3-8B-shaped (random)", lambda: random_llama(LLAMA3_8B, device, dtype))
        )
    print(f"{'model':28}{'mode':>16}{'batch':>6}{'P50 ms':>10}{'P99 ms':>10}   {ANCHORS}")
    for name, build in models:
        net = build().eval()
        for mode in args.compile:
            run = net if mode == "eager" else torch.compile(net, mode=mode)
            for batch in BATCHES:
                p50, p99 = _time(run, batch, args.repeats, device)
                print(f"{name:28}{mode:>16}{batch:6}{p50:10.2f}{p99:10.2f}", flush=True)
        del net
        if device == "cuda":
            torch.cuda.empty_cache()
    if runtime is not None:
        tokens, p50, p99 = _signal(runtime, args.repeats)
        print(f"{'SmolLM2 signal (score)':28}{'eager':>16}{1:6}{p50:10.2f}{p99:10.2f}", end="")
        print(f"   {tokens}-token prompt, the stage's own call")
    print(f"done in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
