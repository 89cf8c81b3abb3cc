"""Faults injected into the driver at chosen points of a step, for the fault suite.

``MEGATRON_PC_INJECT_FAULTS`` holds a comma-separated list of ``SIGNAL@PHASE:STEP[+DELAY]``:

    sigkill@checkpoint:3          SIGKILL the driver as step 3's checkpoint is being written
    sigterm@update:2+0.05         SIGTERM it 0.05 s into step 2's policy update
    sigterm@generate:4,sigterm@generate:4+0.2     two SIGTERMs in one phase

The signal is a real one, sent by the driver to itself when it enters the phase (after DELAY
seconds, from a timer thread, so it lands wherever the driver then is). Phases: generate,
reward, logprob, update, sync, validation, checkpoint (after the policy's files are written and
before the manifest). Each fault fires once, at the first entry into its phase in its step.
Unset, nothing happens; ``megatron-pc bench faults`` and the fault tests set it.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass

from megatron_pc.errors import ConfigError
from megatron_pc.metrics.phases import FAULT_PHASES

logger = logging.getLogger(__name__)

ENV = "MEGATRON_PC_INJECT_FAULTS"
PHASES = FAULT_PHASES
SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1}
_SPEC = re.compile(r"^(?P<sig>\w+)@(?P<phase>\w+):(?P<step>\d+)(?:\+(?P<delay>\d+(?:\.\d*)?))?$")


@dataclass(frozen=True)
class Fault:
    """One signal to send at one point of one step."""

    signal: str
    phase: str
    step: int
    delay_s: float = 0.0

    def spec(self) -> str:
        """The text that sets this fault in ``MEGATRON_PC_INJECT_FAULTS``."""
        return f"{self.signal}@{self.phase}:{self.step}" + (f"+{self.delay_s:g}" if self.delay_s else "")


def parse(text: str) -> list[Fault]:
    """The faults of a ``MEGATRON_PC_INJECT_FAULTS`` value; a ConfigError names a bad entry."""
    faults = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = _SPEC.match(part)
        if not m or m["sig"] not in SIGNALS or m["phase"] not in PHASES:
            raise ConfigError(ENV, f"bad entry {part!r}: expected SIGNAL@PHASE:STEP[+DELAY] with SIGNAL one of "
                              f"{sorted(SIGNALS)} and PHASE one of {list(PHASES)}")  # fmt: skip
        faults.append(Fault(m["sig"], m["phase"], int(m["step"]), float(m["delay"] or 0.0)))
    return faults


class Injector:
    """Fires the faults of ``MEGATRON_PC_INJECT_FAULTS`` as the trainer enters its phases."""

    def __init__(self, faults: list[Fault]) -> None:
        self.pending = list(faults)

    @classmethod
    def from_env(cls) -> "Injector":
        """The injector of this process's environment (empty when the variable is unset)."""
        return cls(parse(os.environ.get(ENV, "")))

    def enter(self, phase: str, step: int) -> None:
        """Called at the start of ``phase`` in ``step``: send the signals due there."""
        due = [f for f in self.pending if f.phase == phase and f.step == step]
        for fault in due:
            self.pending.remove(fault)
            logger.warning("injecting fault %s at %.3f", fault.spec(), time.time())  # bench faults reads the time
            for handler in logging.getLogger().handlers:
                handler.flush()
            if fault.delay_s:
                timer = threading.Timer(fault.delay_s, os.kill, (os.getpid(), SIGNALS[fault.signal]))
                timer.daemon = True
                timer.start()
            else:
                os.kill(os.getpid(), SIGNALS[fault.signal])
