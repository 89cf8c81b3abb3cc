"""Pilot-Commit: pilot new prompts cheaply, commit the bulk of the rollouts to survivors.

Each round binds two kinds of work into one generation call: ``pilot.n`` rollouts for each
new prompt, and ``commit_n`` rollouts for each survivor taken from the replay buffer. A
pilot's success rate p_hat decides the prompt's fate: too easy (> p_upper) is skipped this
epoch, too hard (< p_lower) is deferred to the next epoch, in the band it waits in the
buffer for its commit; p_hat >= p_evict also evicts the prompt for good. A committed
survivor trains on its kept pilot rollouts plus its commit rollouts as one group.
See docs/pilot_commit.md for the reference behaviour.

The history-aware options (``allocation.history``, off by default; docs/history_aware.md) keep
a faded Beta posterior over every prompt's success rate (:mod:`megatron_pc.allocation.history`)
and use it to size the pilot batch to demand, to screen prompts confidently outside the band,
to give a prompt its n rollouts directly when that yields more informative groups per rollout
than a pilot, and to evict by the posterior rather than one pilot. With ``history.predictor``
(the screen, docs/screen.md) a prompt's prior is predicted from its features
(:mod:`megatron_pc.allocation.predictor`) instead of being the population's, so a prompt never
seen can be screened, given its rollouts directly, or counted in the demand by its prediction.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Mapping, Sequence

from megatron_pc.allocation.base import AllocationStrategy
from megatron_pc.allocation.buffer import BufferEntry, ReplayBuffer, select_kept_pilots
from megatron_pc.allocation.config import AllocationConfig, commit_granularity
from megatron_pc.allocation.history import Posterior, PromptHistory
from megatron_pc.allocation.metadata_prior import MetadataPrior
from megatron_pc.allocation.predictor import ScreenPredictor, apart, auc, brier
from megatron_pc.allocation.types import Request, Rollout, RoundPlan, TrainGroup
from megatron_pc.errors import ConfigError


class PilotCommit(AllocationStrategy):
    """The Pilot-Commit allocation strategy."""

    name = "pilot_commit"
    evicts = True

    @classmethod
    def pilot_decision(cls, cfg: AllocationConfig, successes: int, n: int) -> str | None:
        """The keep band: above p_upper too easy, below p_lower too hard."""
        p_hat = successes / n
        return "too_easy" if p_hat > cfg.p_upper else "too_hard" if p_hat < cfg.p_lower else "keep"

    @classmethod
    def rollouts_per_call(cls, cfg: AllocationConfig) -> int:
        """A commit's rollouts: the call that completes a group draws only those."""
        return cfg.commit_rollouts

    @classmethod
    def check_config(cls, cfg: AllocationConfig, field_prefix: str = "") -> None:
        """A group is the kept pilots plus one commit (n in all), committed at least one round
        after its pilot, and the pilots of max_rounds - 1 rounds must be able to fill the batch."""

        def fail(name: str, rule: str) -> None:
            raise ConfigError(f"{field_prefix}.{name}" if field_prefix else name, rule)

        kept = cfg.pilot.kept
        if cfg.commit_n is None and kept >= cfg.n:
            fail("pilot.n_effective", f"kept pilot rollouts ({kept}) must be < n ({cfg.n}) to leave room for a commit")
        if cfg.pilot_kept + cfg.commit_rollouts != cfg.n:
            fail("commit_n", f"pilot.n_effective ({kept}) + commit_n ({cfg.commit_rollouts}) must equal n ({cfg.n}), "
                             "the group size shared with GRPO and DAPO")  # fmt: skip
        if cfg.max_rounds < 2:
            fail("max_rounds", "must be >= 2 for pilot_commit: a survivor is committed one round after its pilot")
        if cfg.pilot.batch * (cfg.max_rounds - 1) < cfg.train_batch:
            fail("pilot.batch", f"pilot.batch x (max_rounds - 1) = {cfg.pilot.batch * (cfg.max_rounds - 1)} prompts can never fill "
                                f"train_batch ({cfg.train_batch}) even if every pilot survives")  # fmt: skip
        if cfg.buffer.capacity is not None and cfg.buffer.capacity < cfg.train_batch // (cfg.max_rounds - 1):
            fail("buffer.capacity", f"{cfg.buffer.capacity} is too small to fill train_batch within max_rounds")
        m = short_pilot(cfg)
        if m:
            if m >= min(cfg.pilot.n, cfg.n):
                fail("history.short_pilot", f"{m} must be < pilot.n ({cfg.pilot.n}) and < n ({cfg.n}): it is the smaller pilot (0: none)")
            if not _keepable(cfg, m):
                fail("history.short_pilot", f"no count of {m} lands in the keep band [{cfg.p_lower}, {cfg.p_upper}]: a short pilot could never be kept")

    @classmethod
    def _rank_rules(cls, cfg: AllocationConfig, ranks: int) -> Iterator[tuple[str, str]]:
        """Pilots must split evenly; commits are trimmed to multiples that do, so the train
        batch must be such a multiple or it could never fill."""
        if (cfg.pilot.batch * cfg.pilot.n) % ranks:
            yield "pilot.batch", f"pilot.batch x pilot.n = {cfg.pilot.batch * cfg.pilot.n} rollouts must divide evenly over {ranks} generation engines"
        step = commit_granularity(cfg.commit_rollouts, ranks)
        if cfg.train_batch % step:
            yield "train_batch", (f"with commit_n={cfg.commit_rollouts} over {ranks} generation engines, commits come in multiples of {step}; "
                                  f"train_batch ({cfg.train_batch}) must be a multiple of {step} or the batch can never fill")
        m = short_pilot(cfg)
        sizes = {"pilot.n": cfg.pilot.n, "commit_n": cfg.commit_rollouts, "history.short_pilot": m, "n - history.short_pilot": cfg.n - m}
        if m and any(v % ranks for v in sizes.values()):
            # Commits of two sizes: a round's rollouts divide evenly whichever survivors the buffer gives.
            yield "history.short_pilot", f"with short pilots every request size ({', '.join(f'{k} = {v}' for k, v in sizes.items())}) must be a multiple of the {ranks} generation engines (history.short_pilot=0: no short pilots)"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffer = ReplayBuffer(self.cfg.buffer, seed=self._rng.randrange(2**31))
        self._committing: list[BufferEntry] = []
        self.history = PromptHistory(self.cfg.history.half_life) if self.cfg.history.active else None
        self._planned: dict[int, dict[str, Any]] = {}  # prompt -> what the plan predicted (history on)
        self.predictor = ScreenPredictor(self.cfg.history) if self.cfg.history.predictor else None
        self._calibration: list[tuple[float, float, bool]] = []  # this step's pilots: (p_keep, population p_keep, kept)
        self.meta: MetadataPrior | None = None  # allocation.history.metadata: made by set_prompt_metadata

    def set_prompt_metadata(self, keys: Sequence[str]) -> None:
        super().set_prompt_metadata(keys)
        if self.cfg.history.metadata:
            h = self.cfg.history
            assert self.buckets is not None
            self.meta = MetadataPrior(self.bucket_names, self.buckets, h.recency_half_life, h.metadata_shrink, h.metadata_min_judged)

    # ---- features ----------------------------------------------------------------------
    @property
    def lookahead(self) -> int:
        """New prompts whose features are asked for in advance."""
        h = self.cfg.history
        if h.lookahead is not None:
            return h.lookahead
        return 4 * (max(h.pilot_floor, math.ceil(h.max_new_factor * self.cfg.pilot.batch)) if h.demand_pilots else self.cfg.pilot.batch)

    def feature_requests(self) -> list[int]:
        if self.predictor is None:
            return []
        return self.predictor.wanted(self.pool.peek(self.lookahead), self.step)

    def observe_features(self, features: Mapping[int, Any], step: int) -> None:
        if self.predictor is None:
            super().observe_features(features, step)
            return
        self.predictor.add_features(features, step)
        self.acct.add("features_received", len(features))

    # ---- planning ----------------------------------------------------------------------
    def _plan_requests(self) -> list[Request]:
        if self.history is not None:
            return self._plan_with_history()
        # A step that crosses an epoch boundary must not pilot (and so commit) a prompt that is
        # already in its batch: the new epoch draws every prompt again.
        in_batch = {g.prompt for g in self.batch}
        for attempt in range(2):
            # The second attempt: this epoch has nothing left to pilot but prompts of the batch.
            if self.pool.remaining == 0 or attempt == 1:
                self._end_epoch()
            pilots = self.pool.draw(self.cfg.pilot.batch, exclude=in_batch)
            wanted = min(self.cfg.train_batch - len(self.batch), len(self.buffer))
            n_pilots, n_commits = fit_round_to_ranks(len(pilots), self.cfg.pilot.n, wanted, self.cfg.commit_rollouts, self.ranks)
            # Pilots are trimmed only for the short last draw of an epoch (full pilot batches
            # divide evenly, validated): the trimmed ones are skipped this epoch, not lost.
            pilots = pilots[:n_pilots]
            if n_pilots or n_commits:
                break
        self.acct.add("prompts_drawn", n_pilots)
        self._committing = self.buffer.take(n_commits)
        self.acct.add("buffer_pops", len(self._committing))
        return [Request(p, self.cfg.pilot.n, "pilot") for p in pilots] + [
            Request(e.prompt, self.cfg.commit_rollouts, "commit") for e in self._committing
        ]

    def _plan_with_history(self) -> list[Request]:
        """A round under the history-aware options: commits as always; new prompts drawn one by
        one and each screened, piloted or given its n rollouts directly by its posterior, until
        the expected survivors meet the demand (or ``pilot.batch`` prompts are drawn)."""
        cfg, h, history = self.cfg, self.cfg.history, self.history
        assert history is not None
        if self.pool.remaining == 0:
            self._end_epoch()
        in_batch = {g.prompt for g in self.batch}
        wanted = min(cfg.train_batch - len(self.batch), len(self.buffer))
        room = cfg.train_batch - len(self.batch) - wanted  # groups this step needs beyond the commits
        if h.demand_pilots:
            # Survivors the next round will want: the rest of this step, else the next step's batch,
            # less what stays in the buffer.
            demand = (room if room > 0 else cfg.train_batch) - (len(self.buffer) - wanted)
            limit = max(h.pilot_floor, math.ceil(h.max_new_factor * cfg.pilot.batch))
        else:
            demand, limit = math.inf, cfg.pilot.batch
        floor = min(h.pilot_floor, limit) if h.demand_pilots else limit
        prior = history.prior(self.step)
        predictor = self.predictor
        if h.metadata and self.meta is None:
            raise ConfigError("allocation.history.metadata", "this run gave the strategy no record metadata (set_prompt_metadata was not called)")
        population = history.population_moments(self.step) if self.meta is not None else None
        fresh = self._fresh_value(Posterior(prior[0], prior[1], 0.0)) if h.sized else 0.0
        new: list[Request] = []
        expected, scanned, directs, epoch_ends = 0.0, 0, 0, 0
        while len(new) < limit and (expected < demand or len(new) < floor) and scanned < 20 * limit:
            got = self.pool.draw(1, exclude=in_batch) if self.pool.remaining else []
            if not got:
                if new or wanted or epoch_ends:
                    break  # the epoch has run out: the next round starts the next one
                self._end_epoch()  # nothing to do this round but prompts of the batch: a new epoch
                epoch_ends += 1
                wanted, room = 0, cfg.train_batch - len(self.batch)  # the epoch end dropped the buffer
                if h.demand_pilots:
                    demand = room
                continue
            prompt, scanned = got[0], scanned + 1
            predicted, own_prior, calibrated = None, prior, False
            if predictor is not None:
                predicted = predictor.prediction(prompt, self.step)
                if predicted is not None:
                    own_prior = predictor.prior(prompt, self.step) or prior
                    calibrated = predictor.calibrated(prompt, self.step)
                    self.acct.add("prompts_predicted")
                elif not predictor.has_features(prompt):
                    self.acct.add("prompts_featureless")
            source = "predictor" if predicted is not None else "population"
            owed = False
            if self.meta is not None and population is not None:
                # The bucket's prior once it is calibrated; before, the prediction if there is one, else the
                # bucket's prior all the same (shrunk toward the population, it is no worse than it).
                bucket_ready = self.meta.calibrated(prompt, self.step)
                if bucket_ready or predicted is None:
                    own_prior, calibrated, source = self.meta.prior(prompt, self.step, population), bucket_ready, "metadata"
                    self.acct.add("prompts_bucket_prior")
                owed = self.meta.owed(prompt)  # the coverage guard: this epoch still owes the bucket a pilot
            post = history.posterior(prompt, self.step, own_prior)
            p_keep = post.p_keep(cfg.pilot.n, cfg.p_lower, cfg.p_upper)
            pop_post = post if own_prior is prior else history.posterior(prompt, self.step, prior)
            pop_keep = pop_post.p_keep(cfg.pilot.n, cfg.p_lower, cfg.p_upper) if pop_post is not post else p_keep
            explored = False
            # A calibrated prediction stands for evidence: a prompt never seen may be screened by it, when
            # it sets the prompt apart from the pool (on a pool where every pilot is a long shot, screening
            # them all would leave nothing to train on).
            by_prediction = source != "population" and calibrated and apart(post.mean, pop_post.mean, h.screen_relative)
            if h.screen and not owed and (post.evidence >= h.min_evidence or by_prediction) and p_keep <= 1.0 - h.confidence:
                explored = self._rng.random() < h.explore
                if not explored:
                    self._screen(prompt, post, p_keep, predicted, pop_post.mean, source)
                    continue
            p_direct = post.p_informative(cfg.n)
            if h.sized:
                kind, size = self._sized(post, p_keep, p_direct, fresh)
            elif h.direct_commit and p_direct / cfg.n > p_keep / (cfg.pilot.n + p_keep * cfg.commit_rollouts):
                kind, size = "full", cfg.n
            else:
                kind, size = "pilot", cfg.pilot.n
            if kind == "full":
                if directs >= room:  # the step has no room for it: it waits for a later round
                    self.pool.undraw(1)
                    break
                directs += 1
                expected += p_direct if size == cfg.n else post.p_informative(size)
            else:
                if size != cfg.pilot.n:  # a short pilot: its keep chances are those of its own size
                    p_keep = post.p_keep(size, cfg.p_lower, cfg.p_upper)
                    pop_keep = pop_post.p_keep(size, cfg.p_lower, cfg.p_upper) if pop_post is not post else p_keep
                expected += p_keep
            new.append(Request(prompt, size, kind))
            self._planned[prompt] = {"p_keep": p_keep, "p_informative": round(p_direct, 4), "explore": explored}
            if predictor is not None or self.meta is not None:
                self._planned[prompt].update(predicted_p=predicted, p_keep_population=pop_keep)
            if self.meta is not None:
                self._planned[prompt].update(prior_source=source, prior_mean=round(own_prior[0] / (own_prior[0] + own_prior[1]), 4), owed=owed)
        n_commits = wanted
        while True:  # every round's rollouts divide evenly over the generation engines
            rollouts = sum(r.n for r in new)
            n_commits = next((k for k in range(wanted, -1, -1) if (rollouts + k * cfg.commit_rollouts) % self.ranks == 0), -1)
            if n_commits >= 0 or not new:
                break
            self._planned.pop(new.pop().prompt)  # trimmed: skipped this epoch, as a short last draw is
        self.acct.add("prompts_drawn", len(new))
        self.acct.add("prompts_direct", sum(1 for r in new if r.kind == "full"))
        self.acct.add("prompts_direct_large", sum(1 for r in new if r.kind == "full" and r.n > cfg.n))
        self.acct.add("prompts_short_pilot", sum(1 for r in new if r.kind == "pilot" and r.n != cfg.pilot.n))
        self.acct.add("prompts_explored", sum(1 for r in new if self._planned[r.prompt]["explore"]))
        self._committing = self.buffer.take(max(n_commits, 0))
        self.acct.add("buffer_pops", len(self._committing))
        # A survivor's commit completes its group: n less the pilot rollouts it keeps (a short pilot keeps all).
        return new + [Request(e.prompt, cfg.n - len(e.kept), "commit") for e in self._committing]

    def _best_new(self, post: Posterior, p_keep: float, p_direct: float) -> tuple[float, str, int]:
        """(informative groups per rollout, kind, size) of the best way to spend a new prompt's first
        rollouts: a pilot, n rollouts directly (history-aware Pilot-Commit's direct rule) and, with
        ``sized``, a short pilot. A kept pilot's group is informative (the band excludes all alike)."""
        cfg = self.cfg
        options = [(p_keep / (cfg.pilot.n + p_keep * cfg.commit_rollouts), "pilot", cfg.pilot.n), (p_direct / cfg.n, "full", cfg.n)]
        m = short_pilot(cfg)
        if m:
            q = post.p_keep(m, cfg.p_lower, cfg.p_upper)
            options.append((q / (m + q * (cfg.n - m)), "pilot", m))
        return max(options, key=lambda o: o[0])  # ties: the first listed, the full pilot

    def _fresh_value(self, fresh: Posterior) -> float:
        """Informative groups per rollout a prompt drawn fresh from the pool is expected to give
        (under the population prior): what the extra rollouts of a larger group could buy instead."""
        cfg = self.cfg
        return self._best_new(fresh, fresh.p_keep(cfg.pilot.n, cfg.p_lower, cfg.p_upper), fresh.p_informative(cfg.n))[0]

    def _sized(self, post: Posterior, p_keep: float, p_direct: float, fresh: float) -> tuple[str, int]:
        """Sized counts: (kind, size) of a pilot, a short pilot, n rollouts directly, or
        ``large_factor`` x n directly. The first three as :meth:`_best_new` chooses them
        (informative groups per rollout); n becomes the larger group when its extra rollouts add
        more informative groups per rollout than the same rollouts spent on prompts drawn fresh
        (``fresh``, :meth:`_fresh_value`): the marginal rule of a knapsack whose items are
        rollouts. It pays for a prompt the posterior puts at a low but nonzero rate when the
        population prior says fresh prompts are poor (a hard pool)."""
        cfg = self.cfg
        _, kind, size = self._best_new(post, p_keep, p_direct)
        large = cfg.history.large_factor * cfg.n
        if kind == "full" and (post.p_informative(large) - p_direct) / (large - cfg.n) > fresh:
            return kind, large
        return kind, size

    def _screen(self, prompt: int, post: Posterior, p_keep: float, predicted: float | None = None, pop_mean: float | None = None,
                source: str | None = None) -> None:  # fmt: skip
        """Not piloted this epoch: the posterior says its pilot would land outside the band."""
        n = self.cfg.pilot.n
        pmf = post.predictive(n)
        below = sum(q for k, q in enumerate(pmf) if k / n < self.cfg.p_lower)
        above = sum(q for k, q in enumerate(pmf) if k / n > self.cfg.p_upper)
        too_hard = below >= above
        if too_hard:
            self.pool.defer(prompt)
        self.acct.add("prompts_screened")
        self.trace.emit(
            {"event": "screen", "step": self.step, "round": self.round, "prompt": prompt, "p_keep": p_keep,
             "mean": round(post.mean, 4), "evidence": round(post.evidence, 3), "outcome": "too_hard" if too_hard else "too_easy",
             **({"predicted_p": predicted, "population_mean": round(pop_mean, 4) if pop_mean is not None else None}
                if self.predictor is not None or self.meta is not None else {}),
             **({"prior_source": source} if self.meta is not None else {})}  # fmt: skip
        )

    # ---- observing ---------------------------------------------------------------------
    def _observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        committing = iter(self._committing)
        self._committing = []
        for req, rollouts in zip(plan.requests, results):
            if req.kind == "pilot":
                self._classify_pilot(plan, req, list(rollouts))
            elif req.kind == "full":
                self._direct(plan, req, list(rollouts))
            else:
                self._commit(plan, req, next(committing), list(rollouts))
        self._planned.clear()
        if self.predictor is not None:
            self.predictor.flush(self.step)

    def _observe_history(self, prompt: int, successes: int, n: int) -> dict[str, Any]:
        """Add the rollouts to the prompt's history; the trace fields of the decision it informs."""
        assert self.history is not None
        h = self.cfg.history
        self.history.observe(prompt, successes, n, self.step)
        fields = dict(self._planned.get(prompt, {}))
        if self.predictor is not None:
            self.predictor.observe(prompt, successes, n, fields.get("predicted_p"))
        if self.meta is not None:  # pilots and directs: a commit is of a survivor only, which would bias the bucket
            self.meta.observe(prompt, successes, n, self.step)
        if h.posterior_evict:
            post = self.history.posterior(prompt, self.step, self.history.prior(self.step))
            prob = post.p_above(h.evict_level) if post.evidence >= h.min_evidence and post.mean > h.evict_level / 2 else 0.0
            fields["evict_prob"] = prob
        return fields

    def _evict_by(self, p_hat: float, fields: dict[str, Any]) -> bool:
        if self.history is not None and self.cfg.history.posterior_evict:
            return fields["evict_prob"] >= self.cfg.history.confidence
        return p_hat >= self.cfg.p_evict

    def _direct(self, plan: RoundPlan, req: Request, rollouts: list[Rollout]) -> None:
        """A prompt given its n rollouts at once: trained if its rewards differ, else judged like a pilot."""
        cfg = self.cfg
        group = TrainGroup(req.prompt, rollouts, self.step)
        p_hat = group.successes / group.size
        fields = self._observe_history(req.prompt, group.successes, group.size)
        if group.informative:
            decision = "keep"
            self.batch.append(group)
            self.acct.add("direct_trained")
        elif p_hat < cfg.p_lower:
            decision = "too_hard"
            self.pool.defer(req.prompt)
        else:
            decision = "too_easy" if p_hat > cfg.p_upper else "zero_variance"
        evict = self._evict_by(p_hat, fields)
        if evict:
            self.pool.evict(req.prompt)
            self.acct.add("prompts_evicted")
        self.trace.emit(
            {"event": "direct", "step": plan.step, "round": plan.round, "prompt": req.prompt, "n": req.n,
             "successes": group.successes, "decision": decision, "evict": evict, **fields}  # fmt: skip
        )

    def _classify_pilot(self, plan: RoundPlan, req: Request, rollouts: list[Rollout]) -> None:
        cfg = self.cfg
        successes = [r.correct for r in rollouts].count(True)
        p_hat = successes / len(rollouts)
        self.acct.add("prompts_piloted")
        if p_hat > cfg.p_upper:
            decision = "too_easy"  # skipped: the epoch has drawn it already
        elif p_hat < cfg.p_lower:
            decision = "too_hard"
            self.pool.defer(req.prompt)
        else:
            decision = "keep"
            # A short pilot (sized counts) keeps all its rollouts; a full one pilot.n_effective of them.
            kept = select_kept_pilots(rollouts, cfg.pilot_kept if len(rollouts) == cfg.pilot.n else len(rollouts), cfg.pilot.keep)
            self.acct.add("buffer_overflow", self.buffer.push(req.prompt, self.step, successes, len(rollouts), kept))
            self.acct.add("buffer_adds")
        self.acct.add(f"prompts_{decision}" if decision != "keep" else "prompts_kept")
        fields = self._observe_history(req.prompt, successes, len(rollouts)) if self.history is not None else {}
        if (self.predictor is not None or self.meta is not None) and "p_keep_population" in fields:
            self._calibration.append((fields["p_keep"], fields["p_keep_population"], decision == "keep"))
        evict = self._evict_by(p_hat, fields)
        if evict:
            self.pool.evict(req.prompt)
            self.acct.add("prompts_evicted")
        self.trace.emit(
            {
                "event": "pilot",
                "step": plan.step,
                "round": plan.round,
                "prompt": req.prompt,
                "n": req.n,
                "successes": successes,
                "decision": decision,
                "evict": evict,
                **fields,
            }
        )

    def _commit(self, plan: RoundPlan, req: Request, entry: BufferEntry, rollouts: list[Rollout]) -> None:
        group = TrainGroup(req.prompt, entry.kept + rollouts, self.step, pilot_step=entry.pilot_step, n_pilot=len(entry.kept))
        self.batch.append(group)
        successes = [r.correct for r in rollouts].count(True)
        if self.history is not None:
            self.history.observe(req.prompt, successes, len(rollouts), self.step)
        if self.predictor is not None:
            self.predictor.observe(req.prompt, successes, len(rollouts), None)
        self.trace.emit(
            {"event": "commit", "step": plan.step, "round": plan.round, "prompt": req.prompt, "n": req.n, "pilot_step": entry.pilot_step,
             "successes": successes}  # fmt: skip
        )

    # ---- housekeeping ------------------------------------------------------------------
    def _end_step(self) -> int:
        # strict: nothing waiting may be older than max_age at the next step's commits; the
        # reference drops by this step's age, so one more step of age passes.
        dropped = self.buffer.drop_older_than(self.step + 1 if self.cfg.buffer.age_rule == "strict" else self.step)
        self.acct.add("buffer_age_evictions", dropped)
        if self.predictor is not None:  # features are kept for prompts drawn soon and those waiting for a commit
            self.predictor.prune({e.prompt for e in self.buffer.entries()} | set(self.pool.peek(self.lookahead)))
        return dropped

    def _on_epoch_end(self) -> None:
        self.acct.add("buffer_epoch_drops", self.buffer.clear())
        if self.meta is not None:
            self.meta.end_epoch()

    def _buffer_size(self) -> int:
        return len(self.buffer)

    def _extra_gauges(self, groups: list[TrainGroup]) -> dict[str, float]:
        ages = [g.step - g.pilot_step for g in groups if g.pilot_step is not None]
        out = {"offpolicy_age_mean": sum(ages) / len(ages) if ages else 0.0, "offpolicy_age_max": max(ages, default=0)}
        if self.history is not None:
            out.update(self._screen_gauges())
        return out

    def _screen_gauges(self) -> dict[str, float]:
        """The step's shares of new prompts screened / given their rollouts directly / piloted, and
        (predictor on) the calibration of the keep predictions of the prompts piloted this step,
        made before their pilots were seen, beside the population prior's. Ends the step's record."""
        step = self.acct.step
        direct, screened = step.get("prompts_direct", 0), step.get("prompts_screened", 0)
        judged = step.get("prompts_drawn", 0) + screened
        out = {
            "share_screened": screened / judged if judged else 0.0,
            "share_direct": direct / judged if judged else 0.0,
            "share_piloted": (judged - screened - direct) / judged if judged else 0.0,
        }
        if self.predictor is not None or self.meta is not None:
            p_keep, p_pop, kept = (list(v) for v in zip(*self._calibration)) if self._calibration else ([], [], [])
            self._calibration = []
            out.update(
                screen_scored=len(kept), screen_brier=_finite(brier(p_keep, kept)), screen_auc=_finite(auc(p_keep, kept)),
                screen_brier_population=_finite(brier(p_pop, kept)), screen_auc_population=_finite(auc(p_pop, kept)),
            )  # fmt: skip
        if self.predictor is not None:
            out.update(predictor_strength=self.predictor.strength, predictor_fit_weight=self.predictor.fit_weight)
        return out

    def _shortfall_hint(self) -> str:
        return (
            f"Too few pilots land in the keep band [{self.cfg.p_lower}, {self.cfg.p_upper}]: the data are too hard "
            "or too easy for the policy, or the band is too narrow (allocation.p_lower / allocation.p_upper)."
        )

    def _extra_state(self) -> dict[str, Any]:
        history = {"history": self.history.state_dict()} if self.history is not None else {}
        if self.predictor is not None or self.meta is not None:
            history["screen"] = {"predictor": self.predictor.state_dict() if self.predictor is not None else None,
                                 "calibration": [list(c) for c in self._calibration]}  # fmt: skip
        if self.meta is not None:
            history["metadata"] = self.meta.state_dict()
        return {"buffer": self.buffer.state_dict(), **history}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])
        if self.history is not None:
            if "history" not in state:
                raise ValueError("allocation.history is on but the checkpoint holds no prompt history (it was saved without it)")
            self.history.load_state_dict(state["history"])
        if self.predictor is not None:
            if "screen" not in state or state["screen"]["predictor"] is None:
                raise ValueError("allocation.history.predictor is on but the checkpoint holds no predictor state (it was saved without it)")
            self.predictor.load_state_dict(state["screen"]["predictor"])
        if self.predictor is not None or self.meta is not None:
            self._calibration = [(float(a), float(b), bool(k)) for a, b, k in state["screen"]["calibration"]]
        if self.cfg.history.metadata:
            if self.meta is None:
                raise ValueError("allocation.history.metadata is on but the strategy was given no record metadata before its state was loaded")
            if "metadata" not in state:
                raise ValueError("allocation.history.metadata is on but the checkpoint holds no metadata priors (it was saved without them)")
            self.meta.load_state_dict(state["metadata"])


def short_pilot(cfg: AllocationConfig) -> int:
    """The short pilot's size when sized counts may give one (``history.sized``), else 0. Its
    default (``history.short_pilot`` None) is a quarter of ``pilot.n`` where such a pilot can be kept."""
    h = cfg.history
    if not (h.active and h.sized):
        return 0
    if h.short_pilot is not None:
        return h.short_pilot
    m = cfg.pilot.n // 4
    return m if 0 < m < min(cfg.pilot.n, cfg.n) and _keepable(cfg, m) else 0


def _keepable(cfg: AllocationConfig, m: int) -> bool:
    """Some count of ``m`` pilot rollouts lands in the keep band."""
    return any(cfg.p_lower <= k / m <= cfg.p_upper for k in range(m + 1))


def _finite(x: float) -> float | None:
    """None for an undefined figure (no pilot this step, or one class only): metrics leave it out."""
    return x if math.isfinite(x) else None


def fit_round_to_ranks(n_pilots: int, pilot_n: int, n_commits: int, commit_n: int, ranks: int) -> tuple[int, int]:
    """Largest (pilots, commits) <= the wanted ones whose rollouts divide evenly over ``ranks``.

    All pilots are kept when some number of commits evens the round out (always so for a full
    pilot batch, which is validated to divide evenly); otherwise pilots are trimmed too.
    """
    for p in range(n_pilots, -1, -1):
        for k in range(n_commits, -1, -1):
            if (p * pilot_n + k * commit_n) % ranks == 0:
                return p, k
    return 0, 0
