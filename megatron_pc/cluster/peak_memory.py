"""Peak memory of a process: what every actor and the driver report for the run's peak-memory
metrics (megatron_pc.cluster.ray_workers.RayWorkers.peak_memory)."""

from __future__ import annotations


def peak_rss_bytes() -> int:
    """Peak resident set size of the calling process: ``VmHWM`` of /proc/self/status.

    Not ``getrusage().ru_maxrss``: Linux carries that across ``execve``, so a process started
    by a large parent (a driver started by pytest, a launcher) reports the parent's size at
    fork as its own peak. VmHWM belongs to the address space, which exec replaces.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    import resource  # no procfs (macOS): the best there is, in bytes there

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
