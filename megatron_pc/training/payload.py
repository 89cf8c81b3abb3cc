"""What a training step moves: rollouts as numpy arrays, and one DP group's share of a step.

The driver builds a step's training rows once, splits them by data-parallel group so that the
groups get about the same number of tokens, and puts each share into the object store once;
the TP/PP ranks of a DP group read the same object. Old and reference log-probs are computed
on the workers and stay there; only scalars come back.

    RolloutPayload   one response: token ids, the engine's log-probs, finish reason, and the
                     token ids of the prompt it answers (its request's, shared by its group)
    RowPlan          a step's rows as references to the rollouts' arrays (nothing copied yet)
    StepRows         rows as flat arrays: token ids with offsets, prompt lengths, advantages,
                     engine log-probs, and the update (mini-batch) each row belongs to
    split_by_tokens  which rows each DP group trains, balanced by tokens
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence as Seq

import numpy as np

from megatron_pc.training.batching import Sequence


@dataclass
class RolloutPayload:
    """What training needs of one generated response (``Rollout.data`` of the trainer)."""

    tokens: np.ndarray
    """int32 response token ids."""
    logprobs: np.ndarray
    """float32 engine log-prob of each response token."""
    finish: str
    prompt: np.ndarray
    """int32 token ids of the prompt this response answers: the round's resolved request's
    (driver.rollouts.resolve_round), one array shared by the group's rollouts, so the update
    and the sync check never look the prompt up again."""

    @classmethod
    def of(cls, tokens: Seq[int], logprobs: Seq[float], finish: str, prompt: Seq[int] | np.ndarray) -> RolloutPayload:
        """From the engine's sample and its request's prompt (an int32 array is kept, not copied)."""
        if len(tokens) != len(logprobs):
            raise ValueError(f"a response of {len(tokens)} tokens came with {len(logprobs)} log-probs")
        return cls(np.asarray(tokens, dtype=np.int32), np.asarray(logprobs, dtype=np.float32), finish, np.asarray(prompt, dtype=np.int32))

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (buffered pilots are checkpointed with the controller state)."""
        return {"tokens": self.tokens.tolist(), "logprobs": self.logprobs.tolist(), "finish": self.finish, "prompt": self.prompt.tolist()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutPayload:
        """Inverse of :meth:`to_json`."""
        return cls.of(data["tokens"], data["logprobs"], data["finish"], data["prompt"])


PAYLOAD_KEYS = frozenset({"tokens", "logprobs", "finish", "prompt"})


def as_payload(data: Any) -> RolloutPayload:
    """A rollout's payload: itself, or rebuilt from its JSON (a rollout restored from a checkpoint)."""
    if isinstance(data, RolloutPayload):
        return data
    if isinstance(data, dict) and PAYLOAD_KEYS <= data.keys():
        return RolloutPayload.from_json(data)
    if isinstance(data, dict) and PAYLOAD_KEYS - {"prompt"} <= data.keys():
        raise ValueError("a buffered rollout restored from the checkpoint has no 'prompt' (its prompt's token ids): the "
                         "checkpoint was written by a megatron-pc that did not keep them with the rollouts; resume it "
                         "with that version, or start the run afresh")
    raise TypeError(f"a rollout's data is not a RolloutPayload: {type(data).__name__}")


@dataclass
class StepRows:
    """Training rows (prompt + response) as flat arrays; row i is ``tokens[offsets[i]:offsets[i+1]]``."""

    tokens: np.ndarray  # int32 [total tokens]
    offsets: np.ndarray  # int64 [rows + 1]
    prompt_lens: np.ndarray  # int32 [rows]
    advantages: np.ndarray  # float32 [rows]
    engine_logprobs: np.ndarray  # float32 [total response tokens], row by row
    update: np.ndarray  # int32 [rows]: the optimizer update (mini-batch) of the step
    denominators: list[float]
    """Per update: its global loss denominator (response tokens, or rows; see loss_denominator)."""
    loss_scales: list[float]
    """Per update: the weight of its loss (a short last mini-batch weighs its share)."""

    @property
    def rows(self) -> int:
        """Number of rows."""
        return len(self.prompt_lens)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of each row."""
        return np.diff(self.offsets)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (one copy of these rows)."""
        return sum(a.nbytes for a in (self.tokens, self.offsets, self.prompt_lens, self.advantages, self.engine_logprobs, self.update))

    def _response_offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths - self.prompt_lens)]).astype(np.int64)

    def sequences(self) -> list[Sequence]:
        """The rows as :class:`Sequence` (views of the arrays; for the worker's micro-batches)."""
        resp = self._response_offsets()
        out = []
        for i in range(self.rows):
            tokens = self.tokens[self.offsets[i] : self.offsets[i + 1]]
            out.append(Sequence(tokens, int(self.prompt_lens[i]), float(self.advantages[i]),
                                engine_logprobs=self.engine_logprobs[resp[i] : resp[i + 1]]))  # fmt: skip
        return out


@dataclass
class RowPlan:
    """A step's rows before any token is copied: each row's prompt and response arrays (the
    rollouts' own), its advantage and its update. :meth:`build` copies only the rows asked for."""

    prompts: list[np.ndarray]
    responses: list[RolloutPayload]
    advantages: list[float]
    update: np.ndarray  # int32 [rows]
    denominators: list[float]
    loss_scales: list[float]

    @property
    def rows(self) -> int:
        """Number of rows."""
        return len(self.responses)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of each row (prompt + response)."""
        return np.array([len(p) + len(r.tokens) for p, r in zip(self.prompts, self.responses)], dtype=np.int64)

    def build(self, rows: Seq[int] | None = None) -> StepRows:
        """These rows (default: all), in the order given, as one StepRows."""
        idx = range(self.rows) if rows is None else rows
        prompts = [self.prompts[i] for i in idx]
        responses = [self.responses[i] for i in idx]
        lengths = self.lengths[list(idx)]
        tokens = np.concatenate([a for p, r in zip(prompts, responses) for a in (p, r.tokens)]).astype(np.int32, copy=False) if prompts else np.zeros(0, np.int32)
        engine = np.concatenate([r.logprobs for r in responses]).astype(np.float32, copy=False) if responses else np.zeros(0, np.float32)
        return StepRows(tokens, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                        np.array([len(p) for p in prompts], dtype=np.int32),
                        np.array([self.advantages[i] for i in idx], dtype=np.float32), engine,
                        self.update[list(idx)].astype(np.int32), list(self.denominators), list(self.loss_scales))  # fmt: skip


def split_by_tokens(lengths: np.ndarray, update: np.ndarray, updates: int, groups: int) -> list[list[int]]:
    """Rows of each of ``groups`` DP groups: every update's rows spread so that each group has
    about the same number of tokens (longest first, each to the group with the fewest tokens;
    a group's rows keep the step's order). Every group gets at least one row of every update."""
    out: list[list[int]] = [[] for _ in range(groups)]
    for k in range(updates):
        members = np.flatnonzero(update == k)
        if len(members) < groups:
            raise ValueError(f"update {k} of the step has {len(members)} rows for {groups} data-parallel groups: "
                             "a mini-batch needs at least one sequence per DP group (raise training.mini_batch)")
        load = [0] * groups
        count = [0] * groups
        for i in sorted(members.tolist(), key=lambda i: -int(lengths[i])):
            g = min(range(groups), key=lambda g: (load[g], count[g], g))
            out[g].append(i)
            load[g] += int(lengths[i])
            count[g] += 1
    return [sorted(rows_of_group) for rows_of_group in out]
