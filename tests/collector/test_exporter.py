"""Prometheus exporter against hand-built documents: `le` counts exact against raw samples,
top-K + other sums exact, windows, counters, self-metrics from a fake procfs."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tailsight.analysis.verdicts import JumpVerdicts
from tailsight.collector.config import CollectorConfig
from tailsight.collector.exporter import (
    COARSE_BOUNDS_NS,
    FOLD_MAX_AGE,
    TOP_K_HYSTERESIS,
    Family,
    ProbeStatus,
    PrometheusExporter,
    _Merge,
    _Window,
    counter_metric,
    metric_base,
    render_text,
    window_label,
)
from tailsight.hist import BUCKET_WIDTH_NS, Histogram, SparseHistogram, bucket_upper_bounds_ns
from tailsight.intervals import Counter, HistDocument, Series
from tailsight.probes import features
from tailsight.probes.base import HIST_ROW, PairCounters, Snapshot, labels
from tailsight.probes.loader import prog_test_run_raw_tp
from tailsight.probes.symbolizer import shared_symbolizer

T0_NS = 1_700_000_000 * 10**9
SECOND_NS = 10**9

Samples = dict[tuple[str, ...], float]


def scrape(exporter: PrometheusExporter) -> Samples:
    """Every sample of one scrape (the served bytes), keyed by (name, sorted label pairs...)."""
    return parse(exporter.exposition().decode())


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, *(f"{k}={v}" for k, v in sorted(sample.labels.items())))
            out[key] = sample.value
    return out


def series_of(samples: Samples, name: str) -> dict[tuple[str, ...], float]:
    return {k: v for k, v in samples.items() if k[0] == name}


def doc(
    t: int, per_cgroup: dict[str, np.ndarray], counters: list[Counter] | None = None
) -> HistDocument:
    series = [
        Series({"probe": "runqueue", "cgroup": cgroup}, Histogram.from_samples(values))
        for cgroup, values in per_cgroup.items()
    ]
    return HistDocument(T0_NS + t * SECOND_NS, T0_NS + (t + 1) * SECOND_NS, series, counters or [])


def test_coarse_bounds_are_exact_model_bounds() -> None:
    uppers = set(bucket_upper_bounds_ns().tolist())
    assert all(b in uppers and b % BUCKET_WIDTH_NS == 0 for b in COARSE_BOUNDS_NS)
    assert list(COARSE_BOUNDS_NS) == sorted(set(COARSE_BOUNDS_NS))
    us = [5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
    assert list(COARSE_BOUNDS_NS[: len(us)]) == [u * 1000 for u in us]
    assert COARSE_BOUNDS_NS[-1] == max(uppers)  # the model's last finite edge (~10.5 s)


def test_bucket_counts_exact_against_raw_samples() -> None:
    rng = np.random.default_rng(7)
    first = (rng.lognormal(10.5, 1.5, 5000)).astype(np.int64)  # ~36 µs median, long tail
    second = np.concatenate([rng.integers(0, 30_000, 997), [5_000, 10_000, 20_000, 11 * 10**9]])
    exporter = PrometheusExporter(CollectorConfig(top_k=5))
    exporter.update(doc(0, {"/a": first}))
    exporter.update(doc(1, {"/a": second}))
    samples = scrape(exporter)
    both = np.concatenate([first, second])
    base = ("tailsight_runqueue_wait_seconds_bucket", "cgroup=/a")
    for bound_ns in COARSE_BOUNDS_NS:
        le = repr(bound_ns / 1e9)
        assert samples[(*base, f"le={le}", "probe=runqueue")] == int((both <= bound_ns).sum())
    assert samples[(*base, "le=+Inf", "probe=runqueue")] == len(both)
    labels = ("cgroup=/a", "probe=runqueue")
    assert samples[("tailsight_runqueue_wait_seconds_count", *labels)] == len(both)
    assert samples[("tailsight_runqueue_wait_seconds_sum", *labels)] == pytest.approx(
        int(both.sum()) / 1e9, rel=1e-12
    )


def test_top_k_place_changes_hands_only_past_the_hysteresis() -> None:
    """Two cgroups of about equal weight do not swap the one top-K place every interval: the
    newcomer needs TOP_K_HYSTERESIS times the incumbent's events over the ranking window."""
    exporter = PrometheusExporter(CollectorConfig(top_k=1, quantile_windows_s=(1.0,)))
    rng = np.random.default_rng(12)
    kept = []
    for t, (a, b) in enumerate([(100, 90), (100, 120), (100, 124), (100, 126), (120, 100)]):
        exporter.update(doc(t, {"/a": rng.integers(0, 10**6, a), "/b": rng.integers(0, 10**6, b)}))
        counts = series_of(scrape(exporter), "tailsight_runqueue_wait_seconds_count")
        kept.append({k[1] for k in counts} - {"cgroup=other"})
    assert 1.2 < TOP_K_HYSTERESIS < 1.26
    assert kept == [{"cgroup=/a"}] * 3 + [{"cgroup=/b"}] * 2


def test_top_k_and_other_sums_exact() -> None:
    rng = np.random.default_rng(8)
    sizes = {f"/c{n}": 10 * (n + 1) for n in range(10)}  # /c9 busiest
    raw = {cgroup: rng.integers(0, 3_000_000, size) for cgroup, size in sizes.items()}
    exporter = PrometheusExporter(CollectorConfig(top_k=3))
    exporter.update(doc(0, raw))
    samples = scrape(exporter)
    counts = series_of(samples, "tailsight_runqueue_wait_seconds_count")
    assert {k[1] for k in counts} == {"cgroup=/c9", "cgroup=/c8", "cgroup=/c7", "cgroup=other"}
    rest = np.concatenate([raw[f"/c{n}"] for n in range(7)])
    assert counts[
        ("tailsight_runqueue_wait_seconds_count", "cgroup=other", "probe=runqueue")
    ] == len(rest)
    for bound_ns in COARSE_BOUNDS_NS[:10]:
        key = (
            "tailsight_runqueue_wait_seconds_bucket",
            "cgroup=other",
            f"le={bound_ns / 1e9!r}",
            "probe=runqueue",
        )
        assert samples[key] == int((rest <= bound_ns).sum())
    assert samples[("tailsight_cgroups_folded", "probe=runqueue")] == 7
    # Quantile gauges of "other" come from the merged full-resolution histograms.
    p99 = samples[
        (
            "tailsight_runqueue_wait_quantile_seconds",
            "cgroup=other",
            "probe=runqueue",
            "q=0.99",
            "window=1s",
        )
    ]
    assert abs(p99 * 1e9 - np.quantile(rest, 0.99)) <= BUCKET_WIDTH_NS


def test_allow_regex_limits_who_gets_a_label() -> None:
    values = np.arange(1, 100, dtype=np.int64) * 1000
    exporter = PrometheusExporter(CollectorConfig(top_k=10, cgroup_allow=(r"/app/.*",)))
    exporter.update(doc(0, {"/app/x": values, "/system": np.repeat(values, 5), "/app": values}))
    counts = series_of(scrape(exporter), "tailsight_runqueue_wait_seconds_count")
    assert counts == {
        ("tailsight_runqueue_wait_seconds_count", "cgroup=/app/x", "probe=runqueue"): 99,
        ("tailsight_runqueue_wait_seconds_count", "cgroup=other", "probe=runqueue"): 99 * 6,
    }


def test_churn_keeps_cardinality_bounded_and_other_monotonic() -> None:
    exporter = PrometheusExporter(CollectorConfig(top_k=4, quantile_windows_s=(3.0,)))
    other_before = 0.0
    for t in range(40):
        # Each interval: 10 fresh cgroups that live for two intervals, plus a steady one.
        groups = {f"/churn/{t}-{n}": np.full(n + 1, 7_000) for n in range(10)}
        groups |= {f"/churn/{t - 1}-{n}": np.full(n + 1, 7_000) for n in range(10) if t}
        groups["/steady"] = np.full(100, 12_000)
        exporter.update(doc(t, groups))
        samples = scrape(exporter)
        counts = series_of(samples, "tailsight_runqueue_wait_seconds_count")
        assert len(counts) <= 4 + 1
        assert (
            "tailsight_runqueue_wait_seconds_count",
            "cgroup=/steady",
            "probe=runqueue",
        ) in counts
        other = counts[("tailsight_runqueue_wait_seconds_count", "cgroup=other", "probe=runqueue")]
        assert other >= other_before
        other_before = other
        quantiles = series_of(samples, "tailsight_runqueue_wait_quantile_seconds")
        assert len({k[1] for k in quantiles}) <= 4 + 1
    # What the exporter remembers of each raw series stays bounded too: 401 came and went, 10
    # new ones an interval, remembered for at most 2 x FOLD_MAX_AGE intervals.
    assert len(exporter._folds) <= 1 + 10 * 2 * FOLD_MAX_AGE < 401


def test_window_quantiles_forget_old_intervals() -> None:
    rng = np.random.default_rng(9)
    slow = rng.integers(1_000_000, 2_000_000, 500)
    fast = rng.integers(1_000, 50_000, 500)
    exporter = PrometheusExporter(CollectorConfig(quantile_windows_s=(3.0,)))
    exporter.update(doc(0, {"/a": slow}))
    for t in range(1, 4):
        exporter.update(doc(t, {"/a": fast}))
        key = (
            "tailsight_runqueue_wait_quantile_seconds",
            "cgroup=/a",
            "probe=runqueue",
            "q=0.5",
            "window=3s",
        )
        in_window = np.concatenate([slow] * (t < 3) + [fast] * min(t, 3))
        expected = Histogram.from_samples(in_window).quantile(0.5)
        assert scrape(exporter)[key] * 1e9 == pytest.approx(expected)
        if t == 3:  # only fast samples left: numpy agrees within a bucket
            assert abs(expected - np.quantile(in_window, 0.5)) <= BUCKET_WIDTH_NS
    last = scrape(exporter)[
        (
            "tailsight_runqueue_wait_quantile_seconds",
            "cgroup=/a",
            "probe=runqueue",
            "q=0.999",
            "window=1s",
        )
    ]
    assert last * 1e9 == pytest.approx(Histogram.from_samples(fast).quantile(0.999))


def test_counters_exact_and_ns_become_seconds() -> None:
    def counters(t: int) -> list[Counter]:
        return [
            Counter("runqueue_dropped_events", {"probe": "runqueue", "reason": "hist_full"}, 3 + t),
            Counter(
                "runqueue_displaced_wait_ns",
                {"probe": "runqueue", "victim": "/v", "aggressor": "idle"},
                1_500_000_000,
            ),
            Counter("task_migrations", {"probe": "migration", "cgroup": "/v"}, 11),
        ]

    exporter = PrometheusExporter()
    for t in range(3):
        exporter.update(doc(t, {"/v": np.array([1000])}, counters(t)))
    samples = scrape(exporter)
    assert (
        samples[("tailsight_runqueue_dropped_events_total", "probe=runqueue", "reason=hist_full")]
        == 12
    )
    assert samples[
        (
            "tailsight_runqueue_displaced_wait_seconds_total",
            "aggressor=idle",
            "probe=runqueue",
            "victim=/v",
        )
    ] == pytest.approx(4.5)
    # Migration has no histograms: its counters rank its cgroups.
    assert (
        samples[("tailsight_migration_task_migrations_total", "cgroup=/v", "probe=migration")] == 33
    )


def test_names() -> None:
    assert metric_base("runqueue", {"cgroup": "/"}) == "tailsight_runqueue_wait"
    assert metric_base("tcpstate", {"kind": "connect"}) == "tailsight_tcpstate_connect"
    assert counter_metric("tcp_retransmits", "tcpstate") == (
        "tailsight_tcpstate_tcp_retransmits",
        1.0,
    )
    assert counter_metric("runqueue_x_ns", "runqueue") == ("tailsight_runqueue_x_seconds", 1e-9)
    assert [window_label(s) for s in (1.0, 60.0, 0.5)] == ["1s", "60s", "500ms"]


def test_tcpstate_kind_names_the_metric_and_is_not_a_label() -> None:
    exporter = PrometheusExporter()
    hist = Histogram.from_samples(np.array([100_000, 200_000]))
    labels = {"probe": "tcpstate", "cgroup": "/s", "kind": "connect", "port": "443"}
    exporter.update(HistDocument(T0_NS, T0_NS + SECOND_NS, [Series(labels, hist)], []))
    samples = scrape(exporter)
    assert (
        samples[
            ("tailsight_tcpstate_connect_seconds_count", "cgroup=/s", "port=443", "probe=tcpstate")
        ]
        == 2
    )


def _fdinfo(prog_fd: int) -> dict[str, int]:
    """The kernel's other account of a program's counters: ``/proc/self/fdinfo`` text."""
    text = Path(f"/proc/self/fdinfo/{prog_fd}").read_text(encoding="utf-8")
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {name: int(fields[name]) for name in ("run_time_ns", "run_cnt", "recursion_misses")}


@pytest.mark.kernel
def test_self_metrics_are_the_kernels_program_counters(kernel_ready: None) -> None:
    """A real program, loaded but attached nowhere, run exactly 13 times (BPF_PROG_TEST_RUN)
    with BPF stats on: the exporter's runs, run time and missed runs are the kernel's, as its
    fdinfo text also shows them; without --bpf-stats only the missed runs are exported."""
    from bcc import BPF

    bpf = BPF(src_file=str(features._NOOP_SOURCE).encode())
    try:
        prog_fd = bpf.load_func(features._NOOP_FUNCTION.encode(), BPF.RAW_TRACEPOINT).fd
        with features.enable_bpf_stats():
            for _ in range(13):
                prog_test_run_raw_tp(prog_fd, [0])
        kernel = _fdinfo(prog_fd)
        assert kernel["run_cnt"] == 13 and kernel["run_time_ns"] > 0
        probes = {
            "runqueue": ProbeStatus(
                True, program_fds={"sched_switch": prog_fd, "gone": 10**6}, mode="tp_btf"
            ),
            "tcpstate": ProbeStatus(False, reason="AttachError: inet_sock_set_state: EPERM"),
        }
        runs = ("tailsight_bpf_program_runs_total", "probe=runqueue", "program=sched_switch")
        run_time = (
            "tailsight_bpf_program_run_time_seconds_total",
            "probe=runqueue",
            "program=sched_switch",
        )
        missed = (
            "tailsight_bpf_program_missed_runs_total",
            "probe=runqueue",
            "program=sched_switch",
        )
        # Without --bpf-stats the kernel counts no runs: only the missed ones are exported.
        without_stats = PrometheusExporter()
        without_stats.probes = probes
        samples = scrape(without_stats)
        assert runs not in samples
        assert samples[missed] == kernel["recursion_misses"] == 0
        exporter = PrometheusExporter()
        exporter.probes = probes
        exporter.bpf_stats_enabled = True
        samples = scrape(exporter)
        assert samples[runs] == 13
        assert samples[run_time] == pytest.approx(kernel["run_time_ns"] / 1e9)
        assert samples[missed] == 0
        gone = ("tailsight_bpf_program_runs_total", "probe=runqueue", "program=gone")
        assert gone not in samples  # no such fd: left out, the scrape goes on
    finally:
        bpf.cleanup()
    attached = ("tailsight_probe_attached", "mode=tp_btf", "probe=runqueue", "reason=")
    assert samples[attached] == 1
    reason = "reason=AttachError: inet_sock_set_state: EPERM"
    assert samples[("tailsight_probe_attached", "mode=", "probe=tcpstate", reason)] == 0
    assert not math.isnan(samples[("tailsight_scrape_duration_seconds",)])


def test_cpu_self_metric_is_the_kernels_count_of_the_agent_and_its_symbolizer() -> None:
    """The agent's CPU and its symbolizer helper's, as the kernel counts them in
    /proc/<pid>/stat (clock ticks), after the helper named a frame of a real process."""
    import os
    import sys

    def kernel_cpu_s(pid: int | str) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    target = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE
    )
    try:
        maps = Path(f"/proc/{target.pid}/maps").read_text().splitlines()
        code = next(line for line in maps if " r-xp " in line and line.split()[4] != "0")
        symbolizer = shared_symbolizer()
        symbolizer.resolve(target.pid, [int(code.split("-")[0], 16)])
        assert symbolizer.helper_pid is not None  # asked: a helper was started
        while kernel_cpu_s("self") < 0.2:  # this process's share, well above a tick
            sum(range(10_000))
        samples = scrape(PrometheusExporter())
        agent = samples[("tailsight_cpu_seconds_total", "process=agent")]
        helper = samples[("tailsight_cpu_seconds_total", "process=symbolizer")]
        assert agent == pytest.approx(kernel_cpu_s("self"), abs=0.05)
        assert helper == pytest.approx(kernel_cpu_s(symbolizer.helper_pid), abs=0.02)
        assert helper > 0  # it imported bcc and read the interpreter's symbols
    finally:
        target.communicate(b"\n")


def test_stack_labels_are_summed_away() -> None:
    counters = [
        Counter(
            "runqueue_outlier_events",
            {"probe": "runqueue", "cgroup": "/v", "kernel_stack": f"k{n}", "user_stack": "u"},
            n + 1,
        )
        for n in range(50)
    ]
    exporter = PrometheusExporter()
    exporter.update(doc(0, {"/v": np.array([1000])}, counters))
    outliers = series_of(scrape(exporter), "tailsight_runqueue_outlier_events_total")
    assert outliers == {
        ("tailsight_runqueue_outlier_events_total", "cgroup=/v", "probe=runqueue"): sum(
            range(1, 51)
        )
    }


def test_torn_sum_interval_survives_window_expiry() -> None:
    """5 samples, then count 0 with sum 7,000 ns (a torn sum Snapshot.delta keeps),
    then empty intervals past the 60 s ranking and quantile window: no KeyError, and the series
    leaves the windows exactly when its last interval does."""
    exporter = PrometheusExporter(CollectorConfig(quantile_windows_s=(60.0,)))
    labels = {"probe": "netsyscall", "cgroup": "/"}
    samples = np.array([1_000, 2_000, 3_000, 4_000, 5_000])
    torn = Histogram(np.zeros_like(Histogram.empty().counts), sum_ns=7_000)
    first = HistDocument(
        T0_NS, T0_NS + SECOND_NS, [Series(labels, Histogram.from_samples(samples))]
    )
    exporter.update(first)
    exporter.update(HistDocument(T0_NS + SECOND_NS, T0_NS + 2 * SECOND_NS, [Series(labels, torn)]))
    key = ("cgroup=/", "probe=netsyscall")
    after_two = scrape(exporter)
    assert after_two[("tailsight_netsyscall_syscall_seconds_count", *key)] == 5
    assert after_two[("tailsight_netsyscall_syscall_seconds_sum", *key)] == pytest.approx(22e-6)
    for t in range(2, 64):
        exporter.update(HistDocument(T0_NS + t * SECOND_NS, T0_NS + (t + 1) * SECOND_NS))
        quantiles = series_of(scrape(exporter), "tailsight_netsyscall_syscall_quantile_seconds")
        windowed = [k for k in quantiles if "window=60s" in k]
        # The first interval (ends at 1 s) is in a 60 s window until an interval ends at 61 s.
        assert bool(windowed) == (t + 1 < 61), t
        # Ranked by the same window: "/" keeps its label while its 5 samples are in it.
        assert exporter.kept_cgroups("netsyscall") == ({"/"} if t + 1 < 61 else set()), t
    assert exporter.intervals == 64


def test_exposition_passes_promtool(tmp_path: Path) -> None:
    """Prometheus' own linter accepts every family: histograms, quantile gauges
    (their label is not the summaries' reserved "quantile"), counters and self-metrics."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool (Debian's prometheus package) is not installed"
    exporter = PrometheusExporter(CollectorConfig(quantile_windows_s=(5.0, 60.0)))
    exporter.probes = {"runqueue": ProbeStatus(attached=True), "tcpstate": ProbeStatus(False)}
    rng = np.random.default_rng(3)
    for t in range(3):
        document = doc(t, {f"/c{i}": rng.integers(0, 10**7, 50) for i in range(5)})
        document.series.append(
            Series(
                {"probe": "tcpstate", "cgroup": "/c1", "kind": "connect"},
                Histogram.from_samples(rng.integers(0, 10**6, 20)),
            )
        )
        labels = {"probe": "runqueue", "victim": "/c1", "aggressor": "/c2"}
        document.counters.append(Counter("runqueue_displaced_wait_ns", labels, 1000))
        exporter.update(document)
    text = exporter.exposition()
    assert b"_quantile_seconds{" in text and b'q="0.99"' in text
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.strip() == b"" and result.stderr.strip() == b""


def test_exposition_rendered_once_per_generation() -> None:
    exporter = PrometheusExporter()
    first = exporter.exposition()
    assert exporter.exposition() is first and exporter.renders == 1
    exporter.update(doc(0, {"/a": np.arange(1, 10) * 1000}))
    second = exporter.exposition()
    assert second is not first and exporter.exposition() is second and exporter.renders == 2
    # Counts as integers, as Go's client writes them (prometheus-client writes 9.0).
    assert b'tailsight_runqueue_wait_seconds_count{cgroup="/a",probe="runqueue"} 9\n' in second


def test_rendered_text_equals_prometheus_client_rendering_of_the_same_families() -> None:
    """The served text (own renderer) and prometheus-client's generate_latest over collect()
    carry the same samples, label escaping included."""
    exporter = PrometheusExporter(CollectorConfig(top_k=2, quantile_windows_s=(3.0,)))
    exporter.probes = {"runqueue": ProbeStatus(False, reason='no "BTF"\\ here\nat all')}
    rng = np.random.default_rng(11)
    odd = '/a "quoted"\\path\nwith newline'
    for t in range(4):
        per_cgroup = {c: rng.integers(0, 10**8, 30) for c in ("/x", "/y", "/z", odd)}
        labels = {"probe": "runqueue", "victim": odd, "aggressor": "/x"}
        exporter.update(doc(t, per_cgroup, [Counter("runqueue_displaced_wait_ns", labels, 7)]))
    ours = parse(exporter.exposition().decode())
    theirs = parse(generate_latest(exporter.register()).decode())
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        if key[0] not in (  # the two renders differ in these alone
            "tailsight_scrape_duration_seconds",
            "tailsight_exposition_renders_total",
            "tailsight_cpu_seconds_total",
        ):
            assert value == pytest.approx(theirs[key], rel=1e-12), key
    assert any(odd in part for key in ours for part in key)


_LABEL_TEXT = st.text(alphabet='ab%"\\\n {}=,', max_size=6)  # format and escape characters
_VALUE = st.floats(allow_nan=True, allow_infinity=True) | st.integers(0, 10**9).map(float)


@st.composite
def _families(draw: st.DrawFn, rounds: int) -> list[list[Family]]:
    """Families of gauges, counters and 4-sample "q" gauges, with the same series in every
    round and new values each time; each round may add series of its own."""
    specs = draw(st.lists(st.sampled_from(["gauge", "counter", "q"]), min_size=1, max_size=3))
    out: list[list[Family]] = [[] for _ in range(rounds)]
    for n, kind in enumerate(specs):
        name = f"tailsight_t{n}"
        shape = tuple((name, ("q", q)) for q in ("0.5", "0.9", "0.99", "0.999"))
        width = len(shape) if kind == "q" else 1
        kept = draw(st.lists(_LABEL_TEXT, max_size=4, unique=True))
        for round_families in out:
            family = Family(
                name, "gauge" if kind == "q" else kind, "help %s\\ \n", shape if kind == "q" else ()
            )
            fresh = draw(st.lists(_LABEL_TEXT, max_size=2, unique=True))
            for value in dict.fromkeys([*kept, *fresh]):
                values = tuple(draw(st.lists(_VALUE, min_size=width, max_size=width)))
                family.series.append(((("a", value), ("b", "x%d")), values))
            round_families.append(family)
    return out


@settings(max_examples=80, deadline=None)
@given(_families(rounds=3))
def test_text_templates_kept_between_renders_give_prometheus_clients_text(
    rounds: list[list[Family]],
) -> None:
    """Each render fills the series' kept templates with new values: every render parses to the
    samples prometheus-client writes for the same families ('%', escapes, inf and NaN
    included)."""
    exporter = PrometheusExporter()
    shown: list[list[Family]] = [[]]
    exporter.extra_families.append(lambda: shown[0])
    registry = exporter.register()
    for families in rounds:
        shown[0] = families
        exporter.changed()
        text = exporter.exposition().decode()
        ours = parse(text)
        theirs = parse(generate_latest(registry).decode())
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            if key[0].startswith("tailsight_t"):
                assert value == theirs[key] or (math.isnan(value) and math.isnan(theirs[key])), key
        # The format's own spelling of the special values (Python's repr would write inf, nan).
        written = {line.rsplit(" ", 1)[1] for line in text.splitlines() if line[0] != "#"}
        assert not written & {"inf", "-inf", "nan"}
        assert sum(key[0].startswith("tailsight_t") for key in ours) == sum(
            len(f.series) * len(f.shape) for f in families
        )


def test_window_quantiles_match_histogram_quantiles_exactly() -> None:
    """The exporter's sparse quantile rule against Histogram.quantiles on the merged window,
    "other" (several cgroups summed) and overflow included."""
    exporter = PrometheusExporter(CollectorConfig(top_k=1, quantile_windows_s=(5.0,)))
    rng = np.random.default_rng(5)
    merged: dict[str, Histogram] = {}
    for t in range(3):
        per_cgroup = {
            "/big": rng.integers(0, 10**6, 400),
            "/b": np.concatenate([rng.integers(0, 10**5, 20), [10**11]]),  # 10**11 overflows
            "/c": rng.integers(10**4, 10**7, 30),
        }
        exporter.update(doc(t, per_cgroup))
        for cgroup, values in per_cgroup.items():
            name = cgroup if cgroup == "/big" else "other"
            merged[name] = merged.get(name, Histogram.empty()).merge(Histogram.from_samples(values))
    samples = scrape(exporter)
    qs = (0.5, 0.9, 0.99, 0.999)
    for cgroup, hist in merged.items():
        for q, expected in zip(qs, hist.quantiles(qs), strict=True):
            key = (
                "tailsight_runqueue_wait_quantile_seconds",
                f"cgroup={cgroup}",
                "probe=runqueue",
                f"q={q}",
                "window=5s",
            )
            assert samples[key] * 1e9 == pytest.approx(expected, rel=1e-12), key


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.lists(st.integers(0, 3 * 10**10), max_size=40),  # > 10.49 s overflows
                st.booleans(),  # a row of the window's block, else an interval's sparse part
            ),
            max_size=4,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_sparse_quantiles_equal_histogram_quantiles(groups: list) -> None:
    """The exporter's quantiles of groups of parts (sparse ones, as the 1 s gauge hands them
    over, and rows of a block, as the window's sums) are exactly those of the merged Histogram
    (the model's own rule), empty and overflow-only groups included."""
    qs = (0.0, 0.5, 0.9, 0.99, 0.999, 1.0)
    merge = _Merge()
    expected = []
    for group, parts in enumerate(groups):
        hists = [(Histogram.from_samples(np.array(v, dtype=np.int64)), row) for v, row in parts]
        sparse = [SparseHistogram.of(h) for h, row in hists if not row]
        merge.add_sparse([group] * len(sparse), sparse)
        rows = [[*h.counts, h.overflow] for h, row in hists if row]
        merge.add_rows(
            np.full(len(rows), group), np.array(rows, dtype=np.int64).reshape(-1, HIST_ROW)
        )
        merged = sum((h for h, _ in hists), Histogram.empty())
        expected.append(merged.quantiles(qs) if merged.count else None)
    assert merge.quantiles_ns(len(groups), qs) == expected


@settings(max_examples=40, deadline=None)
# grows, shrinks after churn, then takes new series
@example([{k: [k * 1_000] for k in range(150)}, *[{7: [5]}] * 4, {k: [k] for k in range(60)}])
@given(
    st.lists(
        st.dictionaries(
            st.integers(0, 150),  # series: more than a first block holds, then churn
            st.lists(st.integers(0, 3 * 10**10), min_size=1, max_size=5),  # > 10.49 s: overflow
            max_size=120,
        ),
        min_size=1,
        max_size=12,
    )
)
def test_window_rows_hold_the_sums_of_the_parts_in_its_span(intervals: list) -> None:
    """After each interval, every series' row is the naive sum of its parts in the last three
    intervals, and no other row holds a count: as the block grows, rows are reused after
    series leave, and it shrinks after churn."""
    window = _Window(3.0)
    parts_by_interval = []
    for n, interval in enumerate(intervals):
        parts = {
            (("cgroup", f"/c{key}"),): SparseHistogram.of(Histogram.from_samples(values))
            for key, values in interval.items()
        }
        parts_by_interval.append(parts)
        window.add(T0_NS + n * SECOND_NS, parts)
        expected: dict[tuple, Histogram] = {}
        for held in parts_by_interval[-3:]:
            for key, part in held.items():
                expected.setdefault(key, Histogram.empty()).add(part.dense())
        assert set(window.row_of) == set(expected)
        for key, hist in expected.items():
            row = window.rows[window.row_of[key]]
            assert row[:-1].tolist() == hist.counts.tolist() and row[-1] == hist.overflow
        others = np.ones(len(window.rows), dtype=bool)
        others[list(window.row_of.values())] = False
        assert not window.rows[others].any()
        assert len(window.rows) <= max(64, 4 * len(window.row_of))


@pytest.mark.parametrize("with_histograms", [False, True])
def test_pairs_folded_as_arrays_export_what_the_counters_one_by_one_do(
    with_histograms: bool,
) -> None:
    """Interval documents whose victim x aggressor pairs stay arrays (``CounterPairs``, as
    ``Snapshot.to_document`` hands them on) and the same documents made into counters first:
    the runqueue families exported, the top-K and the live verdicts' displaced waits agree,
    interval by interval, while the top-K changes (two places, cgroups that take turns), ids
    come and go, two ids share a path and one has none. Without histograms the top-K ranks by
    the pairs' switches; with them, by the histograms."""
    names = ("runqueue_displaced_wait_ns", "runqueue_displaced_switches")
    paths = {10: "/a", 11: "/b", 12: "/c", 13: "/d", 14: "/e", 15: "/e"}  # 16: unknown

    def name(wanted: object) -> dict[int, str]:
        return {i: paths[i] for i in wanted if i in paths}  # type: ignore[attr-defined]

    rng = np.random.default_rng(7)
    cumulative: dict[tuple[int, int], np.ndarray] = {}
    config = CollectorConfig(top_k=2, quantile_windows_s=(5.0,))  # ranks over 5 s
    exporters = [PrometheusExporter(config) for _ in range(2)]
    verdicts = [JumpVerdicts() for _ in range(2)]
    previous: Snapshot | None = None
    top_ks = set()
    for t in range(40):
        ids = [0, *sorted(rng.choice([10, 11, 12, 13, 14, 15, 16], size=5, replace=False))]
        busy = 10 + (t // 8) % 7  # the cgroup that waits and displaces most, in turn
        matrix = np.zeros((len(ids), len(ids), 2), dtype=np.uint64)
        for v, victim in enumerate(ids):
            for a, aggressor in enumerate(ids):
                cell = cumulative.setdefault((victim, aggressor), np.zeros(2, dtype=np.uint64))
                if rng.random() < 0.7:
                    switches = int(rng.integers(0, 3)) * (50 if busy in (victim, aggressor) else 1)
                    cell += np.array([switches * int(rng.integers(0, 5000)), switches], np.uint64)
                matrix[v, a] = cell
        others = {("runqueue_dropped_events", labels(reason="hist_full")): t}
        pairs = PairCounters(others, names, tuple(ids), matrix, present=1)
        now = Snapshot("runqueue", T0_NS + t * SECOND_NS, {}, pairs)
        if previous is not None:
            interval = now - previous
            as_arrays = interval.to_document(previous.taken_ns, name)
            as_counters = interval.to_document(previous.taken_ns, name)
            as_counters.counters = list(as_counters.counters)
            if with_histograms:
                for path in sorted(set(paths.values())):
                    heavy = paths.get(busy) == path
                    samples = rng.integers(0, 10**6, 200 if heavy else 5)
                    series = Series(
                        {"probe": "runqueue", "cgroup": path}, Histogram.from_samples(samples)
                    )
                    as_arrays.series.append(series)
                    as_counters.series.append(series)
            assert not isinstance(as_arrays.counter_parts()[0], list)
            for fed, exporter, verdict in zip(
                (as_arrays, as_counters), exporters, verdicts, strict=True
            ):
                verdict.update(fed)
                exporter.update(fed)
            assert not isinstance(as_arrays.counter_parts()[0], list)  # nobody made counters
            texts = [
                render_text(f for f in e.families() if f.name.startswith("tailsight_runqueue"))
                for e in exporters
            ]
            assert texts[0] == texts[1], t
            assert b'aggressor="other"' in texts[0]
            kept = exporters[0].kept_cgroups("runqueue")
            assert kept == exporters[1].kept_cgroups("runqueue")
            top_ks.add(frozenset(kept))
            assert list(verdicts[0]._displaced) == list(verdicts[1]._displaced)
        previous = now
    assert len(top_ks) >= 3  # the top-K changed: series folded into "other" and back out
