import socket
import subprocess
import sys
import textwrap

import psutil
import pytest

from serve_app.ops import processes


def sleeper(*extra: str, ignore_term: bool = False) -> subprocess.Popen:
    """A Python process that sleeps (ignoring SIGTERM if asked), with `extra` in its command
    line."""
    handler = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignore_term else ""
    return subprocess.Popen([sys.executable, "-c", f"import signal, time; {handler}print('up', flush=True); "
                             "time.sleep(600)", *extra], stdout=subprocess.PIPE)


def started(*extra: str, ignore_term: bool = False) -> subprocess.Popen:
    process = sleeper(*extra, ignore_term=ignore_term)
    assert process.stdout.readline() == b"up\n"  # its handler is in place
    return process


def test_every_process_ends_and_one_that_ignores_sigterm_is_killed():
    polite, stubborn = psutil.Process(started().pid), psutil.Process(started(ignore_term=True).pid)
    killed = processes.end_all([polite, stubborn], grace_s=1)
    assert [p.pid for p in killed] == [stubborn.pid]
    assert not polite.is_running() and not stubborn.is_running()  # each ended and collected


def test_a_subreaper_inherits_its_orphans_and_collects_them():
    # In a process of its own: this one must stay an ordinary parent.
    script = textwrap.dedent("""
        import subprocess, sys, time
        import psutil
        from serve_app.ops import processes
        processes.become_subreaper()
        grandchild = "import time; time.sleep(600)"
        parent = subprocess.Popen([sys.executable, "-c",
            f"import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', {grandchild!r}]).pid)"],
            stdout=subprocess.PIPE)
        orphan = int(parent.stdout.readline())
        parent.wait()
        assert [p.pid for p in processes.descendants()] == [orphan], processes.descendants()
        processes.end_all(processes.descendants(), grace_s=5)
        processes.reap_orphans(spared=set())
        assert not psutil.pid_exists(orphan)
        print("ok")
    """)
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60).stdout == "ok\n"


def test_a_leftover_haproxy_of_this_home_is_found_and_ended(tmp_path):
    leftover, other = started(str(tmp_path / "haproxy" / "node" / "haproxy.cfg")), started("elsewhere")
    try:
        assert [(what, p.pid) for what, p in processes.leftovers(tmp_path / "haproxy")] == [
            ("an HAProxy", leftover.pid)]
        (cleared,) = processes.clear_leftovers(tmp_path / "haproxy")
        assert f"pid {leftover.pid}" in cleared
        assert not psutil.pid_exists(leftover.pid) and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_port_held_by_another_process_is_named():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port, me = holder.getsockname()[1], psutil.Process().pid
        assert processes.port_holder(port).pid == me
        with pytest.raises(SystemExit, match=rf"port {port} \(HTTP\) is in use by pid {me} \("):
            processes.check_ports({"Ray's metrics": free_port(), "HTTP": port})
    processes.check_ports({"HTTP": port})  # free again: nothing said


def test_haproxy_s_own_ports_are_the_environment_s(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_HAPROXY_STATS_PORT", "18404")
    monkeypatch.delenv("RAY_SERVE_HAPROXY_METRICS_PORT", raising=False)
    assert sorted(processes.haproxy_ports().values()) == [9101, 18404]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
