"""Cost of the histogram model and the ``tailsight.hist/1`` codec next to same-run baselines (numpy
on the raw samples, a per-sample Python loop), plus the quantile error against the samples."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from tailsight.hist import BUCKET_WIDTH_NS, Histogram
from tailsight.intervals import HistDocument, Series

QS = [0.5, 0.99, 0.999]


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    """Fastest of ``repeats`` runs, in seconds (the least disturbed by the shared machine)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    args = parser.parse_args()
    n_samples = 100_000 if args.quick else 2_000_000
    n_loop = 20_000 if args.quick else 200_000
    repeats = 3 if args.quick else 5

    rng = np.random.default_rng(7)
    # Run-queue-like latencies: lognormal around 20 µs with a long tail into the power-of-two part.
    samples = rng.lognormal(mean=np.log(20_000), sigma=1.5, size=n_samples).astype(np.int64)
    hist = Histogram.from_samples(samples)

    t_build = best_of(repeats, lambda: Histogram.from_samples(samples))
    t_sort = best_of(repeats, lambda: np.sort(samples))

    def record_loop() -> None:
        h = Histogram.empty()
        for value in samples[:n_loop].tolist():
            h.record(value)

    t_loop = best_of(1, record_loop) / n_loop * n_samples
    print(f"from_samples, {n_samples:,} samples: {t_build * 1e3:8.2f} ms")
    print(f"  baseline np.sort of the samples:  {t_sort * 1e3:8.2f} ms")
    print(f"  baseline record() loop (scaled):  {t_loop * 1e3:8.2f} ms")

    t_q = best_of(repeats * 20, lambda: hist.quantiles(QS)) * 1e6
    t_np = best_of(repeats, lambda: np.quantile(samples, QS, method="inverted_cdf")) * 1e6
    print(f"quantiles(p50, p99, p99.9):         {t_q:8.1f} µs")
    print(f"  baseline np.quantile on samples:  {t_np:8.1f} µs")

    other = Histogram.from_samples(samples[: n_samples // 2])
    t_merge = best_of(repeats * 20, lambda: hist.merge(other)) * 1e6
    t_delta = best_of(repeats * 20, lambda: hist.delta(other)) * 1e6
    print(f"merge / delta:                      {t_merge:8.1f} / {t_delta:.1f} µs")

    linear = samples[samples <= 10_240_000]
    h_linear = Histogram.from_samples(linear)
    qs = np.linspace(0.0, 1.0, 1001)
    exact = np.quantile(linear, qs, method="inverted_cdf")
    error_ns = np.abs(np.array(h_linear.quantiles(qs.tolist())) - exact)
    print(
        f"quantile error vs samples (linear range, 1001 q): max {error_ns.max():.0f} ns "
        f"(bound {BUCKET_WIDTH_NS} ns), mean {error_ns.mean():.0f} ns"
    )

    n_series = 50 if args.quick else 500
    series = [
        Series(
            {"probe": "runqueue", "cgroup": f"/svc/{i}"},
            Histogram.from_samples(samples[i * 1000 : (i + 1) * 1000]),
        )
        for i in range(n_series)
    ]
    doc = HistDocument(start_ns=0, end_ns=1_000_000_000, series=series)
    text = doc.dumps()
    t_dump = best_of(repeats, doc.dumps)
    t_load = best_of(repeats, lambda: HistDocument.loads(text))
    per_series = len(text) / n_series
    print(
        f"hist/1 document, {n_series} series ({per_series:.0f} B each): "
        f"dumps {t_dump * 1e3:.2f} ms, loads {t_load * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
