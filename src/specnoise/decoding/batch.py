"""Batches: B prompts decoded together, each row by its own drafter and verifier, every model forward batched.

Each row runs the ordinary decode loop (``Decoder.decode``) in a thread of its own, on *row views* of batched
engines: a row's forward hands its block to the scheduler and waits. The scheduler lets one row run at a time (a
baton, so rows never race and the run is reproducible), and once every unfinished row waits on a forward it runs
them as one batched forward per model: the draft model's first while any row still drafts, so the target's verify
forwards gather as many rows as possible. Drafters and the verifier stay batch-unaware: a drafter written for one
prompt decodes batches unchanged, and each row's tokens are its batch-1 tokens (the verifier's rule is per row).

The KV (``BatchKV``): one cache per model holds the rows along the batch dimension. Row r's accepted tokens sit at
physical slots [0, len_r). A forward appends every row's block after the longest row, right-aligned (pads in front:
one logits_to_keep serves all rows), with the row's own positions and a mask that shows each row only its own prefix
and block. Before the next forward, each row's surviving new slots (what ``crop`` / ``compact`` kept, tracked on the
host) are moved down next to its prefix in one indexed copy per layer, and the cache is cut to the longest row: holes
never accumulate, so the cache spans the longest live row plus one block. Finished rows are dropped from the cache
(dynamic engine), or, on the static engine whose batch size is part of the bucket, fed as pads until the live rows
fit the next smaller batch bucket, when they move into a cache of that size. Batched forwards run eagerly (a
compiling static engine compiles its batch-1 forwards only).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from transformers import DynamicCache, StaticCache

from specnoise.decoding.kv import Clock, DynamicEngine, Engine, as_ids, causal_block
from specnoise.decoding.static_kv import StaticEngine, capacity_for
from specnoise.numerics import numerics


def bucket(n: int) -> int:
    """The static engine's batch bucket for ``n`` rows: the next power of two."""
    return 1 << (n - 1).bit_length()


class BatchKV:
    """The batched cache of one model for ``rows`` rows. ``engine``: the model's single-row engine (its model, dtype,
    buckets and compile setting). ``priority``: lower runs first when rows wait on several models."""

    def __init__(self, engine: Engine, rows: int, scheduler: Scheduler, need: int, priority: int):
        self.engine, self.scheduler, self.priority = engine, scheduler, priority
        self.model, self.device, self.dtype = engine.model, engine.device, engine.dtype
        self.static = isinstance(engine, StaticEngine)
        self.clock, self.forwards = Clock(self.device), 0
        self.lens = [0] * rows  # each row's logical length
        self.fixed = [0] * rows  # slots [0, fixed) of the row sit at their own index
        self.tail: list[list[int]] = [[] for _ in range(rows)]  # physical slots of logical fixed, fixed + 1, ...
        self.at: dict[int, int] = {r: r for r in range(rows)}  # row -> batch index in the cache
        self.done: set[int] = set()
        self.phys = 0  # physical slots used in every row
        if self.static:
            self.capacity = capacity_for(need + engine.buckets[-1], engine.max_length, engine.buckets[-1])
            self.width = bucket(rows)
        self.cache = self._new_cache()

    def _new_cache(self):
        if self.static:
            return StaticCache(config=self.model.config, max_cache_len=self.capacity)
        return DynamicCache(config=self.model.config)

    def row(self, r: int) -> RowEngine:
        return RowEngine(self, r)

    # ---------------------------------------------------------------------------------- a row's bookkeeping
    def slot(self, r: int, k: int) -> int:
        return k if k < self.fixed[r] else self.tail[r][k - self.fixed[r]]

    def remap(self, r: int, start: int, keep: list[int]) -> None:
        """Row r keeps logical slots [0, start) and then ``keep``; nothing moves until the next forward."""
        head = min(start, self.fixed[r])
        tail = [self.slot(r, k) for k in range(head, start)] + [self.slot(r, k) for k in keep]
        while tail and tail[0] == head:  # slots already in place
            head, tail = head + 1, tail[1:]
        self.fixed[r], self.tail[r], self.lens[r] = head, tail, start + len(keep)

    def finish(self, r: int) -> None:
        self.done.add(r)

    # ---------------------------------------------------------------------------------- the batched forward
    @torch.inference_mode()
    def forward(self, requests: dict[int, tuple]) -> dict[int, torch.Tensor]:
        """One forward over every row's block: ``requests[row] = (tokens, positions, tree, last)``; returns each row's
        logits (float32, its last ``last`` rows or all)."""
        self._tidy()
        blocks = {r: as_ids(t, self.device).view(-1) for r, (t, *_) in requests.items()}
        Q = max(b.numel() for b in blocks.values())
        if self.static:
            Q = next((b for b in self.engine.buckets if b >= Q), Q)
        B, P = (self.width if self.static else len(self.at)), self.phys
        width = self.capacity if self.static else P + Q
        ids = torch.zeros(B, Q, dtype=torch.long, device=self.device)
        pos = torch.zeros(B, Q, dtype=torch.long, device=self.device)
        lens = torch.zeros(B, dtype=torch.long)
        for r, b in self.at.items():
            lens[b] = self.lens[r]
        # every query row sees its row's prefix and itself; a real row's block also sees by its tree
        seen = torch.arange(width) < lens[:, None]  # [B, width]
        keep = seen[:, None, :].repeat(1, Q, 1)
        keep[:, torch.arange(Q), P + torch.arange(Q)] = True
        rows_kept = 1
        for r, block in blocks.items():
            b, q = self.at[r], block.numel()
            _, positions, tree, last = requests[r]
            ids[b, Q - q:] = block
            pos[b] = self.lens[r]
            pos[b, Q - q:] = (torch.arange(self.lens[r], self.lens[r] + q, device=self.device) if positions is None
                              else as_ids(positions, self.device).view(-1))
            keep[b, Q - q:, P + Q - q:P + Q] = causal_block(q) if tree is None else tree.cpu()
            rows_kept = max(rows_kept, q if last is None else min(last, q))
        mask = torch.zeros(B, 1, Q, width, dtype=self.dtype)
        mask.masked_fill_(~keep[:, None], torch.finfo(self.dtype).min)
        mask = mask.to(self.device)
        # eager, also on a compiling static engine: a batch's cache lives for one group, and a compiled forward over
        # it would be traced again for every group (a per-engine batched cache is the fix)
        with numerics(self.model), self.clock.timing():
            logits = self._call(ids, pos, mask, None if self.static else rows_kept)[:, -rows_kept:]
        self.forwards += 1  # (a static cache's offsets advanced by Q: the block sits at P..P+Q in every row)
        out = {}
        for r, block in blocks.items():
            b, q = self.at[r], block.numel()
            last = requests[r][3]
            n = q if last is None else min(last, q)
            out[r] = logits[b, rows_kept - n:].float()
            self.tail[r] += list(range(P + Q - q, P + Q))
            self.lens[r] += q
        self.phys = P + Q
        return out

    def _call(self, ids, pos, mask, rows_kept):
        kwargs = {self.engine.cache_kw: self.cache, "use_cache": True}
        if rows_kept is not None and self.engine._can_keep_last:
            kwargs["logits_to_keep"] = rows_kept
        return self.model(input_ids=ids, position_ids=pos, attention_mask=mask, **kwargs).logits

    def _offsets(self) -> list[torch.Tensor]:
        return [layer.cumulative_length for layer in self.cache.layers]

    @torch.inference_mode()
    def _tidy(self) -> None:
        """Before a forward: drop finished rows, move each row's kept slots next to its prefix, cut to the longest."""
        if self.done:
            self._drop()
        moves = [(self.at[r], self.fixed[r] + i, s) for r in self.at for i, s in enumerate(self.tail[r])]
        if moves:
            b, dst, src = (torch.tensor(v, device=self.device) for v in zip(*moves))
            for layer in self.cache.layers:
                layer.keys[b, :, dst] = layer.keys[b, :, src]
                layer.values[b, :, dst] = layer.values[b, :, src]
        for r in self.at:
            self.fixed[r], self.tail[r] = self.lens[r], []
        longest = max((self.lens[r] for r in self.at), default=0)
        if longest < self.phys:
            if self.static:
                torch._foreach_add_(self._offsets(), longest - self.phys)
            else:
                self.cache.crop(longest - self.phys)  # a negative count: tokens to remove
            self.phys = longest

    def _drop(self) -> None:
        live = sorted(r for r in self.at if r not in self.done)
        gone = [r for r in self.at if r in self.done]
        for r in gone:
            del self.at[r]
        self.done.clear()
        if not self.phys:  # nothing cached yet
            self.at = {r: i for i, r in enumerate(live)}
            if self.static:
                self.width = bucket(max(len(live), 1))
            return
        if self.static and len(live) > self.width // 2:
            return  # the finished rows stay, fed pads, until the live ones fit a smaller bucket
        index = torch.tensor([self.at[r] for r in live], device=self.device)
        if self.static:
            old, self.width = self.cache, bucket(max(len(live), 1))
            self.cache = self._new_cache()
            self._allocate()
            for new, layer in zip(self.cache.layers, old.layers):
                new.keys[:len(live), :, :self.phys] = layer.keys[index, :, :self.phys]
                new.values[:len(live), :, :self.phys] = layer.values[index, :, :self.phys]
            torch._foreach_add_(self._offsets(), self.phys)
        else:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.at = {r: i for i, r in enumerate(live)}

    def _allocate(self) -> None:
        """Initialise a fresh static cache's tensors (batch ``width``) with one pad forward, then forget its slot."""
        B = self.width
        mask = torch.zeros(B, 1, 1, self.capacity, dtype=self.dtype, device=self.device)
        mask[..., 1:] = torch.finfo(self.dtype).min
        zeros = torch.zeros(B, 1, dtype=torch.long, device=self.device)
        self._call(zeros, zeros, mask, None)
        torch._foreach_add_(self._offsets(), -1)


class RowEngine:
    """One row of a ``BatchKV`` behind the engine interface the drafters and the verifier use. Its forwards go through
    the scheduler (they return once the batched forward ran); crop and compact only re-map slots on the host."""

    graphs = False  # a row's verify steps run eagerly: CUDA graphs are recorded for one row at a time only

    def __init__(self, kv: BatchKV, row: int):
        self.kv, self.r = kv, row
        engine = kv.engine
        self.device, self.dtype = engine.device, engine.dtype
        self.vocab_size, self.max_length = engine.vocab_size, engine.max_length
        self.model, self.cache_kw = engine.model, engine.cache_kw
        self.forwards = 0

    @property
    def length(self) -> int:
        return self.kv.lens[self.r]

    @property
    def seconds(self) -> float:
        return self.kv.clock.seconds

    def forward(self, tokens, positions=None, tree=None, last=None) -> torch.Tensor:
        self.forwards += 1
        return self.kv.scheduler.request(self.r, self.kv, (tokens, positions, tree, last))

    def crop(self, n: int) -> None:
        if n < self.length:
            self.kv.remap(self.r, n, [])

    def compact(self, start: int, keep: list[int], src: torch.Tensor | None = None) -> None:
        self.kv.remap(self.r, start, list(keep))

    def move(self, start: int, src) -> None:
        src = src.tolist() if isinstance(src, torch.Tensor) else list(src)
        n = self.length
        self.kv.remap(self.r, start, src + list(range(start + len(src), n)))

    def reserve(self, n: int) -> None:
        """Sized when the batch was built."""

    def reset(self) -> None:
        """Each batch starts on fresh rows."""

    def graph(self, fn):
        return fn


class Aborted(Exception):
    """Another row failed: this row's generation stops."""


class Scheduler:
    """Runs each row's generation in a thread, one row at a time, and batches the forwards they wait on."""

    def __init__(self):
        self.waiting: dict[int, tuple[BatchKV, tuple]] = {}
        self.results: dict[int, torch.Tensor] = {}
        self.aborted = False

    def request(self, row: int, kv: BatchKV, args: tuple) -> torch.Tensor:
        """A row's forward: hand the baton back and wait for the batched forward's result."""
        self.waiting[row] = (kv, args)
        self._yield(row)
        if self.aborted:
            raise Aborted
        return self.results.pop(row)

    def _yield(self, row: int) -> None:
        self.back.set()
        self.go[row].wait()
        self.go[row].clear()

    def resume(self, row: int) -> None:
        """Let ``row`` run until it waits on a forward or ends."""
        self.back.clear()
        self.go[row].set()
        self.back.wait()

    def run(self, bodies: list[Callable[[], None]], kvs: list[BatchKV]) -> None:
        n = len(bodies)
        self.go, self.back = [threading.Event() for _ in range(n)], threading.Event()
        errors: dict[int, BaseException] = {}
        ended: set[int] = set()

        def thread(r: int) -> None:
            self.go[r].wait()
            self.go[r].clear()
            try:
                if self.aborted:
                    raise Aborted
                with torch.inference_mode():
                    bodies[r]()
            except Aborted:
                pass
            except BaseException as e:  # noqa: BLE001 - re-raised by the main thread
                errors[r] = e
            ended.add(r)
            for kv in kvs:
                kv.finish(r)
            self.back.set()

        threads = [threading.Thread(target=thread, args=(r,), daemon=True) for r in range(n)]
        for t in threads:
            t.start()
        try:
            for r in range(n):
                self.resume(r)
            while self.waiting and not errors:
                kv = min({kv for kv, _ in self.waiting.values()}, key=lambda k: k.priority)
                rows = sorted(r for r, (k, _) in self.waiting.items() if k is kv)
                self.results.update(kv.forward({r: self.waiting[r][1] for r in rows}))
                for r in rows:
                    del self.waiting[r]
                    self.resume(r)
        finally:
            if len(ended) < n:  # an error (in a row or here): end every row
                self.aborted = True
                for r in range(n):
                    if r not in ended:
                        self.resume(r)
            for t in threads:
                t.join()
        if errors:
            raise errors[min(errors)]


def batch_kv(engine: Engine, rows: int, scheduler: Scheduler, need: int, priority: int) -> BatchKV:
    """The batched cache for ``rows`` rows of ``engine``'s model (a dynamic or a static one, like the engine)."""
    if not isinstance(engine, (DynamicEngine, StaticEngine)):
        raise TypeError(f"cannot batch {type(engine).__name__}")
    return BatchKV(engine, rows, scheduler, need, priority)
