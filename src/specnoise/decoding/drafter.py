"""A drafter: what a decoder proposes for the shared verifier to check (base.py's loop runs it; each method is one
small file that subclasses ``Drafter``). It proposes a token tree after the newest accepted token (``propose``), learns
from the verdict (``observe``), and under ``decoder.auto`` lets the controller (auto.py) size its proposal (``cut``,
``select``, ``idle``) and prices its draft model's work (``draft_cost``, ``catch_up``).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import torch

from specnoise.decoding.cost import TREE
from specnoise.decoding.proposal import Proposal, chain_shape
from specnoise.decoding.verifier import Verdict


class Drafter:
    """Proposes what the verifier checks. ``begin`` starts a generation; ``propose(room)`` returns a ``Proposal`` whose
    tree lets at most ``room`` drafts be emitted (deeper nodes could never be: the budget ends first); ``observe``
    takes the verdict (``v.done``: the output is complete, nothing more will be proposed). ``seq`` is the accepted
    context (prompt + emitted tokens). Engines are the decoder's (``target``, ``draft``), reads go through
    ``read`` (counted: at most one per model forward)."""

    name: ClassVar[str]
    needs_draft: ClassVar[bool] = False
    # drafts drawn from a draft model's distribution (verified by rejection sampling): under sampling the output keeps
    # the target distribution but not AR's tokens for a seed; every other drafter's guesses reproduce AR's tokens
    sampled_drafts: ClassVar[bool] = False

    @classmethod
    def draws_drafts(cls, cfg) -> bool:
        """Whether this drafter, under ``cfg``, samples its drafts (a drafter whose config chooses: Ouroboros)."""
        return cls.sampled_drafts

    def __init__(self, cfg, decoder):  # a base.Decoder (which imports this module)
        self.cfg, self.decoder = cfg, decoder
        self.seq: list[int] = []
        self.meta: dict = {}  # what a run records about the drafter's choices (results.json meta)

    @property
    def target(self):
        return self.decoder.target

    @property
    def draft(self):
        return self.decoder.draft

    def read(self, tensor: torch.Tensor):
        return self.decoder.to_host(tensor)

    def cut(self, n: int, stream: str | None = None, kind: str = TREE, extra: int = 0,
            cuts: list[int] | None = None, parents: list[int] | None = None) -> int:
        """How many of this step's ``n`` candidates, a prefix of their order (parents first), to propose: ``n`` itself
        (the faithful size) unless ``decoder.auto`` is on, then the controller's choice (auto.py; 0: a plain AR step).
        ``stream``: which statistics (default the drafter's name), ``kind``: the verify forward (CHAIN or TREE),
        ``extra``: rows fed beside the candidates when k > 0, ``cuts``: the sizes allowed (default 0..n),
        ``parents``: the candidates' tree, parent index per node, -1 = the root (default a chain)."""
        auto = self.decoder.auto
        return n if auto is None else auto.size(stream or self.name, n, kind, extra, cuts, parents)

    def select(self, parents: list[int], stream: str | None = None,
               allow: list[bool] | None = None) -> list[int] | None:
        """Which nodes of a template tree (``parents``: parent index per node, -1 = the root; ``allow``: the nodes that
        may be chosen) to verify: None (all) unless ``decoder.auto`` is on, then the controller's pick, ascending."""
        auto = self.decoder.auto
        return None if auto is None else auto.select(stream or self.name, parents, TREE, 0, allow)

    def idle(self, parents: list[int] | None, stream: str | None = None) -> bool:
        """decoder.auto: whether this step is an AR step before its candidates are looked for (``parents``: the tree of
        the last step's candidates; auto.py ``Controller.idle``). False without auto."""
        auto = self.decoder.auto
        return auto is not None and auto.idle(stream or self.name, parents)

    # decoder.auto: explore ever more rarely while explorations do not pay (auto.py); False for a drafter whose next
    # candidates come from the target's predictions at the nodes it verified (an exploration feeds it)
    backoff = True

    def draft_cost(self, stream: str, k: int) -> float:
        """Seconds a draft model spends drafting ``k`` tokens (decoder.auto weighs it against the accepted tokens)."""
        return 0.0

    def catch_up(self, stream: str) -> float:
        """Seconds the draft model needs, beyond ``draft_cost``, to be fed the text it has not seen before it drafts."""
        return 0.0

    def draft_price(self, q: float, kind: str, context: float | None = None) -> float:
        """decoder.auto: seconds of a draft forward of q tokens, as its curve prices it inside a generation (the curve's
        price times ``Decoder.draft_scale``)."""
        return self.decoder.curves["draft"](q, kind, context) * self.decoder.draft_scale

    def priced_drafting(self) -> dict:
        """The controller's ``draft_cost`` and ``catch_up``, None for a drafter without a draft model (nothing to add
        per size)."""
        if type(self).draft_cost is Drafter.draft_cost:
            return {"draft_cost": None, "catch_up": None}
        return {"draft_cost": self.draft_cost, "catch_up": self.catch_up}

    def chain(self, drafts) -> Proposal:
        """A chain of ``drafts`` (a list or a device tensor) after the root."""
        n = drafts.numel() if isinstance(drafts, torch.Tensor) else len(drafts)
        return Proposal(drafts, chain_shape(n, self.target.device))

    def setup(self) -> None:
        """Once, when the decoder is built and its engines bound (checks that need the models)."""

    def begin(self, prompt: list[int], budget: int, seed: int) -> None:
        """A generation of up to ``budget`` tokens after ``prompt``; ``seed``: the generation's (sampling drafters
        seed their own draws with it and the prompt)."""
        self.seq = list(prompt)
        # the generation's noise (Jacobi's ahead noise, Lookahead's and Ouroboros' window), seeded per generation: a
        # row's drafts and forwards depend on its prompt and seed only, alone or in any batch, in any order
        self.noise = torch.Generator().manual_seed(seed)

    def propose(self, room: int) -> Proposal:
        raise NotImplementedError

    def propose_steps(self, room: int):
        """``propose`` as a generator of requests (kv.py ``Forward`` / ``Read``): a drafter that runs a draft model
        overrides this instead of ``propose``, yielding its draft forwards and reads, so that a batch steps every
        row's draft model in lock-step (batch.py)."""
        return self.propose(room)
        yield  # a generator that requests nothing

    def observe(self, v: Verdict) -> None:
        self.seq += v.tokens

    def after_generation(self) -> None:
        """A generation ended (tree=auto learns from it)."""

    def reset_history(self) -> None:
        """Forget state kept across prompts (Ouroboros' phrase pool); no-op for the others."""

    # the attributes a drafter keeps across prompts (``history``): Token Recycling's matrix, Ouroboros' phrase pool
    kept: tuple[str, ...] = ()

    def history(self) -> dict:
        """A copy of what this drafter keeps across prompts (``Decoder.history``)."""
        return {name: copy.deepcopy(getattr(self, name)) for name in self.kept}

    def restore(self, saved: dict) -> None:
        """Back to a ``history`` copy, which stays usable for the next restore; a tensor is refilled in place (device
        hooks and recorded graphs hold it)."""
        for name, value in saved.items():
            current = getattr(self, name)
            if isinstance(current, torch.Tensor):
                current.copy_(value)
            else:
                setattr(self, name, copy.deepcopy(value))

    def fork(self, decoder) -> Drafter:
        """This drafter for one row of a batch (``decoder``: the row's), set up already: state kept across prompts
        is the row's own from here on (each row's drafts then depend on its own prompts only), the rest is shared."""
        clone = copy.copy(self)
        clone.decoder = decoder
        return clone
