"""The inference stage: a model in its own process (and cgroup), off the trading fast path.

``submit`` copies a symbol's ``BookFeatures`` to the worker over an AF_UNIX SOCK_SEQPACKET
socket and returns at once (a full socket drops the request: the fast path never waits). The
worker drains its socket and scores only the newest request per symbol (older ones are
superseded: a signal about a book that has moved on is worth nothing), then answers with the
label probabilities and its timings. Answers are published into the strategy's ``SignalHook``
stamped with the *features'* time, so the strategy's staleness bound measures the age of the
book state the signal is about. Stage latencies are ``Histogram``s, like ``timing.StageTimer``:

* ``inference_queue_wait``: submit to the worker starting on it;
* ``inference_prefill``: the forward pass over the prompt (the signal's whole model cost);
* ``inference_decode``: reading the label logits into a signal (no token is generated);
* ``signal_age`` (kept by ``SignalHook``): the signal's age when the strategy decides.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, NamedTuple

from tailsight.cgroups import find_cgroup2_mount, own_cgroup_path
from tailsight.hist import Histogram
from tailsight.intervals import Counter, Series
from tailsight.trading_core.book import Book, TradeEvent
from tailsight.trading_core.components import BASE_CGROUP, cgroup_dir, join_cgroup
from tailsight.trading_core.inference.features import (
    LABELS,
    BookFeatures,
    RecentTrades,
    features_from_book,
    render,
)
from tailsight.trading_core.inference.runtime import (
    DEFAULT_MODEL,
    InferenceError,
    load_runtime,
    softmax,
)
from tailsight.trading_core.strategy import Signal, SignalHook

__all__ = [
    "STAGES",
    "BookSignalSource",
    "BoundedSignalHook",
    "InferenceConfig",
    "InferenceStage",
    "Result",
    "inference_cgroup",
    "sibling_cgroup",
]

QUEUE_WAIT: Final = "inference_queue_wait"
PREFILL: Final = "inference_prefill"
DECODE: Final = "inference_decode"
SIGNAL_AGE: Final = "signal_age"
STAGES: Final = (QUEUE_WAIT, PREFILL, DECODE, SIGNAL_AGE)
_PR_SET_PDEATHSIG: Final = 1


@dataclass(frozen=True)
class InferenceConfig:
    model: str = DEFAULT_MODEL  # "smollm2", a GGUF path, an HF directory, an http(s) URL
    runtime: str = "auto"  # auto (fastest installed), llama.cpp, transformers
    threads: int | None = 1  # one core: the stage must not starve the feed
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu
    load_timeout_s: float = 120.0


class Result(NamedTuple):
    locate: int
    label: str
    value: float  # P(buy) - P(sell) over the three labels, in [-1, 1]
    probs: tuple[float, float, float]
    features_ns: int  # when the features were taken (submit time)
    queue_wait_ns: int
    prefill_ns: int
    decode_ns: int
    done_ns: int
    prompt_tokens: int


class BoundedSignalHook(SignalHook):
    """A ``SignalHook`` whose ``latest`` ignores a signal older than ``max_age_ns``.

    ``Strategy`` reads the hook when it decides; each read of an existing signal records its
    age in ``ages`` (the ``signal_age`` series), and a stale one counts in ``stale`` and reads
    as no signal, so a stalled or slow model cannot steer orders with an old book's view.
    """

    # 2 s: sized for the CPU default (SmolLM2 at one thread, ~1.2 s a signal here); a GPU
    # server's signal would warrant milliseconds.
    def __init__(self, max_age_ns: int = 2_000_000_000) -> None:
        if max_age_ns <= 0:
            raise ValueError(f"max_age_ns must be > 0, got {max_age_ns}")
        super().__init__()
        self.max_age_ns = max_age_ns
        self.ages = Histogram.empty()
        self.stale = 0
        self.fresh = 0

    def latest(self, locate: int, now_ns: int | None = None) -> Signal | None:
        signal = super().latest(locate)
        if signal is None:
            return None
        age = (time.perf_counter_ns() if now_ns is None else now_ns) - signal.timestamp_ns
        with self._lock:
            self.ages.record(max(age, 0))
            if age > self.max_age_ns:
                self.stale += 1
                return None
            self.fresh += 1
        return signal


def sibling_cgroup(name: str = "inference") -> Path:
    """``name`` beside the calling process's own cgroup (created): a component that places
    the stage next to itself, e.g. ``…/trading`` → ``…/inference``."""
    directory = (find_cgroup2_mount() / own_cgroup_path().strip("/")).parent / name
    directory.mkdir(exist_ok=True)
    return directory


def inference_cgroup(base: str | None = None) -> Path:
    """``<cgroup2>/<base>/inference``, beside the trading system's component cgroups."""
    return cgroup_dir("inference", base or BASE_CGROUP)


def classify(logits: tuple[float, float, float]) -> tuple[str, float, tuple[float, float, float]]:
    """Label, signal value and probabilities from the three label logits (argmax: no sampling)."""
    p = softmax(logits)
    probs = (p[0], p[1], p[2])
    label = LABELS[max(range(3), key=probs.__getitem__)]
    return label, probs[0] - probs[1], probs


def _worker(config: InferenceConfig, sock: socket.socket) -> None:
    started = time.perf_counter_ns()
    try:
        runtime = load_runtime(config.model, config.runtime, config.threads, config.device)
    except InferenceError as error:
        sock.send(pickle.dumps(("error", str(error))))
        return
    ready = ("ready", runtime.model, runtime.name, runtime.device, time.perf_counter_ns() - started)
    sock.send(pickle.dumps(ready))
    while True:
        select.select([sock], [], [])
        newest: dict[int, tuple[int, int, BookFeatures]] = {}
        superseded = 0
        while True:  # drain: only the newest request per symbol is worth scoring
            try:
                data = sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not data:
                return
            request_id, locate, features_ns, features = pickle.loads(data)
            superseded += locate in newest
            newest[locate] = (request_id, features_ns, features)
        if superseded:
            sock.send(pickle.dumps(("superseded", superseded)))
        for locate, (_, features_ns, features) in newest.items():
            begin = time.perf_counter_ns()
            scores = runtime.score(runtime.render(render(features)))
            scored = time.perf_counter_ns()
            label, value, probs = classify(scores.logits)
            done = time.perf_counter_ns()
            result = Result(
                locate,
                label,
                value,
                probs,
                features_ns,
                begin - features_ns,
                scores.prefill_ns,
                done - scored,
                done,
                scores.prompt_tokens,
            )
            sock.send(pickle.dumps(("result", result)))


class InferenceStage:
    """Start with ``start()`` (blocks until the model is loaded), ``submit``, ``close()``."""

    def __init__(
        self,
        config: InferenceConfig = InferenceConfig(),
        hook: BoundedSignalHook | None = None,
        cgroup: Path | None = None,
    ) -> None:
        self.config = config
        self.hook = hook if hook is not None else BoundedSignalHook()
        self.cgroup = cgroup
        self.pid = 0
        self.model = ""
        self.runtime = ""
        self.device = ""
        self.load_ns = 0
        self.hists = {name: Histogram.empty() for name in (QUEUE_WAIT, PREFILL, DECODE)}
        self.counts = {"requests": 0, "dropped": 0, "superseded": 0, "results": 0}
        self.labels: dict[str, int] = dict.fromkeys(LABELS, 0)
        self.last: dict[int, Result] = {}
        self._sock: socket.socket | None = None
        self._next_id = 0
        self._lock = threading.Lock()
        self._results = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> InferenceStage:
        # A fresh interpreter, not a fork: a parent that already runs torch's or OpenMP's
        # threads (a test, a notebook) would leave a forked child deadlocked on their locks.
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [
            sys.executable,
            "-m",
            "tailsight.trading_core.inference.stage",
            str(child.fileno()),
            json.dumps(asdict(self.config)),
            str(self.cgroup or ""),
        ]
        self._process = subprocess.Popen(command, pass_fds=(child.fileno(),))
        child.close()
        self.pid, self._sock = self._process.pid, parent
        try:
            parent.settimeout(self.config.load_timeout_s)
            try:
                message = pickle.loads(parent.recv(65536) or pickle.dumps(("error", "exited")))
            except TimeoutError:
                message = ("error", f"model not loaded within {self.config.load_timeout_s} s")
            if message[0] == "error":
                raise InferenceError(f"inference worker: {message[1]}")
            _, self.model, self.runtime, self.device, self.load_ns = message
            parent.settimeout(None)
            parent.setblocking(False)
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._read_loop, name="inference", daemon=True)
        self._thread.start()
        return self

    def submit(self, locate: int, features: BookFeatures, now_ns: int | None = None) -> bool:
        """Queue a request without waiting; False when the worker's queue is full (dropped)."""
        assert self._sock is not None, "start() first"
        stamp = time.perf_counter_ns() if now_ns is None else now_ns
        with self._lock:
            self._next_id += 1
            self.counts["requests"] += 1
            try:
                self._sock.send(pickle.dumps((self._next_id, locate, stamp, features)))
            except (BlockingIOError, OSError):
                self.counts["dropped"] += 1
                return False
        return True

    def _read_loop(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                select.select([sock], [], [])
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except (OSError, ValueError):
                data = b""
            if not data:
                with self._lock:
                    self._results.notify_all()
                return
            self._on_message(pickle.loads(data))

    def _on_message(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            if message[0] == "superseded":
                self.counts["superseded"] += message[1]
            elif message[0] == "result":
                result: Result = message[1]
                self.hists[QUEUE_WAIT].record(max(result.queue_wait_ns, 0))
                self.hists[PREFILL].record(result.prefill_ns)
                self.hists[DECODE].record(result.decode_ns)
                self.counts["results"] += 1
                self.labels[result.label] += 1
                self.last[result.locate] = result
                self.hook.publish(result.locate, result.value, result.features_ns)
            self._results.notify_all()

    def wait(self, results: int, timeout_s: float = 60.0) -> bool:
        """Until ``results`` answers arrived (or every request was answered or superseded)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self.counts["results"] < results:
                settled = self.counts["results"] + self.counts["superseded"]
                if settled >= self.counts["requests"] - self.counts["dropped"]:
                    break
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive():
                    return False
                self._results.wait(min(left, 0.5))
            return self.counts["results"] >= results

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def series(self, labels: Mapping[str, str]) -> list[Series]:
        """The stage's ``tailsight.hist/1`` series (signal age included): ``labels`` plus
        ``stage``, ``model`` and ``runtime``."""
        extra = {"model": self.model, "runtime": self.runtime}
        with self._lock:
            hists = {name: hist.copy() for name, hist in self.hists.items()}
        hists[SIGNAL_AGE] = self.hook.ages.copy()
        return [Series({**labels, **extra, "stage": name}, h) for name, h in hists.items()]

    def counters(self, labels: Mapping[str, str]) -> list[Counter]:
        extra = {**labels, "model": self.model, "runtime": self.runtime}
        with self._lock:
            counts = {
                **{f"inference_{k}": v for k, v in self.counts.items()},
                **{f"inference_signal_{k}": v for k, v in self.labels.items()},
                "signal_stale": self.hook.stale,
                "signal_fresh": self.hook.fresh,
                "inference_load_ns": self.load_ns,
            }
        return [Counter(name, dict(extra), value) for name, value in counts.items()]

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
            self.pid = 0
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            if self._thread is not None:
                self._thread.join(timeout=2)
            self._sock.close()
            self._sock = None

    def __enter__(self) -> InferenceStage:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class BookSignalSource:
    """Feeds a stage from the live book: a symbol's features on a top-of-book change, at most
    once per ``min_interval_ns`` per symbol (the model is slower than the feed: requests it
    could not serve in time would only be superseded). Call ``on_update`` from the feed
    callback; it copies a few levels and never waits."""

    def __init__(
        self,
        stage: InferenceStage,
        book: Book,
        levels: int = 3,
        trades: int = 5,
        min_interval_ns: int = 100_000_000,
    ) -> None:
        self.stage = stage
        self.book = book
        self.levels = levels
        self.trades = RecentTrades(trades)
        self.min_interval_ns = min_interval_ns
        self._last_ns: dict[int, int] = {}

    def on_update(
        self, locate: int, top_changed: bool, trade: TradeEvent | None = None, now_ns: int = 0
    ) -> bool:
        """True when a request went to the stage."""
        if trade is not None:
            self.trades.add(trade)
        if not top_changed:
            return False
        now = now_ns or time.perf_counter_ns()
        if now - self._last_ns.get(locate, -self.min_interval_ns) < self.min_interval_ns:
            return False
        self._last_ns[locate] = now
        features = features_from_book(self.book, locate, self.trades, self.levels)
        return self.stage.submit(locate, features, now)


def _main(argv: list[str]) -> int:
    """The worker process: ``python -m tailsight.trading_core.inference.stage FD CONFIG CGROUP``."""
    fd, config_json, cgroup = int(argv[0]), argv[1], argv[2]
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the line above took effect
        return 0
    sock = socket.socket(fileno=fd)
    try:
        if cgroup:  # before the model loads: its CPU time is the inference cgroup's from the start
            try:
                join_cgroup(Path(cgroup))
            except OSError as error:
                sock.send(pickle.dumps(("error", f"cannot join cgroup {cgroup}: {error}")))
                return 2
        _worker(InferenceConfig(**json.loads(config_json)), sock)
    except (KeyboardInterrupt, BrokenPipeError, ConnectionResetError):
        pass
    except BaseException:
        sys.stderr.write(f"tailsight inference worker failed:\n{traceback.format_exc()}")
        return 1
    return 0


if __name__ == "__main__":
    # Through the imported module, so what it pickles (Result) names that module, not __main__.
    from tailsight.trading_core.inference import stage

    sys.exit(stage._main(sys.argv[1:]))
