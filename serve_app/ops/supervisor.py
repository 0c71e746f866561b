"""`probserve serve` on this machine: a supervisor that never imports Ray, and the Ray driver,
its child, that runs the service.

The split is what makes a stop leave nothing behind. Ray's driver cannot be trusted to clean
up: ray.init installs a SIGTERM handler that ends the process at once, and once the raylet is
gone (a signal to the process group reaches it too) Ray ends its driver within seconds,
wherever its stop has got to. The supervisor is a child subreaper, so every orphan of the tree
(an HAProxy whose proxy actor died) is reparented to it; on SIGTERM or Ctrl-C it lets the
driver stop Serve and Ray as they stop themselves for RAY_STOP_S, then ends whatever is left.
"""

import signal
import subprocess
import sys
import threading

from serve_app.ops import processes

# Ray's own stop for RAY_STOP_S at most, then SIGTERM to every process left and SIGKILL after
# END_S: STOP_S bounds it all (docs/operations.md), within Kubernetes' default grace period
# of 30 s. Orphans that end while the service runs are collected every REAP_S.
RAY_STOP_S, END_S = 15, 5
STOP_S = RAY_STOP_S + 2 * END_S
REAP_S = 5


def supervise(driver_command: list[str], ports: dict[str, int]) -> int:
    """Runs the driver until it ends or this process is told to stop; then ends every
    process of the tree; `ports` ({what: port}) must be free. Returns the driver's status (0
    when stopped by a signal)."""
    for cleared in processes.clear_leftovers(processes.haproxy_folder()):
        print(cleared, flush=True)
    processes.check_ports(ports)
    processes.become_subreaper()
    told_to_stop = threading.Event()
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: told_to_stop.set())
    # In this process group, so that a group's signal reaches it; told if this process is killed.
    driver = subprocess.Popen(driver_command, preexec_fn=processes.sigterm_when_parent_dies)
    while driver.poll() is None and not told_to_stop.wait(REAP_S):
        processes.reap_orphans({driver.pid})
    print("probserve is stopping", flush=True)
    status = stop(driver)
    print("probserve stopped", flush=True)
    return 0 if told_to_stop.is_set() else status


def stop(driver: subprocess.Popen) -> int:
    """The driver's own stop (Serve and Ray, requests in flight drained) for RAY_STOP_S, then
    the end of every process left, orphans included."""
    tree = processes.descendants()
    if driver.poll() is None:
        driver.send_signal(signal.SIGTERM)
    try:
        driver.wait(RAY_STOP_S)
    except subprocess.TimeoutExpired:  # Ray's node is gone (a group's signal reached it): it hangs
        pass
    left = {p.pid: p for p in tree + processes.descendants()}
    killed = processes.end_all(list(left.values()), END_S)
    if killed:
        pids = ", ".join(str(p.pid) for p in killed)
        print(f"killed what did not end within {END_S} s of SIGTERM: pids {pids}", flush=True)
    return driver.wait()


def exit_on_sigterm() -> None:
    """The driver's SIGTERM: a normal exit, so that its stop runs (`finally`)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
