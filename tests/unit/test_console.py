"""A quiet run keeps the terminal for our own lines and sends everything else to train.log."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import logging, os, subprocess, sys, warnings
    from pathlib import Path
    from megatron_pc import console

    logging.basicConfig(level=logging.INFO)  # as the CLI does: replaced by setup
    console.setup(Path(sys.argv[1]), verbose=sys.argv[2] == "verbose")
    print("our summary line")
    console.to_console(logging.getLogger("megatron_pc.driver.evaluation"), "step %d validation: %.3f", 20, 0.5)
    logging.getLogger("megatron_pc.driver.trainer").warning("our warning")
    logging.getLogger("megatron_pc.driver.trainer").info("our info detail")
    logging.getLogger("vllm").warning("RotaryEmbedding: Failed to load weights")
    warnings.warn("a library's deprecation")
    os.write(2, b"a C library writes to fd 2\\n")
    subprocess.run([sys.executable, "-c", "print('a child process prints')"], check=True)
    lib = logging.getLogger("somelib")  # a library with its own terminal handler, as Ray has
    lib.addHandler(logging.StreamHandler(sys.stderr))
    lib.propagate = False
    console.route_library_logs("somelib")
    lib.warning("a library's own handler")
    console.redirect_worker_output()  # what a Ray actor does
    os.write(1, b"an actor writes to fd 1\\n")
    """
)


def _run(tmp_path: Path, mode: str) -> tuple[str, str]:
    log = tmp_path / "train.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log), mode], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr, log.read_text()


def test_quiet_console_shows_our_lines_and_logs_the_rest(tmp_path: Path) -> None:
    terminal, log = _run(tmp_path, "quiet")
    for line in ("our summary line", "step 20 validation: 0.500", "our warning"):
        assert line in terminal
    for noise in ("our info detail", "RotaryEmbedding", "deprecation", "C library", "child process", "own handler", "actor writes"):
        assert noise not in terminal, noise
        assert noise in log, noise
    assert "step 20 validation: 0.500" in log and "our warning" in log


def test_verbose_console_shows_everything(tmp_path: Path) -> None:
    terminal, log = _run(tmp_path, "verbose")
    for line in ("our summary line", "our info detail", "RotaryEmbedding", "deprecation", "C library", "child process", "own handler"):
        assert line in terminal, line
    assert "our info detail" in log


ENGINE_ACTOR = textwrap.dedent(
    """
    import logging, os, subprocess, sys
    from megatron_pc import console

    # What an engine actor does when it starts (cluster/engines.py: EngineActor), in its own process.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    print(console.redirect_worker_output(own_log=sys.argv[1]))
    logging.getLogger("vllm.model_executor").warning("an engine's warning")
    os.write(1, ("%s writes to fd 1\\n" % sys.argv[1]).encode())
    subprocess.run([sys.executable, "-c", "print('its vLLM worker process prints')"], check=True)
    """
)


BARS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    if sys.argv[3] == "before":
        import transformers  # imported before the console is set up: told directly
    from megatron_pc import console

    console.setup(Path(sys.argv[1]), verbose=sys.argv[2] == "verbose")
    from transformers.utils import logging as hf_logging

    for _ in hf_logging.tqdm(range(2), desc="Writing model shards"):  # save_pretrained's own bar
        pass
    print("our summary line")
    """
)


def test_each_engine_process_writes_its_own_log_beside_train_log_which_names_it(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("the driver's line\n")
    env = {**os.environ, "MEGATRON_PC_LOG_FILE": str(log)}
    for name in ("engine0", "engine1", "engine0"):  # engine0 again: a restart appends to its file
        proc = subprocess.run([sys.executable, "-c", ENGINE_ACTOR, name], capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
    driver = log.read_text()
    assert "writes to fd 1" not in driver and "warning" not in driver and "prints" not in driver
    assert driver.count("engine0 (pid") == 2 and driver.count("engine1 (pid") == 1
    assert f"writes its output to {tmp_path / 'logs' / 'engine1.log'}" in driver
    own = (tmp_path / "logs" / "engine0.log").read_text()
    assert own.count("engine0 writes to fd 1") == 2 and own.count("an engine's warning") == 2
    assert own.count("its vLLM worker process prints") == 2 and "engine1" not in own
    assert "engine1 writes to fd 1" in (tmp_path / "logs" / "engine1.log").read_text()


def test_hugging_face_progress_bars_stay_off_a_quiet_console(tmp_path: Path) -> None:
    for when in ("before", "after"):
        proc = subprocess.run([sys.executable, "-c", BARS, str(tmp_path / "train.log"), "quiet", when],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "our summary line" in proc.stdout and "Writing model shards" not in proc.stdout + proc.stderr, when
    verbose = subprocess.run([sys.executable, "-c", BARS, str(tmp_path / "v.log"), "verbose", "after"], capture_output=True, text=True, timeout=120)
    assert "Writing model shards" in verbose.stderr  # the bar exists: only the quiet run hides it
