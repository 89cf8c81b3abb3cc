"""Your own reward function: ``module:function`` or ``path.py:function`` with verl's signature.

``compute_score(data_source, solution_str, ground_truth, extra_info)`` returns a number, or a
dict with a number under ``score`` whose other numeric keys become metrics ``reward/<key>``
(verl's ``custom_reward_function.path/name`` contract). It runs inside a grading worker (see
pool.py), under the same timeout and memory limit as the built-in graders.

A spec that does not import, or names something that is not a function of four arguments, is
refused at start (:func:`check_spec`). A call that raises, or returns something that is not a
finite number (or a dict without one under ``score``), grades 0 with reason ``error:<what>``,
which the pool counts in ``reward_errors`` and logs once per function.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
from pathlib import Path
from typing import Any, Callable

from megatron_pc.errors import ConfigError
from megatron_pc.reward.functions import REWARD_FUNCTIONS, Grade

__all__ = ["is_custom", "parse_spec", "load_function", "check_spec", "to_grade", "call_custom"]

_loaded: dict[str, Callable[..., Any]] = {}
"""Functions by spec, imported once per process."""


def is_custom(spec: str) -> bool:
    """True for ``module:function`` / ``path.py:function``, False for a built-in grader's name."""
    return spec not in REWARD_FUNCTIONS


def parse_spec(spec: str) -> tuple[str, str]:
    """(module name or .py path, function name) of a custom spec; a ValueError saying the forms."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError(f"must be a built-in grader ({', '.join(sorted(REWARD_FUNCTIONS))}) or "
                         f"'module:function' or 'path/to/file.py:function', got {spec!r}")  # fmt: skip
    if not target.endswith(".py") and not all(part.isidentifier() for part in target.split(".")):
        raise ValueError(f"{target!r} is neither a module name (a.b.c) nor a .py file, in {spec!r}")
    return target, name


def load_function(spec: str) -> Callable[..., Any]:
    """The function a custom spec names, imported once per process (a relative .py path is
    taken from the working directory). Raises ImportError / AttributeError / TypeError."""
    if spec in _loaded:
        return _loaded[spec]
    target, name = parse_spec(spec)
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ImportError(f"file {path} does not exist")
        # A module name of its own per file, so two files both called reward.py do not collide.
        module_name = f"_mpc_reward_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"{path} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    if not hasattr(module, name):
        raise AttributeError(f"{target} has no attribute {name!r}")
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"{target}:{name} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind("data_source", "solution_str", "ground_truth", {})
    except TypeError:
        raise TypeError(f"{target}:{name}{inspect.signature(fn)} cannot be called as "
                        "compute_score(data_source, solution_str, ground_truth, extra_info)") from None  # fmt: skip
    except ValueError:  # a builtin without a signature: it will be tried at the first call
        pass
    _loaded[spec] = fn
    return fn


def check_spec(spec: str, field: str) -> None:
    """Refuse (ConfigError naming ``field``) a custom spec that does not load; built-ins pass."""
    if not is_custom(spec):
        return
    try:
        load_function(spec)
    except Exception as err:  # noqa: BLE001 - user code may raise anything while importing
        raise ConfigError(field, f"reward function {spec!r} cannot be loaded: {type(err).__name__}: {err}") from None


def to_grade(value: Any) -> Grade:
    """The grade of a custom function's return value (see module docstring); ``correct`` is set
    by the pool from ``reward.success_threshold``."""
    metrics: dict[str, float] = {}
    score = value
    if isinstance(value, dict):
        if "score" not in value:
            return Grade(False, "error:bad_return", detail=f"returned a dict without 'score' (keys {sorted(map(str, value))[:8]})")
        score = value["score"]
        metrics = {str(k): float(v) for k, v in value.items()
                   if k != "score" and isinstance(v, (int, float)) and math.isfinite(v)}  # fmt: skip
    if not isinstance(score, (int, float)) or not math.isfinite(score):
        return Grade(False, "error:bad_return", detail=f"returned {type(score).__name__} {str(score)[:80]!r}, not a finite number")
    return Grade(False, "scored", score=float(score), metrics=tuple(sorted(metrics.items())))


def call_custom(spec: str, data_source: str, response: str, answer: str, extra_info: dict[str, Any]) -> Grade:
    """Call a custom function in a grading worker; whatever it raises is an ``error:`` grade."""
    try:
        return to_grade(load_function(spec)(data_source, response, answer, extra_info))
    except BaseException as err:  # noqa: BLE001 - user code on hostile input may raise anything
        return Grade(False, f"error:{type(err).__name__}", detail=str(err)[:200])
