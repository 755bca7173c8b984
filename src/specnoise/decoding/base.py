"""Decoders: a drafter plus the shared verifier, and the output contract every decoder keeps.

A decoder turns prompt token ids into new token ids. Ours are all one loop (``Decoder.decode``): the drafter
proposes a token tree, the verifier checks it in one target forward and commits the KV, the accepted tokens go to
``out.emit``, the drafter observes what was accepted. A drafter is one small file (drafter.py ``Drafter``:
``begin``, ``propose``, ``observe``); the verifier (verifier.py) owns greedy and sampling acceptance, the engine (kv.py,
static_kv.py) owns the cache. ``Output`` enforces the canonical contract so no decoder re-implements it: tokens up
to and including the first EOS-set token, or ``max_new_tokens`` tokens, whichever comes first, even when either
falls inside an accepted draft. The Hugging Face ``generate()`` peers (hf.py) override ``decode`` instead.
"""

from __future__ import annotations

import copy
import importlib
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from specnoise.config import DECODER_SCHEMAS
from specnoise.decoding.auto import STICKY, Controller
from specnoise.decoding.batch import DRAFT_FORWARDS, TARGET_FORWARDS, BatchKV, lockstep
from specnoise.decoding.calibration import DraftScale, StepTimer, StepTimes, probed_here
from specnoise.decoding.cost import Curve
from specnoise.decoding.drafter import Drafter
from specnoise.decoding.engines import engine_for
from specnoise.decoding.kv import DynamicEngine, drive, sync, upload
from specnoise.decoding.plan import Batched, Plan
from specnoise.decoding.verifier import Verifier
from specnoise.errors import UserError


@dataclass
class DecodeOutput:
    tokens: list[int]  # new tokens after the canonical cut
    target_forwards: int
    draft_forwards: int = 0
    accepted: list[int] = field(default_factory=list)  # tokens emitted by each target forward that emitted
    seconds: float = 0.0
    host_reads: int = 0  # device-to-host reads (``Decoder.to_host``), draft loop included
    target_seconds: float | None = None  # of ``seconds``, inside target forwards (None: not measured, the peers)
    draft_seconds: float | None = None  # of ``seconds``, inside draft-model forwards
    # rows decoded together (``Decoder.generate_batch``); seconds, target_seconds and draft_seconds are then this
    # row's equal share of the group's, so sums over a group's rows give the group's wall time
    batch_size: int = 1
    # the target's and the draft model's forwards, each (tokens fed, with a mask, tokens cached before it): a batched
    # row's own blocks; what the cost bound prices (bench/bound.py). None: not logged (the peers, a run read back
    # without them)
    forward_log: list[tuple[int, bool, int]] | None = None
    draft_forward_log: list[tuple[int, bool, int]] | None = None

    @property
    def mean_accepted(self) -> float:
        return len(self.tokens) / max(self.target_forwards, 1)


class Output:
    """Collects emitted tokens under the canonical cut; ``done`` turns True at EOS or budget."""

    def __init__(self, eos_ids: frozenset[int], max_new_tokens: int):
        self.eos_ids, self.budget = eos_ids, max_new_tokens
        self.tokens: list[int] = []
        self.accepted: list[int] = []
        self.done = max_new_tokens <= 0

    def emit(self, block: list[int]) -> list[int]:
        """Append one step's accepted tokens (drafts + bonus); returns what was actually kept."""
        kept = []
        for tok in block:
            if self.done:
                break
            kept.append(int(tok))
            self.done = tok in self.eos_ids or len(self.tokens) + len(kept) >= self.budget
        self.tokens.extend(kept)
        self.accepted.append(len(kept))
        return kept


LONG_CONTEXT = 1024  # decoder.auto's curve is probed over a context at least this long (Curve caps it to the model's)
BATCH_REACH = 512  # ... and a batch's that reaches past it over a longer one, rounded up to a multiple of this


def largest_probe(kv) -> int:
    """The largest proposal decoder.auto prices at batch 1 on engine ``kv``: its cost curve is probed up to here."""
    return min(128, kv.max_length // 2)


class Decoder:
    """A drafter over the verifier (or, for the generate() peers, a ``decode`` of its own), named by its config.

    target / draft: ``specnoise.models.LoadedModel`` (model + tokenizer + EOS set); their engines come from
    ``engines.engine_for`` (one per model and role, shared by the job's decoders)."""

    drafter_class: ClassVar[type[Drafter] | None] = None
    batch = 1  # rows decoded together (a row of ``generate_batch`` says its batch's)
    max_batch_size: ClassVar[int | None] = None  # the most prompts ``generate_batch`` takes (None: any)
    needs_draft: ClassVar[bool] = False  # the drafter's (or a peer's) need of a draft model

    def __init__(self, cfg, target, draft=None):
        self.cfg, self.target_model, self.draft_model = cfg, target, draft
        self.name = cfg.name
        if cfg.temperature > 0 and not cfg.samples:
            raise UserError(f"decoder={self.name} is greedy-only: set decoder.temperature=0")
        if self.needs_draft and draft is None:
            raise UserError(f"decoder={self.name} needs a draft model: set draft=NAME or pair=NAME")
        self.eos_ids = target.eos_ids
        self.host_reads = 0
        self.row_slots: list[Decoder] = []  # generate_batch's rows, kept across calls (``row_decoders``)
        self.batch_meta: dict | None = None  # the drafter choices of the last batch's first row
        self.auto: Controller | None = None  # decoder.auto: built on the first generation (its curve is probed then)
        self.curves: dict[str, Curve] = {}  # decoder.auto: t(q) of the target ("target") and the draft ("draft")
        # ... and of their lock-step forward of B rows, per B and context
        self.batch_curves: dict[tuple[str, int, int], Curve] = {}
        # ... and the factor it prices draft forwards by: their measured over their priced time, relative to the
        # target's (``calibrate``; 1 for a pinned curve, whose prices a committed study reproduces as they are)
        self.draft_scale, self.scales = 1.0, None  # (scales: a DraftScale from the first calibrated generation)
        self.drafter = self.drafter_class(cfg, self) if self.drafter_class is not None else None
        self.bind(engine_for(target), engine_for(draft, "draft") if self.needs_draft else None)
        if self.drafter is not None:
            self.drafter.setup()

    def bind(self, target, draft=None) -> None:
        """Run on these engines (tests bind recording engines)."""
        self.target, self.draft = target, draft
        self.verifier = Verifier(target, self.to_host, self.cfg if self.cfg.temperature > 0 else None)

    @property
    def meta(self) -> dict:
        """The drafter's choices (after a batch, its first row's: tree=auto picks per row)."""
        if self.drafter is None:
            return {}
        return self.batch_meta or self.drafter.meta

    def to_host(self, tensor: torch.Tensor) -> list | int | float:
        """The one way a decoder reads device values: each call is a host-device sync on a GPU, so a step
        gathers what it needs (accepted tokens, guesses, flags) into one tensor and reads it once."""
        self.host_reads += 1
        return tensor.tolist()

    def decode(self, prompt: list[int], out: Output, seed: int) -> None:
        """Decode ``prompt`` alone: ``steps`` with each request served at once."""
        drive(self.steps(prompt, out, seed), self.to_host)

    def steps(self, prompt: list[int], out: Output, seed: int):
        """Draft, verify, emit, observe, until the output is complete, as a generator of the forwards and reads it
        needs (kv.py ``Forward`` / ``Read``): ``decode`` serves them one by one, a batch (batch.py) every row's
        together. The first step's forward is the prefill."""
        drafter, verifier, auto = self.drafter, self.verifier, self.auto
        verifier.begin(prompt, seed)
        drafter.begin(prompt, out.budget, seed)
        pending = upload(prompt, self.target.device)  # tokens without KV yet, the root last
        timer = StepTimer(self) if auto is not None and auto.times is not None else None
        while True:
            if timer is not None:
                timer.start()
            if auto is not None:
                auto.room = out.budget - len(out.tokens)  # tokens still to come (a draft model's catch-up is theirs)
                # what the step's block attends to besides itself; in a batch the longest row's, which every row's
                # attention spans: priced at their own, short rows beside a 1,100-1,400-token one in a Spec-Bench group
                # drafted as if alone, and the batch ran 0.90x batched AR at B = 4 with 1.6 tokens per step
                target = self.target
                auto.context = len(prompt) + len(out.tokens) - 1 + target.attended - target.length
            proposal = yield from drafter.propose_steps(out.budget - len(out.tokens) - 1)
            v = yield from verifier.steps(pending, proposal, base=len(out.tokens))
            if auto is not None:
                auto.observe(v)
            out.emit(v.tokens)
            v.done = out.done
            drafter.observe(v)
            if out.done:
                return
            verifier.commit(v)
            pending = v.bonus
            if timer is not None:
                timer.stop(proposal.shape.nodes > 0)

    def start_auto(self, prompt_len: int, budget: int) -> None:
        """decoder.auto: the cost curves (from a short cache to a long context: the first prompt plus half the
        budget, at least ``LONG_CONTEXT``) and the controller, once; then a new generation's size record."""
        if self.auto is None:
            cache = self.cfg.cost_cache
            # the curve prices a step at its context between the two probed ones and extends past the longer: probed
            # up to the first prompt alone (Spec-Bench's first, 62 tokens + 64) its slope was too short to read
            context = max(prompt_len + budget // 2, LONG_CONTEXT)
            self.curves["target"] = curve = Curve(self.target, context, largest_probe(self.target), cache)
            if self.draft is not None:
                # (its catch-ups feed a prompt from an empty cache: priced from a probe of that length)
                self.curves["draft"] = Curve(self.draft, context, largest_probe(self.draft), cache, reach=prompt_len)
            # a step shape is a recorded CUDA graph on a graph engine: there a template's pick changes only for a
            # clear gain (auto.STICKY)
            self.auto = Controller(curve, backoff=self.drafter.backoff,
                                   sticky=STICKY if getattr(self.target, "graphs", False) else 0.0,
                                   **self.drafter.priced_drafting())
            # its steps timed (host work, explorations' worth) where the clocks time forwards on the host and the
            # curves were probed here: a pinned curve's study reproduces its choices from the prices alone
            if probed_here(self.curves.values()) and self.target.device.type == "cpu":
                self.auto.times = StepTimes()
            for kv in filter(None, (self.target, self.draft)):
                kv.reset()
        self.auto.begin()

    def record_auto(self) -> None:
        """decoder.auto's record in the drafter's meta (results.json): the target curve, the draft's scale, the steps'
        host work (``StepTimes``) and the controller's streams."""
        curve = self.curves.get("target")
        times = self.auto.times
        self.drafter.meta["auto"] = {**(curve.describe() if hasattr(curve, "describe") else {}),
                                     **({"draft_scale": self.draft_scale} if "draft" in self.curves else {}),
                                     **(times.describe() if times is not None else {}),
                                     "streams": self.auto.describe()}

    def calibrate(self, fed: tuple[list, list]) -> None:
        """decoder.auto, after a generation (``fed``: its target and draft forwards, as logged): ``draft_scale`` from
        what its forwards took (calibration.py ``DraftScale``; the target's prefill left out). Only with a draft model
        (a curve for it), and only on curves probed on this machine: a pinned curve's prices stay as committed."""
        curves = [self.curves.get(role) for role in ("target", "draft")]
        if not probed_here(curves):
            return
        if self.scales is None:
            self.scales = DraftScale(min(largest_probe(self.target), largest_probe(self.draft)))
        self.scales.add("target", fed[0][1:], self.target.clock.laps[1:], curves[0])
        self.scales.add("draft", fed[1], self.draft.clock.laps, curves[1])
        self.draft_scale = self.scales.scale

    def start_auto_rows(self, rows: list[Decoder], reach: int) -> None:
        """decoder.auto in a batch: each row slot prices its steps at its share of the batched forward, t_B(q) / B
        (plan.py ``Batched``; the batch's shared size splits t_B into a fixed part and a part per live row with the
        batch-1 curve), with a controller of its own, kept across calls like its drafter (it starts from what
        this decoder's controller has learnt at batch 1, if anything). Each model's curve of B rows is probed on the
        batched forward once per batch size, untimed, at the batch-1 curve's contexts, and again over a longer
        context for a batch that reaches past it (``reach``: its longest prompt plus the budget; rounded up to a
        multiple of ``BATCH_REACH``, so that batches alike share a probe). Priced by a line through 16 and 1,024 cached
        tokens, a 4-row batch whose longest row held 1,222-1,286 tokens (Spec-Bench's RAG) ran 7-token blocks at 1.25x
        their price and AR steps at 1.08x, so PLD's drafts looked 15% cheaper than they were: its rows took 40 full
        steps where batched AR took 59, in the same time."""
        n = len(rows)
        curves = dict(self.curves)  # (tests price with plain functions: Batched prices them at n x q tokens)
        for role, kv in (("target", self.target), ("draft", self.draft)):
            curve = self.curves.get(role)
            if isinstance(curve, Curve):
                context = curve.key["context"]
                if reach > context:
                    context = -(-reach // BATCH_REACH) * BATCH_REACH
                if (role, n, context) not in self.batch_curves:
                    kv.reset()  # the probe starts from the engine's own cache: a batch-1 generation's would not fit
                    self.batch_curves[role, n, context] = Curve(kv, context, largest_probe(kv), self.cfg.cost_cache,
                                                                rows=n)
                curves[role] = self.batch_curves[role, n, context]
        plan = Plan()  # one size per step for all the rows
        # one Batched per model for all the rows: its prices are the same for every row (``Batched.split_list``)
        batched = {role: Batched(curve, n, self.curves.get(role)) for role, curve in curves.items()}
        for row in rows:
            row.curves = dict(batched)
            if row.auto is None:
                row.auto = Controller(row.curves["target"], backoff=row.drafter.backoff,
                                      **row.drafter.priced_drafting())
                row.auto.streams = copy.deepcopy(self.auto.streams)
            row.auto.cost = row.curves["target"]  # the batch size may change from call to call
            row.auto.plan = plan
            row.auto.begin()

    def reserve(self, n: int) -> None:
        """Generations of up to ``n`` tokens (prompt + new) follow: size static caches now, untimed."""
        for kv in filter(None, (self.target, self.draft)):
            kv.reserve(n)

    def reset_history(self) -> None:
        """Forget state kept across prompts, the batch row slots' too."""
        if self.drafter is not None:
            self.drafter.reset_history()
        for row in self.row_slots:
            row.drafter.reset_history()

    def history(self) -> list:
        """A copy of everything a generation leaves for the next ones, its batch row slots' too: the drafter's state
        kept across prompts, decoder.auto's statistics and step times, the draft model's calibration. The benchmark
        times a prompt's repeats each from its first repeat's starting point (``restore``): otherwise a repeat drafts
        from the one before it, Token Recycling's matrix and Ouroboros' pool holding the very answer (SAM with its
        fallback took 80, 58, 54, 51, 52 forwards in the five repeats of one HumanEval problem)."""
        return [(d.drafter.history() if d.drafter is not None else None,
                 copy.deepcopy((d.auto.streams, d.auto.times) if d.auto is not None else None),
                 copy.deepcopy((d.scales, d.draft_scale))) for d in (self, *self.row_slots)]

    def restore(self, saved: list) -> None:
        """Back to a ``history`` copy (row slots made since keep theirs)."""
        for d, (drafter, auto, scales) in zip((self, *self.row_slots), saved):
            if drafter is not None:
                d.drafter.restore(drafter)
            if d.auto is not None:  # (built since: by a first generation, with nothing learnt before it)
                d.auto.streams, d.auto.times = copy.deepcopy(auto) if auto is not None else ({}, d.auto.times)
            d.scales, d.draft_scale = copy.deepcopy(scales)

    def check_prompt(self, prompt, max_new_tokens: int) -> list[int]:
        """``prompt`` as a list of ints, or a UserError saying what to change (empty, or too long for the context)."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise UserError("empty prompt: a prompt needs at least one token")
        if len(prompt) + max_new_tokens > self.target.max_length:
            raise UserError(
                f"prompt of {len(prompt)} tokens + max_new_tokens={max_new_tokens} exceeds the model's context "
                f"of {self.target.max_length}: shorten the prompt or lower max_new_tokens"
            )
        return prompt

    def generate(self, prompt: list[int], max_new_tokens: int, seed: int | None = None) -> DecodeOutput:
        """Decode ``prompt``; ``seed`` (default ``decoder.seed``) with the prompt seeds every random draw, so the same
        prompt and seed give the same output in any order, in AR and every decoder."""
        prompt = self.check_prompt(prompt, max_new_tokens)
        self.batch_meta = None
        out = Output(self.eos_ids, max_new_tokens)
        for kv in filter(None, (self.target, self.draft)):
            kv.reset()
        self.reserve(len(prompt) + max_new_tokens)  # a static cache is sized (and compiled) before the clock
        if self.cfg.auto and self.drafter is not None:
            self.start_auto(len(prompt), max_new_tokens)  # the first generation probes (or loads) the curves, untimed
        self.host_reads = 0
        draft_log = self.draft.forward_log if self.draft is not None else []
        marks = len(self.target.forward_log), len(draft_log)  # (the curve's probes logged theirs)
        sync(self.target.device)
        start = time.perf_counter()
        if not out.done:
            with torch.inference_mode():  # no autograd bookkeeping; compiled forwards were traced on inference tensors
                self.decode(prompt, out, self.cfg.seed if seed is None else seed)
        sync(self.target.device)
        seconds = time.perf_counter() - start
        fed = self.target.forward_log[marks[0]:], draft_log[marks[1]:] if self.draft is not None else None
        target_seconds = draft_seconds = None  # the peers' generate() runs outside the engines' clocks
        if self.drafter is not None:
            self.drafter.after_generation()
            if self.auto is not None:
                self.calibrate(fed)
                self.record_auto()
            target_seconds, draft_seconds = self.target.seconds, self.draft.seconds if self.draft is not None else 0.0
        return DecodeOutput(
            tokens=out.tokens,
            target_forwards=self.target.forwards,
            draft_forwards=self.draft.forwards if self.draft is not None else 0,
            accepted=out.accepted,
            seconds=seconds,
            host_reads=self.host_reads,
            target_seconds=target_seconds,
            draft_seconds=draft_seconds,
            forward_log=fed[0] if self.drafter is not None else None,  # (the peers' generate() bypasses the engines)
            draft_forward_log=fed[1],
        )

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int,
                       seed: int | list[int] | None = None, slots: int | None = None) -> list[DecodeOutput]:
        """Decode ``prompts`` together, one batch in lock-step (batch.py): rows accept different numbers of tokens per
        step and end at different times, every model forward and every host read is batched. Each row's tokens are
        what ``generate`` gives its prompt alone (the same draws under sampling); its forwards and host reads are
        those it took part in (``self.host_reads``: the batch's reads); ``seconds`` (and target/draft seconds) are its
        equal share of the group's. Each row slot keeps its own drafter (``Drafter.fork``) across calls, so state kept
        across prompts (Ouroboros' pool) is per row slot. ``seed``: one for every row, or a list with each row's.

        ``slots``: continuous batching (``benchmark.queue``), fewer rows than prompts. The first ``slots``
        prompts start together; a row whose prompt ends takes the next one at once (its prompt fed alone:
        ``BatchKV.fresh``), so a step carries ``slots`` rows until the prompts run out instead of waiting for its
        slowest row. Each prompt's tokens are still ``generate``'s; its ``seconds`` are its share of the time
        (``lockstep``'s ``spent``: its row's own work, and an equal share of every batched request it was served in;
        target and draft seconds split by the same shares). The dynamic engine only."""
        prompts = [self.check_prompt(p, max_new_tokens) for p in prompts]
        n, seed = len(prompts), self.cfg.seed if seed is None else seed
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * n
        if len(seeds) != n:
            raise UserError(f"{len(seeds)} seeds for {n} prompts: give one seed, or one per prompt")
        if slots is not None and slots < n:
            if not isinstance(self.target, DynamicEngine) or self.drafter is None:
                raise UserError(f"continuous batching (benchmark.queue) runs on the dynamic engine with one of "
                                f"specnoise's decoders; {self.name} on {type(self.target).__name__} cannot: set "
                                f"model.static_cache=false and model.compile=false, or benchmark.queue=0")
        elif n == 1:
            return [self.generate(prompts[0], max_new_tokens, seeds[0])]
        else:
            slots = n
        rows = self.row_decoders(slots)
        longest = max(map(len, prompts))
        reach = longest + max_new_tokens
        if self.cfg.auto and self.drafter is not None:
            self.start_auto(longest, max_new_tokens)  # the curves, probed once (untimed)
            self.start_auto_rows(rows, reach)
        kvs = [BatchKV(self.target, slots, reach, priority=TARGET_FORWARDS)]
        if self.draft is not None:
            kvs.append(BatchKV(self.draft, slots, reach, priority=DRAFT_FORWARDS))
        for r, row in enumerate(rows):
            row.bind(kvs[0].row_engine(r), kvs[1].row_engine(r) if self.draft is not None else None)
            row.host_reads, row.batch = 0, slots
        outs = [Output(self.eos_ids, max_new_tokens) for _ in prompts]
        queue = [i for i in range(n) if not outs[i].done]
        taken: dict[int, tuple] = {}  # row -> its prompt's index, and the row's counts when the prompt started
        spent: dict[int, float] = {}  # row -> its prompt's share of the time so far (``lockstep``)
        reads: dict[int, int] = {}  # row -> its prompt's batched host reads so far
        counts: dict[int, tuple] = {}  # prompt index -> its share of the time, its reads, forwards and logs
        ended: list[int] = []  # the rows of the prompts that ended, in order (``Drafter.after_generation``)

        def start(r: int):
            """Row r's next prompt, as a generator of requests (None: the queue is empty)."""
            if not queue:
                return None
            i, row = queue.pop(0), rows[r]
            draft = (row.draft.forwards, len(row.draft.forward_log)) if row.draft is not None else (0, 0)
            taken[r] = (i, row.target.forwards, len(row.target.forward_log), *draft, row.host_reads)
            spent[r], reads[r] = 0.0, 0
            if row.auto is not None and r in ended:  # (a row's first prompt: begun by start_auto_rows)
                row.auto.begin()
            return row.steps(prompts[i], outs[i], seeds[i])

        def refill(r: int):
            """Row r's prompt ended: what it took, and the row's next prompt."""
            i, forwards, logged, draft_forwards, draft_logged, own_reads = taken.pop(r)
            row = rows[r]
            counts[i] = (spent[r], reads[r] + row.host_reads - own_reads, row.target.forwards - forwards,
                         row.draft.forwards - draft_forwards if row.draft is not None else 0,
                         row.target.forward_log[logged:],
                         row.draft.forward_log[draft_logged:] if row.draft is not None else None)
            ended.append(r)
            return start(r)

        self.host_reads = 0
        compiling = self.compile_seconds()
        sync(self.target.device)
        begin = time.perf_counter()
        try:
            with torch.inference_mode():
                steps = {r: g for r in range(slots) if (g := start(r)) is not None}
                lockstep(steps, kvs, self.to_host, refill, spent, reads)
        finally:
            for row in rows:
                row.bind(self.target, self.draft)  # tree=auto probes its engine when a generation ends
        sync(self.target.device)
        # a static engine compiles a batch shape it meets for the first time (StaticEngine.prepare_batch): not the
        # batch's time, as a batch-1 generation's compiling is not (``reserve``, before its clock)
        seconds = time.perf_counter() - begin - (self.compile_seconds() - compiling)
        target_seconds = kvs[0].clock.seconds
        draft_seconds = kvs[1].clock.seconds if self.draft is not None else 0.0
        self.host_reads += sum(row.host_reads for row in rows)  # reads a row made alone (none in a plain step)
        for r in ended:
            rows[r].drafter.after_generation()
        whole = sum(share for share, *_ in counts.values()) or 1.0
        results = []
        for i, out in enumerate(outs):
            part, host_reads, forwards, draft_forwards, log, draft_log = counts.get(i, (0.0, 0, 0, 0, [], None))
            # lock-step: the group's time in equal shares; refilled: each prompt's share (``lockstep``'s ``spent``),
            # the loop's own time between requests spread by the same shares
            w = 1 / n if slots == n else part / whole
            results.append(DecodeOutput(
                tokens=out.tokens, target_forwards=forwards, draft_forwards=draft_forwards, accepted=out.accepted,
                seconds=seconds * w, host_reads=host_reads, target_seconds=target_seconds * w,
                draft_seconds=draft_seconds * w, batch_size=slots, forward_log=log, draft_forward_log=draft_log))
        if rows[0].auto is not None:  # the first row's choices (rows share the drafter's meta dict)
            rows[0].record_auto()
        self.batch_meta = rows[0].drafter.meta
        return results

    def compile_seconds(self) -> float:
        """Seconds the engines have spent compiling (0 on an engine that does not compile)."""
        return sum(getattr(engine, "compile_seconds", 0.0) for engine in (self.target, self.draft))

    def row_decoders(self, n: int) -> list[Decoder]:
        """The first ``n`` row slots: copies of this decoder, each with its own drafter, verifier and read counter."""
        while len(self.row_slots) < n:
            row = copy.copy(self)
            row.row_slots = []  # a row has no rows of its own
            row.auto, row.curves = None, {}  # decoder.auto: the row's own controller (start_auto_rows)
            row.draft_scale = 1.0  # ... pricing its draft forwards by the batched curve alone (calibrated at batch 1)
            row.drafter = self.drafter.fork(row)
            self.row_slots.append(row)
        return self.row_slots[:n]


def decoder_module(name: str) -> str:
    """The module defining decoder option ``name``'s drafter: ``decoding/<name>.py`` (the generate() peers: hf.py)."""
    return "specnoise.decoding.hf" if name.startswith("hf_") else f"specnoise.decoding.{name}"


# decoder option -> module defining its drafter (or, for the generate() peers, its decoder), imported on first use:
# one registry, config.DECODER_SCHEMAS, and a naming rule, so the two can never disagree
DECODER_MODULES = {name: decoder_module(name) for name in DECODER_SCHEMAS}
_CLASSES: dict[str, type[Decoder]] = {}


def decoder_class(name: str) -> type[Decoder]:
    """The decoder class of option ``name``: a generate() peer's own class, or a ``Decoder`` over the drafter."""
    if name not in DECODER_MODULES:
        raise UserError(f"unknown decoder {name!r}: choose one of {', '.join(DECODER_MODULES)}")
    if name not in _CLASSES:
        module = importlib.import_module(DECODER_MODULES[name])
        found = next(c for c in vars(module).values()
                     if isinstance(c, type) and issubclass(c, (Decoder, Drafter)) and getattr(c, "name", None) == name)
        _CLASSES[name] = found if issubclass(found, Decoder) else type(
            f"{found.__name__}Decoder", (Decoder,), {"drafter_class": found, "name": name,
                                                      "needs_draft": found.needs_draft, "__doc__": found.__doc__})
    return _CLASSES[name]


def build_decoder(cfg, target, draft=None) -> Decoder:
    return decoder_class(cfg.name)(cfg, target, draft)
