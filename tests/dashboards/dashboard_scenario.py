"""A workload that exercises every probe at once, each part in its own cgroup under ``base``:

- ``victim``: UDP round trips (sendto/recvfrom), EAGAIN reads and TCP connects to its own
  loopback listener, sleeping 1 ms between rounds, pinned to the CPU where ``noisy`` spins
  (run-queue waits and displacement by ``noisy``; netsyscall; tcpstate), and a thread of it
  hopping between all CPUs (migration);
- ``noisy``: a busy loop on that CPU.
"""

from __future__ import annotations

from tailsight.workload import Task, Workload, default_cpu, python_task

VICTIM_CODE = """
import os, socket, threading, time
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)
def serve():
    while True:
        conn, _ = listener.accept()
        conn.close()
threading.Thread(target=serve, daemon=True).start()
def move():  # this thread hops between all CPUs: the victim's migrations
    cpus = sorted(os.sched_getaffinity(os.getppid()))
    i = 0
    while True:
        os.sched_setaffinity(0, {cpus[i % len(cpus)]})
        i += 1
        time.sleep(0.005)
threading.Thread(target=move, daemon=True).start()
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n = 0
while True:
    tx.sendto(b"x", rx.getsockname())
    rx.recvfrom(16)
    n += 1
    if n % 10 == 0:
        try:
            rx.recvfrom(16, socket.MSG_DONTWAIT)  # empty: EAGAIN, the errors series
        except BlockingIOError:
            pass
        sock = socket.create_connection(listener.getsockname())
        sock.close()
    time.sleep(0.001)
"""


def every_probe(base: str) -> Workload:
    """The workload above; enter it to start, exit to kill it and remove its cgroups."""
    cpu = default_cpu()
    return Workload(
        [
            python_task("victim", VICTIM_CODE, cpu=cpu),
            Task("noisy", cpu=cpu),
        ],
        base=base,
    )
