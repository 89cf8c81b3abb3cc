"""Peak RSS is the process's own, not its parent's at fork."""

from __future__ import annotations

import subprocess
import sys

from megatron_pc.cluster.peak_memory import peak_rss_bytes

MIB = 2**20


def test_a_child_of_a_large_process_reports_its_own_peak_not_the_parents() -> None:
    big = bytearray(400 * MIB)
    big[::4096] = b"\x01" * len(big[::4096])  # touch every page so it is resident
    code = "from megatron_pc.cluster.peak_memory import peak_rss_bytes; print(peak_rss_bytes())"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert peak_rss_bytes() >= 400 * MIB
    # getrusage's ru_maxrss would report >= 400 MiB here: Linux carries it across exec.
    assert 0 < child < 200 * MIB, child / MIB
    del big
