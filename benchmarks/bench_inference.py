"""The inference stage's runtimes side by side: llama.cpp (llama-cpp-python) and transformers +
torch on the same SmolLM2-135M-Instruct GGUF file, same run, one core each by default.

Per runtime, in a fresh interpreter (so load time includes its imports): load time; prefill
latency P50/P99 for 16/64/256-token prompts; greedy decode tokens/s; the signal (the real
prompt's label logits) P50; and through the stage (worker process, IPC, signal published) the
round trip P50. Ratios are to transformers in the same run; the faster runtime is the default
(``runtime.default_runtime``), and the run fails if the measured winner is not.

Usage: bench_inference.py [--quick] [--threads N] [--runtime NAME ...]
  --quick: 2 prefills per length, 8 decoded tokens (CI); default: 20 and 64.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

from tailsight.trading_core.inference.features import BookFeatures, render
from tailsight.trading_core.inference.runtime import default_runtime, load_runtime
from tailsight.trading_core.inference.stage import InferenceConfig, InferenceStage

PROMPT_LENGTHS = (16, 64, 256)


def _measure(runtime_name: str, threads: int, repeats: int, decode_tokens: int) -> dict[str, Any]:
    started = time.perf_counter_ns()
    runtime = load_runtime(runtime=runtime_name, threads=threads)
    load_ns = time.perf_counter_ns() - started
    features = BookFeatures(
        "ACME",
        ((1_874_000, 900, 4), (1_873_900, 300, 2), (1_873_800, 500, 3)),
        ((1_874_200, 100, 1), (1_874_300, 700, 3), (1_874_400, 200, 1)),
        (("B", 1_874_200, 100), ("S", 1_874_000, 50), ("B", 1_874_200, 300)),
    )
    prompt = runtime.render(render(features))
    filler = runtime.tokenize(render(features))
    out: dict[str, Any] = {
        "runtime": runtime.name,
        "model": runtime.model,
        "load_s": load_ns / 1e9,
        "converted": bool(getattr(runtime, "converted", False)),
        "prompt_tokens": len(runtime.tokenize(prompt)),
    }
    for n in PROMPT_LENGTHS:
        tokens = (filler * (n // len(filler) + 1))[:n]
        runtime.decode(tokens, 0)  # warm-up
        runs = [runtime.decode(tokens, 0)[0] for _ in range(repeats)]
        out[f"prefill{n}_p50_ms"] = float(np.percentile(runs, 50)) / 1e6
        out[f"prefill{n}_p99_ms"] = float(np.percentile(runs, 99)) / 1e6
    _, generation_ns = runtime.decode(filler[:16], decode_tokens)
    out["decode_tok_s"] = decode_tokens / (generation_ns / 1e9)
    signals = [runtime.score(prompt).prefill_ns for _ in range(repeats)]
    out["signal_p50_ms"] = statistics.median(signals) / 1e6
    runtime.close()
    out.update(_through_stage(runtime_name, threads, repeats, features))
    return out


def _through_stage(runtime: str, threads: int, repeats: int, features: Any) -> dict[str, Any]:
    with InferenceStage(InferenceConfig(runtime=runtime, threads=threads)) as stage:
        trips = []
        for i in range(repeats + 1):
            start = time.perf_counter_ns()
            stage.submit(1, features, start)
            if not stage.wait(i + 1, timeout_s=60):
                raise RuntimeError("the inference stage did not answer")
            trips.append(stage.last[1].done_ns - start)
        queue = stage.hists["inference_queue_wait"].quantile(0.5)
    return {
        "stage_round_trip_p50_ms": statistics.median(trips[1:]) / 1e6,
        "queue_p50_us": queue / 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runtime", action="append", choices=("llama.cpp", "transformers"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    repeats, decode_tokens = (2, 8) if args.quick else (20, 64)
    if args.child:
        print(json.dumps(_measure(args.child, args.threads, repeats, decode_tokens)))
        return 0

    names = args.runtime or ["transformers", "llama.cpp"]
    if "llama.cpp" in names and importlib.util.find_spec("llama_cpp") is None:
        print(
            "llama.cpp: llama-cpp-python not installed (pip install 'tailsight[llamacpp]'): skipped"
        )
        names.remove("llama.cpp")
    results = {}
    for name in names:  # one fresh interpreter each: cold load, no shared thread pools
        command = [sys.executable, __file__, "--child", name, "--threads", str(args.threads)]
        if args.quick:
            command.append("--quick")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"{name}: failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            return 1
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    base = results.get("transformers")
    rows = [
        ("load_s", "load (s)", False),
        *[(f"prefill{n}_p50_ms", f"prefill {n} tok P50 (ms)", False) for n in PROMPT_LENGTHS],
        *[(f"prefill{n}_p99_ms", f"prefill {n} tok P99 (ms)", False) for n in PROMPT_LENGTHS],
        ("decode_tok_s", "decode (tokens/s)", True),
        ("signal_p50_ms", "signal prefill P50 (ms)", False),
        ("stage_round_trip_p50_ms", "stage round trip P50 (ms)", False),
        ("queue_p50_us", "stage queue wait P50 (us)", False),
    ]
    model = next(iter(results.values()))["model"]
    print(f"model {model}, {args.threads} thread(s), signal prompt", end=" ")
    print(", ".join(f"{n}: {r['prompt_tokens']} tokens" for n, r in results.items()))
    print(f"{'':30}" + "".join(f"{name:>16}" for name in results) + "   ratio to transformers")
    for key, title, higher_better in rows:
        line = f"{title:30}" + "".join(f"{r[key]:16.2f}" for r in results.values())
        if base is not None and "llama.cpp" in results and base[key]:
            ratio = results["llama.cpp"][key] / base[key]
            line += f"   llama.cpp {ratio:.2f}x" + (" (higher is better)" if higher_better else "")
        print(line)
    if base is not None and base["converted"]:
        print("transformers: this run converted the GGUF file (first load); later loads are cached")
    fastest = min(results, key=lambda n: results[n]["signal_p50_ms"])
    print(f"fastest signal: {fastest}; default runtime: {default_runtime()}")
    if fastest != default_runtime() and len(results) > 1:
        print("the default runtime is not the measured fastest", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
