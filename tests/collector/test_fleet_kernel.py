"""Two hosts on one machine: two ``tailsight serve`` agents, each in its own network namespace
(a veth to the root namespace) and restricted to its own cgroup subtree (``--cgroup-root``),
scraped as two ``instance``s by one real Prometheus. A CPU hog starts beside host A's victim;
``explain --prometheus`` must name host A, its victim cgroup and the hog as the aggressor, and
show no jump on host B while the fault lasts.

Real hosts share no CPU; these two share the machine's second one with both agents, Prometheus
and the test. So host B's victim runs real-time (SCHED_FIFO): the machine's own noise, which can
jump its P99 2 -> 5 ms (about one run of four on this 2-core host), does not reach it, and a
jump of B's series can only be the fault leaking across instances, what the test is about."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import pytest
from typer.testing import CliRunner

from tailsight.analysis.promsource import PrometheusSource, read_documents
from tailsight.cli.main import app
from tailsight.testing.inject import HOG_CODE, VICTIM_CODE, VICTIM_LOOP
from tailsight.testing.workload import Workload, private_base, python_task, stop_process
from tests.prometheus_server import PROMETHEUS, Prometheus, prometheus_scraping

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

PORT = 9435
AGENT_INTERVAL_S = 0.5
SCRAPE_S = 1.0
BASELINE_S = 25.0
FAULT_S = 20.0
HOG_CPU = 0
REAL_TIME: Final = "import os\nos.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))\n"
# Host B's victim: sleeps 1 ms, spins 0.5 ms. Real-time, it takes its share of the CPU the agents,
# Prometheus and this test share before any of them; VICTIM_LOOP's 2 ms spins take two thirds,
# and agent A then stalls for ~20 s at the hog's start (3 of 5 runs on this 2-core host).
LIGHT_VICTIM_LOOP: Final = VICTIM_LOOP.replace("+ 0.002", "+ 0.0005")


def _ip(*argv: str) -> None:
    result = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: {result.stderr.strip()}")


@contextlib.contextmanager
def host_netns(tag: str, subnet: int) -> Iterator[tuple[str, str]]:
    """A namespace joined to the root one by a veth; yields (namespace, its address)."""
    namespace = f"tsfleet-{os.getpid()}-{tag}"
    outside, inside = f"tf{os.getpid() % 10000}{tag}o", f"tf{os.getpid() % 10000}{tag}i"
    address = f"10.231.{subnet}.2"
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", namespace)
        _ip("addr", "add", f"10.231.{subnet}.1/30", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/30", "dev", inside)
        _ip("-n", namespace, "link", "set", inside, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        yield namespace, address
    finally:
        # Deleting the namespace deletes its veth end, and with it the peer in the root one.
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", outside], capture_output=True, check=False)


@contextlib.contextmanager
def agent(namespace: str, address: str, subtree: str) -> Iterator[subprocess.Popen[bytes]]:
    """``tailsight serve`` inside ``namespace``, exporting only ``subtree``."""
    # nsenter --net, not `ip netns exec`: that also remounts /sys, hiding the cgroup2 mount.
    command = [
        "nsenter",
        f"--net=/run/netns/{namespace}",
        str(Path(sys.executable).with_name("tailsight")),
        "serve",
        "--probe",
        "runqueue",
        "--interval",
        str(AGENT_INTERVAL_S),
        "--listen",
        f"{address}:{PORT}",
        "--cgroup-root",
        subtree,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Off the hog's CPU, as a real host's agent would not share its victim's run queue.
    others = os.sched_getaffinity(0) - {HOG_CPU}
    if others:
        os.sched_setaffinity(proc.pid, others)
    try:
        yield proc
    finally:
        stop_process(proc, 30)
        if proc.stderr is not None:
            proc.stderr.close()


def _wait_scraped(
    prometheus: Prometheus, instances: Sequence[str], agents: Sequence[subprocess.Popen[bytes]]
) -> None:
    deadline = time.monotonic() + 150
    while True:
        for proc in agents:
            if proc.poll() is not None:
                said = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise AssertionError(f"an agent exited: {said}")
        found = {
            r["metric"]["instance"] for r in prometheus.query("tailsight_intervals_total >= 2")
        }
        if set(instances) <= found:
            return
        assert time.monotonic() < deadline, f"agents not scraped after 150 s: {found}"
        time.sleep(0.5)


def test_two_hosts_explain_names_the_right_instance(kernel_ready: None, tmp_path: Path) -> None:
    if not Path(PROMETHEUS).exists():
        pytest.skip("kernel: /usr/bin/prometheus missing (run `make setup`)")
    base = private_base("fleet")
    other_cpu = max(os.sched_getaffinity(0) - {HOG_CPU}, default=HOG_CPU)
    host_a, host_b = f"{base}/host-a", f"{base}/host-b"
    victims_a = Workload([python_task("victim", VICTIM_CODE, cpu=HOG_CPU)], base=host_a)
    victims_b = Workload(
        [python_task("victim", REAL_TIME + LIGHT_VICTIM_LOOP, cpu=other_cpu)], base=host_b
    )
    # The test, and Prometheus with it, on host B's CPU from the start: when the hog arrives
    # nothing moves over to B (unpinned, they would, and B's victim would wait for them).
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {other_cpu})
    with contextlib.ExitStack() as stack:
        stack.callback(os.sched_setaffinity, 0, affinity)
        stack.enter_context(victims_a)
        stack.enter_context(victims_b)
        ns_a, address_a = stack.enter_context(host_netns("a", 1))
        ns_b, address_b = stack.enter_context(host_netns("b", 2))
        agents = [
            stack.enter_context(agent(ns_a, address_a, f"/{host_a}")),
            stack.enter_context(agent(ns_b, address_b, f"/{host_b}")),
        ]
        instance_a, instance_b = f"{address_a}:{PORT}", f"{address_b}:{PORT}"
        targets = {"tailsight": [instance_a, instance_b]}
        prometheus = stack.enter_context(prometheus_scraping(targets, tmp_path, SCRAPE_S))
        _wait_scraped(prometheus, [instance_a, instance_b], agents)
        since = time.time()
        time.sleep(BASELINE_S)
        hog = Workload([python_task("hog", HOG_CODE, cpu=HOG_CPU)], base=host_a)
        # Timed before the start: this test shares its CPU with both agents, Prometheus and B's
        # real-time victim, and can return from the hog's start 15 s after the hog ran (agent
        # A's ticks then stall as long, see LIGHT_VICTIM_LOOP).
        injected = time.time()
        with hog:
            time.sleep(FAULT_S)
        time.sleep(2 * SCRAPE_S)  # the last scrapes of the fault
        until = time.time()
        result = CliRunner().invoke(
            app,
            [
                "explain",
                "--prometheus",
                prometheus.url,
                "--since",
                f"{since:.3f}",
                "--until",
                f"{until:.3f}",
                "--json",
            ],
        )
        documents, _ = read_documents(PrometheusSource(prometheus.url), since, until)
    # Both hosts' victims were read back, each only from its own agent.
    counts: dict[tuple[str, str], int] = {}
    for document in documents:
        for series in document.series:
            key = (series.labels.get("instance", ""), series.labels.get("cgroup", ""))
            counts[key] = counts.get(key, 0) + series.hist.count
    assert counts.get((instance_b, victims_b.cgroup_path("victim")), 0) > 1000, counts
    subtree = {instance_a: f"/{host_a}", instance_b: f"/{host_b}"}  # each agent's own
    for instance, cgroup in counts:
        assert cgroup.startswith(subtree[instance]) or cgroup == "other", (instance, cgroup)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    victim_a = victims_a.cgroup_path("victim")
    timeline = [
        (round(d.start_ns / 1e9 - injected, 1), s.hist.count, round(s.hist.quantile(0.99) / 1e3))
        for d in documents
        for s in d.series
        if s.labels.get("cgroup") == victim_a
    ]
    mine = [
        j
        for j in report["jumps"]
        if j["series"].get("instance") == instance_a and j["series"].get("cgroup") == victim_a
    ]
    if not mine:  # spelled out: pytest cuts a long assertion message short
        pytest.fail(
            f"no jump of {victim_a} on {instance_a}: jumps {report['jumps']}, timeline "
            f"{timeline}, stderr {result.stderr[-2000:]}"
        )
    jump = min(mine, key=lambda j: j["change_start_ns"])
    assert jump["direction"] == "up"
    # Dated from coarse buckets in 1 s steps on a shared 2-core machine: a few steps late at worst.
    late_s = jump["change_start_ns"] / 1e9 - injected
    assert -2 * SCRAPE_S <= late_s <= 6 * SCRAPE_S, (late_s, timeline)
    aggressors = jump["displacement"]["aggressors"]
    # Shown if it fails (twice before host B's victim was made lighter, "other", the aggressors
    # outside host A's subtree, came first; in a passing run "other" displaces the victim ~6 ms
    # an interval before the hog and the hog ~240 ms after): every jump of the victim, dated
    # against the injection, with its aggressors.
    jumps = [
        (j["change_start_ns"] / 1e9 - injected, j["displacement"]["aggressors"][:3]) for j in mine
    ]
    assert aggressors[0]["aggressor"] == hog.cgroup_path("hog"), (jumps, timeline)
    # Host B: no jump of any of its series when the hog arrived (in the window A's is dated in),
    # none it displaced, and nothing of A's subtree in B's series (or of B's in A's): each agent
    # exported its own subtree only. Later, B's own noise may show (e.g. its real-time victim's
    # P99 7 -> 46 us, 17 s into the fault, with nothing of A's on its CPU).
    on_b = [
        j
        for j in report["jumps"]
        if j["series"].get("instance") == instance_b
        and (
            -2 * SCRAPE_S <= j["change_start_ns"] / 1e9 - injected <= 6 * SCRAPE_S
            or any(
                a["aggressor"].startswith(f"/{host_a}")
                for a in (j.get("displacement") or {}).get("aggressors", [])
            )
        )
    ]
    assert not on_b, [
        (j["series"], j["before_ns"], j["after_ns"], j["change_start_ns"] / 1e9 - injected)
        for j in on_b
    ]
    # Every jump's cgroup lies in its own instance's subtree (B's later noise included; an
    # instance's aggregate has no cgroup label and is its own by construction).
    for jump in report["jumps"]:
        series = jump["series"]
        if "instance" in series:
            own = subtree[series["instance"]]
            assert series.get("cgroup", own).startswith(own), series
