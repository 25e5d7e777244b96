"""A thread's CPU priority (shared by the client's and the checkpoint
writer's threads; importing it imports neither gRPC nor torch)."""
import os
import threading


def lower_thread_priority(nice: int) -> None:
    """Sets the calling thread's nice value to `nice` unless it is already
    at least that (Linux gives each thread its own, and threads it starts
    inherit it; elsewhere, or where it is refused, the priority stays)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except (AttributeError, OSError):
        pass
