"""The processes `probserve serve` starts on this machine, and a stop that leaves none behind.

Ray's node processes are the command's children, its workers theirs, and their children (vLLM's
engine processes, HAProxy) theirs. A signal to the command's process group reaches only the
first of these: Ray starts its workers in process groups of their own, so when the raylet dies
an HAProxy is orphaned, still listening on the service's port. Marked as a child subreaper, the
command inherits every orphan of its tree instead of init, so the stop can end them all.
"""

import ctypes
import os
import signal
from pathlib import Path

import psutil

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36  # linux/prctl.h
# Ray Serve's HAProxy files, a folder per node (ray/serve/_private/constants.py). They stay in
# the system temp folder, not PROBSERVE_HOME: HAProxy takes socket paths of 97 bytes at most,
# and the node's folder name alone is 56.
HAPROXY_CONFIG = "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"
HAPROXY_CONFIG_DEFAULT = "/tmp/haproxy-serve/haproxy.cfg"
# HAProxy's own ports, the same on every node of Ray Serve's (the variables and their defaults).
HAPROXY_PORTS = {"RAY_SERVE_HAPROXY_METRICS_PORT": ("HAProxy's metrics", 9101),
                 "RAY_SERVE_HAPROXY_STATS_PORT": ("HAProxy's statistics", 8404)}


def become_subreaper() -> None:
    """Orphaned descendants are reparented to this process (Linux; elsewhere a no-op)."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def sigterm_when_parent_dies() -> None:
    """This process gets SIGTERM when its parent ends, however it ends (SIGKILL included)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def prctl(option: int, value: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    if hasattr(libc, "prctl"):
        libc.prctl(option, value, 0, 0, 0)


def descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def alive(process: psutil.Process) -> bool:
    """Still there, and not merely a zombie waiting for its parent to collect it."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reap_orphans(spared: set[int]) -> None:
    """Collects the exit of children that ended, but for `spared`: the ones the command
    started itself (their owners collect them), so that inherited orphans leave no zombies."""
    for child in psutil.Process().children():
        if child.pid in spared:
            continue
        try:
            os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pass


def end_all(processes: list[psutil.Process], grace_s: float) -> list[psutil.Process]:
    """SIGTERM to each process still alive, SIGKILL to any still there after `grace_s`;
    returns the ones that needed SIGKILL."""
    alive = [p for p in processes if p.is_running() and p.pid != os.getpid()]
    for process in alive:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, stubborn = psutil.wait_procs(alive, timeout=grace_s)
    for process in stubborn:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(stubborn, timeout=grace_s)
    return stubborn


def port_holder(port: int) -> psutil.Process | None:
    """The process listening on this TCP port, if any this user may see."""
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
            try:
                return psutil.Process(connection.pid)
            except psutil.NoSuchProcess:
                return None
    return None


def haproxy_folder() -> Path:
    return Path(os.environ.get(HAPROXY_CONFIG, HAPROXY_CONFIG_DEFAULT)).parent


def haproxy_ports() -> dict[str, int]:
    """{what: port} of HAProxy's own ports, as this environment sets them."""
    return {f"{what}, {variable}": int(os.environ.get(variable, default))
            for variable, (what, default) in HAPROXY_PORTS.items()}


def leftovers(haproxy_folder: Path) -> list[tuple[str, psutil.Process]]:
    """What a probserve cut short left, (what, process) each: each HAProxy of Ray Serve (its
    configuration in the HAProxy folder) that no running Ray node holds, and the proxy actor
    that started it if that outlived its raylet (it would start the HAProxy again). A running
    service's HAProxy is the child of a proxy actor (`ray::...`) whose parent is a raylet."""
    found = []
    for haproxy in psutil.process_iter(["cmdline"]):
        try:
            if not any(str(haproxy_folder) in part for part in haproxy.info["cmdline"] or []):
                continue
            actor = haproxy.parent()
            if actor is not None and actor.name().startswith("ray::"):
                if name_of(actor.parent()) == "raylet":
                    continue
                found.append((f"its proxy actor, {actor.name()},", actor))
            found.append(("an HAProxy", haproxy))
        except psutil.Error:
            continue
    return found


def name_of(process: psutil.Process | None) -> str:
    try:
        return process.name() if process is not None else ""
    except psutil.Error:
        return ""


def clear_leftovers(haproxy_folder: Path) -> list[str]:
    """Ends what a probserve that did not stop left; says what it ended."""
    found = leftovers(haproxy_folder)
    end_all([process for _, process in found], grace_s=5)
    return [f"ended {what} (pid {process.pid}) left by a probserve that did not stop"
            for what, process in found]


def check_ports(ports: dict[str, int]) -> None:
    """Stops the command, naming the process, when another holds one of its ports ({what:
    port})."""
    for what, port in ports.items():
        holder = port_holder(port)
        if holder is None:
            continue
        try:
            command = " ".join(holder.cmdline()) or holder.name()
        except psutil.Error:
            command = "a process that has just ended"
        raise SystemExit(f"port {port} ({what}) is in use by pid {holder.pid} ({command}): stop it, "
                         "or serve on another port")
