"""The inference stage: features rendered from a real book, the staleness bound as the strategy
sees it, and the real SmolLM2-135M model (both local runtimes, the worker process and its
cgroup, an OpenAI-compatible llama.cpp server started here). No model is mocked."""

from __future__ import annotations

import importlib.util
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailsight.trading_core.book import Book, TopOfBook
from tailsight.trading_core.components import remove_cgroup_tree
from tailsight.trading_core.inference.features import (
    LABELS,
    BookFeatures,
    RecentTrades,
    features_from_book,
    imbalance,
    render,
)
from tailsight.trading_core.inference.runtime import (
    InferenceError,
    embedded_gguf,
    load_runtime,
)
from tailsight.trading_core.inference.stage import (
    STAGES,
    BookSignalSource,
    BoundedSignalHook,
    InferenceConfig,
    InferenceStage,
    classify,
    inference_cgroup,
)
from tailsight.trading_core.strategy import IOC, RiskLimits, Strategy, StrategyConfig
from tests.trading_core.test_strategy import SYMBOLS, FakeSink

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
# `make setup` installs llama-cpp-python: in CI (TAILSIGHT_REQUIRE_KERNEL=1) its absence fails
# the llama.cpp and remote-server tests instead of skipping them (tests/conftest.py's rule).
REQUIRE_LLAMA_CPP = os.environ.get("TAILSIGHT_REQUIRE_KERNEL") == "1"


def _need_llama_cpp() -> None:
    """Skip without llama-cpp-python; fail where the machine is expected to have it."""
    if HAS_LLAMA_CPP:
        return
    reason = "llama-cpp-python not installed (make setup installs it)"
    if REQUIRE_LLAMA_CPP:
        pytest.fail(f"{reason}; required under TAILSIGHT_REQUIRE_KERNEL=1")
    pytest.skip(reason)


FEATURES = BookFeatures(
    "ACME",
    ((1_874_000, 900, 4), (1_873_900, 300, 2)),
    ((1_874_200, 100, 1), (1_874_300, 700, 3)),
    (("B", 1_874_200, 100), ("S", 1_874_000, 50)),
)


def test_features_from_a_real_book_render_levels_imbalance_and_trades() -> None:
    book = Book()
    book.symbols[7] = "ACME"
    book.add(7, 1, "B", 1_874_000, 500)
    book.add(7, 2, "B", 1_874_000, 400)
    book.add(7, 3, "B", 1_873_900, 300)
    book.add(7, 4, "S", 1_874_200, 100)
    book.add(7, 5, "S", 1_874_300, 700)
    book.add(7, 6, "S", 1_874_400, 10)  # beyond two levels: left out
    trades = RecentTrades(n=2)
    trade = book.execute(4, 100, match_number=42)  # the whole best ask: a buyer lifted it
    assert trade is not None
    trades.add(trade)
    features = features_from_book(book, 7, trades, levels=2)
    assert features.bids == ((1_874_000, 900, 2), (1_873_900, 300, 1))
    assert features.asks == ((1_874_300, 700, 1), (1_874_400, 10, 1))
    assert features.trades == (("B", 1_874_200, 100),)
    assert imbalance(features) == pytest.approx((900 - 700) / 1600)
    assert render(features) == (
        "ACME bid 187.40x900(2) 187.39x300(1) | ask 187.43x700(1) 187.44x10(1) | "
        "imbalance +0.12 | trades B100@187.42"
    )


def test_classify_is_the_argmax_and_buy_minus_sell() -> None:
    label, value, probs = classify((2.0, 0.0, 1.0))
    total = math.exp(2) + 1 + math.exp(1)
    assert label == "buy"
    assert probs == pytest.approx((math.exp(2) / total, 1 / total, math.exp(1) / total))
    assert value == pytest.approx((math.exp(2) - 1) / total)
    assert classify((0.0, 0.0, 5.0))[0] == "hold"
    assert classify((-math.inf, 0.0, -math.inf))[:2] == ("sell", -1.0)


def _strategy(hook: BoundedSignalHook) -> tuple[Strategy, FakeSink]:
    sink = FakeSink()
    config = StrategyConfig(take_threshold=0.8, take_cooldown_events=1)
    return Strategy(sink, SYMBOLS, config, RiskLimits(max_position_shares=10_000), hook), sink


def test_the_strategy_ignores_a_signal_older_than_the_bound() -> None:
    balanced = TopOfBook(100_000, 500, 100_100, 500)  # imbalance 0: only a signal can take
    hook = BoundedSignalHook(max_age_ns=10_000_000)
    strategy, sink = _strategy(hook)
    hook.publish(1, -0.9, time.perf_counter_ns() - 20_000_000)  # 20 ms old: stale
    strategy.on_book(1, balanced)
    assert [e for e in sink.log if e[-1] == IOC] == []
    assert (hook.stale, hook.fresh, hook.ages.count) == (1, 0, 1)
    assert hook.ages.quantile(1.0) >= 20_000_000
    hook.publish(1, -0.9, time.perf_counter_ns())  # fresh: the strategy sells on it
    strategy.on_book(1, balanced)
    assert [e[3] for e in sink.log if e[-1] == IOC] == ["S"]
    assert (hook.stale, hook.fresh, hook.ages.count) == (1, 1, 2)
    with pytest.raises(ValueError, match="max_age_ns"):
        BoundedSignalHook(0)


def test_bad_models_are_clear_errors() -> None:
    with pytest.raises(InferenceError, match="no such model"):
        load_runtime("/nonexistent/model.gguf")
    with pytest.raises(InferenceError, match="must be GGUF"):
        load_runtime(__file__)
    with pytest.raises(InferenceError, match="no config"):
        load_runtime(str(Path(__file__).parent))
    with pytest.raises(InferenceError, match="unknown runtime"):
        load_runtime(runtime="onnx")
    with pytest.raises(InferenceError, match="not an http"):
        load_runtime("http://")
    stage = InferenceStage(InferenceConfig(model="/nonexistent/model.gguf"))
    with pytest.raises(InferenceError, match="no such model"):
        stage.start()
    assert stage.pid == 0  # the worker is gone


# ------------------------------------------------------------------ the real model


@pytest.fixture(scope="module", params=["llama.cpp", "transformers"])
def runtime(request: pytest.FixtureRequest) -> Iterator[object]:
    if request.param == "llama.cpp":
        _need_llama_cpp()
    loaded = load_runtime(runtime=request.param, threads=2)
    yield loaded
    loaded.close()


@pytest.mark.slow
def test_the_real_model_answers_one_of_three_signals_deterministically(runtime) -> None:  # type: ignore[no-untyped-def]
    assert runtime.model == "SmolLM2-135M-Instruct.Q4_1"
    prompt = runtime.render(render(FEATURES))
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    first = runtime.score(prompt)
    again = runtime.score(prompt)
    assert first.logits == again.logits  # no sampling: bit-identical for a fixed prompt
    assert first.prompt_tokens == len(runtime.tokenize(prompt)) > 50
    label, value, probs = classify(first.logits)
    assert label in LABELS and -1.0 <= value <= 1.0 and sum(probs) == pytest.approx(1.0)
    assert all(math.isfinite(x) for x in first.logits)


@pytest.mark.slow
def test_both_runtimes_agree_on_the_signal() -> None:
    """llama.cpp's quantized kernels and torch on de-quantized weights: two implementations."""
    _need_llama_cpp()
    prompt_user = render(FEATURES)
    answers = {}
    for name in ("llama.cpp", "transformers"):
        loaded = load_runtime(runtime=name, threads=2)
        answers[name] = loaded.score(loaded.render(prompt_user))
        loaded.close()
    a, b = answers["llama.cpp"], answers["transformers"]
    assert a.prompt_tokens == b.prompt_tokens
    assert classify(a.logits)[0] == classify(b.logits)[0]
    assert a.logits == pytest.approx(b.logits, abs=1.0)


def _in_cgroup(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text().strip().rsplit(":", 1)[-1]


@pytest.mark.slow
def test_the_stage_runs_in_its_own_process_and_cgroup_and_times_every_request() -> None:
    cgroup = None
    if os.geteuid() == 0:
        cgroup = inference_cgroup("tailsight-test-inference")
    hook = BoundedSignalHook(max_age_ns=60_000_000_000)
    try:
        with InferenceStage(InferenceConfig(threads=2), hook, cgroup) as stage:
            assert stage.pid != os.getpid() and stage.alive()
            if cgroup is not None:
                assert _in_cgroup(stage.pid).endswith("/tailsight-test-inference/inference")
            assert stage.model == "SmolLM2-135M-Instruct.Q4_1"
            n = 4
            for i in range(n):
                assert stage.submit(100 + i, FEATURES._replace(symbol=f"S{i}"))
                assert stage.wait(i + 1, timeout_s=60)
            assert stage.counts == {"requests": n, "dropped": 0, "superseded": 0, "results": n}
            for name in STAGES[:3]:
                assert stage.hists[name].count == n, name
            assert stage.hists["inference_prefill"].quantile(0.5) > 0
            for i in range(n):
                signal = hook.latest(100 + i)
                assert signal is not None and signal.value == stage.last[100 + i].value
            series = stage.series({"probe": "replay"})
            assert {s.labels["stage"] for s in series} == set(STAGES)
            assert all(s.labels["model"] == "SmolLM2-135M-Instruct.Q4_1" for s in series)
            age = next(s for s in series if s.labels["stage"] == "signal_age")
            assert age.hist.count == n  # the n reads above
            # A burst for one symbol while the worker is busy: stale requests are superseded.
            for _ in range(6):
                stage.submit(1, FEATURES)
            assert stage.wait(n + 1, timeout_s=60)
            stage.wait(n + 6, timeout_s=30)
            counts = stage.counts
            assert counts["results"] + counts["superseded"] == n + 6
            assert counts["superseded"] >= 1
            assert stage.hists["inference_prefill"].count == counts["results"]
            # From a live book: on top changes only, at most once per interval per symbol.
            book = Book()
            book.symbols[9] = "ACME"
            book.add(9, 1, "B", 1_874_000, 500)
            book.add(9, 2, "S", 1_874_200, 100)
            source = BookSignalSource(stage, book, min_interval_ns=1_000_000_000)
            before = stage.counts["requests"]
            t0 = time.perf_counter_ns()
            sent = [
                source.on_update(9, True, now_ns=t0),
                source.on_update(9, True, now_ns=t0 + 1),  # too soon
                source.on_update(9, False, now_ns=t0 + 2_000_000_000),  # top unchanged
                source.on_update(9, True, now_ns=t0 + 1_000_000_000),
            ]
            assert sent == [True, False, False, True]
            assert stage.counts["requests"] == before + 2
            assert stage.wait(stage.counts["results"] + 1)
            assert stage.last[9].features_ns in (t0, t0 + 1_000_000_000)
    finally:
        if cgroup is not None:
            remove_cgroup_tree(cgroup.parent)


# ------------------------------------------------------------------ remote (OpenAI-compatible)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _need_llama_cpp()
    port = _free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_gguf()),
        "--host", "127.0.0.1", "--port", str(port), "--n_threads", "2", "--n_ctx", "1024",
        "--logits_all", "true", "--model_alias", "smollm2",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("llama-server") / "stderr"
    # To a file, not a pipe: the server logs enough to fill an unread pipe and block.
    with log.open("wb") as err:  # the server keeps its own copy of the descriptor
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"llama_cpp.server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.slow
def test_remote_backend_against_a_real_llama_cpp_server(llama_server: str) -> None:
    remote = load_runtime(llama_server)
    assert remote.model == "smollm2"  # the server's own model list
    first = remote.score(render(FEATURES))
    again = remote.score(render(FEATURES))
    assert first.logits == pytest.approx(again.logits, abs=1e-3)
    assert first.prompt_tokens > 50
    label, _, probs = classify(first.logits)
    assert label in LABELS and sum(probs) == pytest.approx(1.0)
    # The server runs the same engine on the same file: the same answer as the local runtime.
    local = load_runtime(runtime="llama.cpp", threads=2)
    expected = local.score(local.render(render(FEATURES)))
    local.close()
    assert label == classify(expected.logits)[0]
    assert first.prompt_tokens == expected.prompt_tokens
    # Same log-odds between the labels the server ranked in its top 20; a label outside it
    # reads -inf there and must be an unlikely one here.
    local_probs = classify(expected.logits)[2]
    ranked = [i for i in range(3) if math.isfinite(first.logits[i])]
    assert ranked
    for i in ranked:
        for j in ranked:
            remote_odds = first.logits[i] - first.logits[j]
            assert remote_odds == pytest.approx(expected.logits[i] - expected.logits[j], abs=0.25)
    assert all(local_probs[i] < 0.1 for i in range(3) if i not in ranked)
    remote.close()


@pytest.mark.slow
def test_the_stage_with_a_remote_model_labels_its_series(llama_server: str) -> None:
    with InferenceStage(InferenceConfig(model=llama_server)) as stage:
        assert (stage.model, stage.runtime, stage.device) == ("smollm2", "openai", "remote")
        for i in range(3):
            stage.submit(i, FEATURES)
            assert stage.wait(i + 1)
        assert stage.hists["inference_prefill"].count == 3
        assert {s.labels["runtime"] for s in stage.series({})} == {"openai"}


def test_a_dead_server_is_a_clear_error() -> None:
    with pytest.raises(InferenceError, match=r"127\.0\.0\.1"):
        load_runtime(f"http://127.0.0.1:{_free_port()}/v1")


# ------------------------------------------------------------------ the GPU device script

GPU_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_inference.py"


def _gpu_script() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_inference", GPU_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_script_parses_its_options_and_builds_a_llama_3_8b_shape() -> None:
    """What can be checked of the device script without a GPU: its options, and that its
    randomly initialised model has Llama-3-8B's exact parameter count (on the meta device: no
    memory, no weights), built in bf16 directly."""
    import torch

    script = _gpu_script()
    assert script.parse_args([]).compile == ["eager", "default"]
    assert script.parse_args(["--smoke"]).compile == ["eager"]
    assert script.parse_args(["--compile", "reduce-overhead"]).compile == ["reduce-overhead"]
    with pytest.raises(SystemExit):
        script.parse_args(["--repeats", "1"])
    net = script.random_llama(script.LLAMA3_8B, "meta", torch.bfloat16)
    assert sum(p.numel() for p in net.parameters()) == script.LLAMA3_8B_PARAMETERS
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}


@pytest.mark.slow
def test_the_gpu_script_runs_its_smoke_mode_on_the_cpu() -> None:
    done = subprocess.run(
        [sys.executable, str(GPU_SCRIPT), "--smoke", "--repeats", "3"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("tiny-llama")]
    assert [row[-3] for row in rows] == ["1", "8"]  # batch 1 and 8, P50 and P99 after it
    assert all(0 < float(row[-2]) <= float(row[-1]) for row in rows)
