"""A process's CPU priority, all its threads at once.

Linux keeps a nice value per thread, and a thread inherits the value of the thread that
starts it: `os.nice` in one thread leaves the others (an actor's event loop, its executor
threads) where they were.
"""

import os
from pathlib import Path

TASKS = Path("/proc/self/task")


def lower_priority(niceness: int) -> None:
    """Every thread of this process, and so those they start, at `niceness` (0 to 19, higher
    gives way): the CPU goes to the other processes first when they want it, and to this one
    whenever it is free."""
    threads = [int(task.name) for task in TASKS.iterdir()] if TASKS.is_dir() else [0]
    for thread in threads:
        os.setpriority(os.PRIO_PROCESS, thread, niceness)
