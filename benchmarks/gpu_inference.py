"""Device script (issue 13, item 4): prefill latency P50/P99 of 64 prompt tokens at batch 1 and 8
on a CUDA GPU, for SmolLM2-135M (the embedded GGUF, via the transformers runtime's conversion)
and for a randomly initialised Llama-3-8B-shaped model (config only, nothing downloaded), bf16,
after warm-up; each with and without ``torch.compile``. Under 5 minutes on one large GPU.

Anchors printed beside the figures: NVIDIA NIM Llama-3.1-8B time-to-first-token 10.3 ms; a
published Llama-3-8B AWQ P99 of 82.6 ms on an A10G. UNTESTED ON A GPU so far: ``--smoke`` runs
the same code on the CPU with a tiny Llama config (what CI-less checks here can do).

Usage: gpu_inference.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import argparse
import sys
import time

ANCHORS = "anchors: NIM Llama-3.1-8B TTFT 10.3 ms; Llama-3-8B AWQ P99 82.6 ms (A10G)"
LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)


def _time(net, batch: int, tokens: int, repeats: int, device: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    import numpy as np
    import torch

    ids = torch.randint(0, net.config.vocab_size, (batch, tokens), device=device)
    with torch.inference_mode():
        for _ in range(3):  # warm-up (and compilation)
            net(input_ids=ids)
        samples = []
        for _ in range(repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter_ns()
            net(input_ids=ids)
            if device == "cuda":
                torch.cuda.synchronize()
            samples.append((time.perf_counter_ns() - start) / 1e6)
    return float(np.percentile(samples, 50)), float(np.percentile(samples, 99))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny config: the code runs")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    import torch
    import transformers

    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device (use --smoke on a CPU machine)", file=sys.stderr)
        return 2
    dtype = torch.float32 if args.smoke else torch.bfloat16
    models = []
    if args.smoke:
        config = transformers.LlamaConfig(**TINY)
        models.append(("tiny-llama (smoke)", transformers.LlamaForCausalLM(config)))
    else:
        from tailsight.trading_core.inference.runtime import load_runtime

        models.append(("SmolLM2-135M", load_runtime(runtime="transformers", device="cuda").net))  # type: ignore[attr-defined]
        with torch.device("cuda"):
            config = transformers.LlamaConfig(**LLAMA3_8B)
            models.append(("Llama-3-8B-shaped (random)", transformers.LlamaForCausalLM(config)))
    print(f"{'model':28}{'compile':>8}{'batch':>6}{'P50 ms':>10}{'P99 ms':>10}   {ANCHORS}")
    for name, net in models:
        net = net.to(device=device, dtype=dtype).eval()
        for compiled in (False,) if args.smoke else (False, True):  # inductor on CPU: slow
            run = torch.compile(net) if compiled else net
            for batch in (1, 8):
                p50, p99 = _time(run, batch, 64, args.repeats if not args.smoke else 3, device)
                print(f"{name:28}{compiled!s:>8}{batch:6}{p50:10.2f}{p99:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
