import json
import os
import subprocess
import sys
import textwrap

import pytest

from serve_app.fullvocab.niceness import TASKS

pytestmark = pytest.mark.skipif(not TASKS.is_dir(), reason="per-thread nice values are Linux's")

# In a process of its own: a priority once lowered cannot be raised again without privileges.
SCRIPT = textwrap.dedent("""
    import json, os, threading
    from serve_app.fullvocab.niceness import lower_priority

    started = threading.Event()
    finish = threading.Event()
    def before():
        started.set()
        finish.wait()
    earlier = threading.Thread(target=before)
    earlier.start()
    started.wait()
    lower_priority(7)
    values = [os.getpriority(os.PRIO_PROCESS, int(task)) for task in os.listdir("/proc/self/task")]
    later = []
    def after():
        later.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    thread = threading.Thread(target=after)
    thread.start()
    thread.join()
    finish.set()
    earlier.join()
    print(json.dumps({"threads": len(values), "values": sorted(set(values)), "later": later}))
""")


def test_every_thread_and_the_threads_started_after_give_way():
    assert os.getpriority(os.PRIO_PROCESS, 0) < 7
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert json.loads(run.stdout) == {"threads": 2, "values": [7], "later": [7]}
