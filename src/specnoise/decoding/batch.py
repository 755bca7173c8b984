"""Batches: B prompts decoded together in lock-step, each row by its own drafter and verifier; every model forward and
every host read is batched, and no thread runs.

Each row runs the ordinary decode loop as a generator (``Decoder.steps``): where a row alone would run a forward or read
the device, it yields the request (kv.py ``Forward``, ``Read``) and waits for the reply. ``lockstep`` moves every row on
to its next request, then serves one kind of request for every row waiting on it, the cheapest first: draft model
forwards while any row still drafts, then verifications, then reads, then the target's forward. A step of the batch is
therefore: each row's drafter proposes (draft models stepped together, one batched forward per draft token over the rows
still drafting: on the dynamic engine the others are not computed, ``SKIP_IDLE``; the static engine, whose batch size is
part of its compiled shapes, feeds them pads), one batched target forward over every row's proposal (padded to the
step's largest block), the rows' verifications on the device (the verifier's ``Check``: the greedy rows judged in one
function, their proposals padded to the step's largest shape, each drafter's hook once per group of rows that share it:
``verifier.judge_rows``), ONE host read for the whole batch (every row's verdict tensor in one copy), then each row's
``observe``. Drafters stay batch-unaware: a drafter written for one prompt decodes batches unchanged, and each row's
tokens are its batch-1 tokens (the verifier's rule is per row: a row judged with others gets its verdict alone).

The KV (``BatchKV``): one cache per model holds the rows along the batch dimension. Row r's accepted tokens sit at
physical slots [0, len_r). A forward appends every row's block after the longest row, right-aligned (pads in front:
one logits_to_keep serves all rows), with the row's own positions and a mask that shows each row only its own prefix
and block (built on the device from one upload of the rows' lengths). Before the next forward, each row's surviving
new slots (what ``crop`` / ``compact`` kept, tracked on the host) are moved down next to its prefix in one indexed
copy per layer, and the cache is cut to the longest row: rejected slots are overwritten by the next block, holes
never accumulate, and every row's memory is the longest live row plus the step's largest block (the cache is one
rectangular tensor per layer). The group's first forward, where padding every row to the longest prompt would feed
``PAD_SPLIT`` times the rows' own tokens or more, feeds each row alone on the dynamic engine (``prefill_rows``).
Finished rows are dropped from the cache (dynamic engine), or, on the static engine whose batch size is part of the
bucket, fed as pads until the live rows fit the next smaller batch bucket, when they move into that bucket's cache.
The static engine keeps one cache per batch bucket for its life (``StaticEngine.batch_cache``), so a compiling engine
compiles each (batch bucket, block bucket) forward once, the first time a batch meets it, outside the batch's clock
and time, and on CUDA replays it as a CUDA graph; a block of no bucket's size (a prefill) runs eagerly. Every forward
keeps only the logits the rows need (``logits_to_keep``; a compiled one all of its block's, at most rows x the largest
bucket): a prefill never builds B x prompt x vocab logits.

Continuous batching (``lockstep``'s ``refill``, ``Decoder.generate_batch``'s ``slots``): a row whose generator ends
takes its next prompt at once; the row restarts empty (``BatchKV.restart``) and its prompt is fed alone, its KV
written into the row's slots (``BatchKV.fresh``), while the other rows go on. The dynamic engine only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specnoise.decoding.kv import (
    Clock,
    DynamicEngine,
    Engine,
    Forward,
    Read,
    as_ids,
    attention_mask,
    cache_holding,
    causal_block,
    dense_cache,
    log_entry,
    upload,
)
from specnoise.decoding.static_kv import StaticEngine
from specnoise.decoding.verifier import Check, judge_rows
from specnoise.numerics import numerics

# the order rows' requests are served in, the first waiting kind first (a forward's: its BatchKV's priority): draft
# forwards, the verifications, the reads, the target's forwards, so each kind serves every row that will ask for it
DRAFT_FORWARDS, CHECKS, READS, TARGET_FORWARDS = 0, 1, 2, 3
# a group's first forward feeds each row alone (``BatchKV.prefill_rows``) where padding every row to the longest would
# feed at least this many times the rows' own tokens
PAD_SPLIT = 1.5
# a forward that only some rows ask for (a draft model's, while some rows still draft) runs on the dynamic engine over
# those rows alone: their KV gathered (one indexed copy per layer), the forward, their KV put back. On the 2-core CPU
# faithful Ouroboros' draft forwards, 23% pad rows at B = 4 and 38% at B = 16, took 20% and 29% less time, its
# generations 15% and 23% (experiments/batch-scaling/tiny/idle-rows.md); False: every live row computed, as pads
SKIP_IDLE = True


PAD = ([0], None, None, 1)  # a request that feeds a row one pad token (``BatchKV.forward``: its reply is dropped)


def bucket(n: int) -> int:
    """The static engine's batch bucket for ``n`` rows: the next power of two."""
    return 1 << (n - 1).bit_length()


class BatchKV:
    """The batched cache of one model for ``rows`` rows. ``engine``: the model's single-row engine (its model, dtype,
    buckets and compile setting); ``need``: slots a row may hold (prompt + budget). ``priority``: lower runs first
    when rows wait on several models (the draft model's 0, the target's 2)."""

    def __init__(self, engine: Engine, rows: int, need: int, priority: int = 0):
        if not isinstance(engine, (DynamicEngine, StaticEngine)):
            raise TypeError(f"cannot batch {type(engine).__name__}")
        self.engine, self.priority = engine, priority
        self.model, self.device, self.dtype = engine.model, engine.device, engine.dtype
        self.static = isinstance(engine, StaticEngine)
        self.clock, self.forwards = Clock(self.device), 0
        self.lens = [0] * rows  # each row's logical length
        self.fixed = [0] * rows  # slots [0, fixed) of the row sit at their own index
        self.tail: list[list[int]] = [[] for _ in range(rows)]  # physical slots of logical fixed, fixed + 1, ...
        self.at: dict[int, int] = {r: r for r in range(rows)}  # row -> batch index in the cache
        self.done: set[int] = set()
        self.single: DynamicEngine | None = None  # rows fed alone (``_alone``), one engine reset per row
        self.phys = 0  # physical slots used in every row
        if self.static:  # the engine's cache of the batch bucket: compiled forwards serve every group's
            self.bucket, self.need = bucket(rows), need  # batch rows of the static cache
            self.cache = engine.batch_cache(self.bucket, need)
            self.capacity = engine.capacity
        else:
            self.cache = dense_cache(self.model.config)  # a sliding-window model's too: its layers could not be cut

    def row_engine(self, r: int) -> RowEngine:
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

    def restart(self, r: int) -> None:
        """Row r, its prompt finished, takes a new one (``lockstep``'s refill): it holds nothing, its old slots are past
        its length (never seen, overwritten by later blocks), and its next forward, the new prompt, is fed alone
        (``fresh``)."""
        self.lens[r] = self.fixed[r] = 0
        self.tail[r] = []

    # ---------------------------------------------------------------------------------- the batched forward
    @torch.inference_mode()
    def forward(self, requests: dict[int, tuple]) -> dict[int, torch.Tensor]:
        """One forward over every row's block: ``requests[row] = (tokens, positions, tree, last[, prefix])``; returns
        each row's logits (float32, its last ``last`` rows or all). Rows without a request are left out on the dynamic
        engine (``SKIP_IDLE``), fed pads on the static one."""
        self._tidy()
        out = self.fresh(requests) if self.phys and not self.static else {}
        if out:  # refilled rows' prompts, fed alone; the other rows' blocks below, beside a pad for each of these
            if len(out) == len(requests):
                return out
            # (left out instead, the other rows' KV was gathered and put back: two copies of the cache per refill,
            # at B = 16 continuous AR ran 10% slower than lock-step groups)
            requests = {r: PAD if r in out else request for r, request in requests.items()}
        blocks = {r: as_ids(t, self.device).view(-1) for r, (t, *_) in requests.items()}
        Q = max(b.numel() for b in blocks.values())
        if (not self.static and not self.phys and set(blocks) == set(self.at)
                and len(blocks) * Q >= PAD_SPLIT * sum(b.numel() for b in blocks.values())):
            return self.prefill_rows(requests)
        if self.static:
            Q = next((b for b in self.engine.buckets if b >= Q), Q)
        # the others not computed (before the first forward the cache has no layers to gather: pads then)
        few = not self.static and self.phys > 0 and len(blocks) < len(self.at) and SKIP_IDLE
        at = {r: b for b, r in enumerate(sorted(blocks, key=self.at.__getitem__))} if few else self.at
        B, P = (self.bucket if self.static else len(at)), self.phys
        lens = [0] * B
        for r, b in at.items():
            lens[b] = self.lens[r]
        # the one upload of a forward (pinned, without waiting): the rows' lengths, and with rows left out the
        # asking rows' places in the cache
        uploaded = upload(lens + ([self.at[r] for r in at] if few else []), self.device)
        cached, index = uploaded[:B], uploaded[B:]
        ids = torch.zeros(B, Q, dtype=torch.long, device=self.device)
        pos = cached[:, None].repeat(1, Q)  # pads sit at their row's length
        keep = torch.eye(Q, dtype=torch.bool, device=self.device).repeat(B, 1, 1)  # pads see only themselves
        rows_kept = 1
        for r, block in blocks.items():
            b, q = at[r], block.numel()
            _, positions, tree, last = requests[r][:4]
            ids[b, Q - q:] = block
            pos[b, Q - q:] = (torch.arange(self.lens[r], self.lens[r] + q, device=self.device) if positions is None
                              else as_ids(positions, self.device).view(-1))
            keep[b, Q - q:, Q - q:] = causal_block(q, self.device) if tree is None else tree.to(self.device)
            rows_kept = max(rows_kept, q if last is None else min(last, q))
        mask = attention_mask(cached, keep, P, self.capacity if self.static else P + Q, self.dtype)
        with numerics(self.model):
            if self.static:  # a shape met for the first time is compiled now, outside the clock
                self.engine.prepare_batch(self.cache, ids, pos, mask)
            with self.clock.timing():
                if few:
                    cache = self._rows_cache(index)
                    logits = self._call(ids, pos, mask, rows_kept, cache)
                    self._put_back(cache, index, Q)
                else:
                    logits = self._call(ids, pos, mask, rows_kept)
        self.forwards += 1  # (a static cache's offsets advanced by Q: the block sits at P..P+Q in every row)
        for r, block in blocks.items():
            if requests[r] is PAD:  # (its slot past the row's length: never seen, overwritten)
                continue
            b, q = at[r], block.numel()
            last = requests[r][3]
            n = q if last is None else min(last, q)
            out[r] = logits[b, rows_kept - n:].float()
            self.tail[r] += list(range(P + Q - q, P + Q))
            self.lens[r] += q
        self.phys = P + Q
        return out

    def prefill_rows(self, requests: dict[int, tuple]) -> dict[int, torch.Tensor]:
        """The group's first forward, each row's block fed alone (as at batch 1, ``DynamicEngine.forward``), its KV
        written to slots [0, q) of its row of the batch's cache: one forward in the counts and the clock. Padded to the
        longest, a Spec-Bench group of 16 rows (14 to 1,332 prompt tokens) fed 21,312 tokens for its 5,513 and its
        prefill took 6.4 s of the batch's 7.3 on the 2-core CPU; the rows alone feed their own tokens only."""
        rows = sorted(requests, key=self.at.__getitem__)
        out, layers = {}, []
        with self.clock.timing():
            for r in rows:
                out[r], kv, q = self._alone(requests[r])
                layers.append(kv)
                self.lens[r] = self.fixed[r] = q
            Q = max(self.lens[r] for r in rows)
            stacked = []  # layer by layer, the rows' (keys, values), each [1, heads, q, dim] padded to Q
            for parts in zip(*layers):
                stacked.append(tuple(torch.cat([F.pad(part[w], (0, 0, 0, Q - part[w].shape[2])) for part in parts])
                                     for w in (0, 1)))  # (the pads: masked, never read)
            self.cache = cache_holding(stacked)
        self.phys = Q
        self.forwards += 1
        return out

    def fresh(self, requests: dict[int, tuple]) -> dict[int, torch.Tensor]:
        """The logits of the rows that hold nothing while the cache does (rows refilled with a new prompt:
        ``restart``; in a lock-step group, a row whose first forward of this model comes after the others', as a
        draft model's first catch-up can), each row's block fed alone as at batch 1 and its KV written to slots
        [0, q) of its row (the cache grown to q first where it is shorter): padded to the other rows' blocks, a
        300-token prompt would make every row of the step feed 300 tokens. Each is one forward in the counts and the
        clock."""
        out = {}
        for r in [r for r in requests if self.lens[r] == 0]:
            with self.clock.timing():
                out[r], kv, q = self._alone(requests[r])
                b = self.at[r]
                if q > self.phys:
                    for layer in self.cache.layers:
                        layer.keys = F.pad(layer.keys, (0, 0, 0, q - self.phys))
                        layer.values = F.pad(layer.values, (0, 0, 0, q - self.phys))
                    self.phys = q
                for layer, (keys, values) in zip(self.cache.layers, kv):
                    layer.keys[b, :, :q] = keys[0]
                    layer.values[b, :, :q] = values[0]
            self.lens[r] = self.fixed[r] = q
            self.forwards += 1
        return out

    def _alone(self, request: tuple) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], int]:
        """One row's block fed alone on an empty cache, as at batch 1 (``DynamicEngine.forward``: the same kernels,
        so the same logits): its logits, its KV layer by layer ((keys, values) each [1, heads, q, dim]) and q."""
        if self.single is None:
            self.single = DynamicEngine(self.model)
        self.single.reset()
        tokens, positions, tree, last, *prefix = request
        logits = self.single.forward(tokens, positions, tree, last, *prefix)
        return logits, [(layer.keys, layer.values) for layer in self.single.cache.layers], self.single.length

    def _call(self, ids, pos, mask, rows_kept, cache=None):
        if self.static:
            return self.engine.batch_forward(self.cache, ids, pos, mask, rows_kept)
        kwargs = {self.engine.cache_kw: self.cache if cache is None else cache, "use_cache": True}
        if self.engine.can_keep_last:
            kwargs["logits_to_keep"] = rows_kept
        return self.model(input_ids=ids, position_ids=pos, attention_mask=mask, **kwargs).logits[:, -rows_kept:]

    def _rows_cache(self, index: torch.Tensor) -> DynamicCache:
        """A cache of the rows at batch ``index`` only (one indexed copy per layer), built from the data alone (from
        the model's config it took ~840 us a forward on the 2-core CPU for the shipped draft model's 4 layers, 2 of 4
        rows, 200 slots, from the data ~490 us)."""
        return cache_holding([(layer.keys.index_select(0, index), layer.values.index_select(0, index))
                              for layer in self.cache.layers])

    def _put_back(self, cache, index: torch.Tensor, Q: int) -> None:
        """After a forward of the rows at ``index`` alone (``cache``: theirs, Q slots longer): every row Q slots longer,
        those rows' KV written back whole (the others' new slots are zeros, past their length: never seen)."""
        for layer, rows in zip(self.cache.layers, cache.layers):
            for name in ("keys", "values"):  # (F.pad: one op that allocates and copies, as a DynamicCache's cat does)
                grown = F.pad(getattr(layer, name), (0, 0, 0, Q))
                setattr(layer, name, grown.index_copy_(0, index, getattr(rows, name)))

    def _offsets(self) -> list[torch.Tensor]:
        return [layer.cumulative_length for layer in self.cache.layers]

    @torch.inference_mode()
    def _tidy(self) -> None:
        """Before a forward: drop finished rows, move each row's kept slots next to its prefix (one indexed copy per
        layer, its indices in one upload), cut to the longest."""
        if self.done:
            self._drop()
        moves = [(self.at[r], self.fixed[r] + i, s) for r in self.at for i, s in enumerate(self.tail[r])]
        if moves:
            b, dst, src = upload([list(v) for v in zip(*moves)], self.device)
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
                self.bucket = bucket(max(len(live), 1))
                self.cache = self.engine.batch_cache(self.bucket, self.need)
            return
        if self.static and len(live) > self.bucket // 2:
            return  # the finished rows stay, fed pads, until the live ones fit a smaller bucket
        index = upload([self.at[r] for r in live], self.device)
        if self.static:
            old, self.bucket = self.cache, bucket(max(len(live), 1))
            self.cache = self.engine.batch_cache(self.bucket, self.need)
            for new, layer in zip(self.cache.layers, old.layers):
                new.keys[:len(live), :, :self.phys] = layer.keys[:, :, :self.phys].index_select(0, index)
                new.values[:len(live), :, :self.phys] = layer.values[:, :, :self.phys].index_select(0, index)
            torch._foreach_add_(self._offsets(), self.phys)
        else:  # (index_select: with advanced indexing a drop of a 16-row HumanEval batch took 3.9-4.3 ms, now 2-3)
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        self.at = {r: i for i, r in enumerate(live)}


class RowEngine:
    """One row of a ``BatchKV`` behind the engine interface (``engines.EngineProtocol``) that the drafters and the
    verifier use. ``lockstep`` runs its forwards batched with the other rows' (a direct ``forward`` runs this row
    alone, the others left out or fed pads); crop, compact and move only re-map slots on the host."""

    graphs = False  # a row's verify steps run eagerly: CUDA graphs are recorded for one row at a time only

    def __init__(self, kv: BatchKV, row: int):
        self.kv, self.r = kv, row
        engine = kv.engine
        self.device, self.dtype = engine.device, engine.dtype
        self.vocab_size, self.max_length = engine.vocab_size, engine.max_length
        self.model, self.cache_kw, self.can_keep_last = engine.model, engine.cache_kw, engine.can_keep_last
        self.forwards = 0
        self.forward_log: list[tuple[int, bool, int]] = []  # the row's own blocks (kv.py ``Engine.forward_log``)

    @property
    def length(self) -> int:
        return self.kv.lens[self.r]

    @property
    def seconds(self) -> float:
        return self.kv.clock.seconds

    @property
    def attended(self) -> int:
        """The longest live row's length: the batch's cache is one rectangle, so every row's forward computes its
        attention over all of it (the mask hides the slots that are not the row's)."""
        kv = self.kv
        return max((kv.lens[r] for r in kv.at if r not in kv.done), default=self.length)

    def count(self, tokens, positions=None, tree=None) -> None:
        """A forward of this row's block: counted, and logged as the row's own (pads are not the row's)."""
        self.forwards += 1
        self.forward_log.append(log_entry(tokens, positions, tree, self.length))

    def forward(self, tokens, positions=None, tree=None, last=None, prefix: int = 0) -> torch.Tensor:
        # (``prefix`` serves a group's first forward fed row by row; a batched forward carries the 4D mask)
        self.count(tokens, positions, tree)
        return self.kv.forward({self.r: (tokens, positions, tree, last, prefix)})[self.r]

    def crop(self, n: int) -> None:
        if n < self.length:
            self.kv.remap(self.r, n, [])

    def compact(self, start: int, keep: list[int], src: torch.Tensor | None = None) -> None:
        self.kv.remap(self.r, start, list(keep))

    def move(self, start: int, src: list[int]) -> None:
        """``src`` as a host list: a row's slots are tracked on the host, and a device tensor would need a read."""
        if isinstance(src, torch.Tensor):
            raise TypeError("a batch row moves slots named on the host: pass a list, not a device tensor")
        self.kv.remap(self.r, start, list(src) + list(range(start + len(src), self.length)))

    def reserve(self, n: int) -> None:
        """Sized when the batch was built."""

    def reset(self) -> None:
        """Each batch starts on fresh rows."""

    def graph(self, fn):
        return fn


# ------------------------------------------------------------------------------------------ the lock-step loop
def lockstep(steps: dict[int, Generator], kvs: list[BatchKV], read: Callable[[torch.Tensor], list],
             refill: Callable[[int], Generator | None] | None = None,
             spent: dict[int, float] | None = None, reads: dict[int, int] | None = None) -> dict[int, int]:
    """Run every row's generator of requests (``Decoder.steps``) to its end, together; returns how many host reads
    each row took part in. ``read``: the one (counted) host read, called once per batched read.

    ``refill``: continuous batching. When row r's generator ends, ``refill(r)`` gives the row's next one (its next
    prompt: the row's slots restart empty, ``BatchKV.restart``, and its prompt is fed alone, ``BatchKV.fresh``), or
    None (the row is done). ``spent``: filled with each row's share of the time (seconds, ``time.perf_counter``): its
    own generator's time, and an equal share of every batched request it was served in; ``reads``: filled with the
    host reads (the returned dict). A refill callback reads and resets its row's entries of both when a prompt ends.

    An error in a row ends the batch: the rows served in the same round still run their part, then every row still
    running is closed and the first failed row's error is raised, with a note naming its row and one per other row
    that failed. An error in a batched forward or read closes every row too."""
    waiting: dict[int, Forward | Read] = {}
    reads = reads if reads is not None else {}
    reads.update(dict.fromkeys(steps, 0))
    errors: dict[int, Exception] = {}

    clock = time.perf_counter
    spent = spent if spent is not None else {}
    for r in steps:
        spent[r] = 0.0

    def advance(r: int, reply) -> None:
        start = clock()
        while True:
            try:
                waiting[r] = steps[r].send(reply)
                break
            except StopIteration:
                pass
            except Exception as e:  # noqa: BLE001 - raised below, once the round is over
                errors[r] = e
            waiting.pop(r, None)
            spent[r] += clock() - start
            nxt = refill(r) if refill is not None and r not in errors else None
            start = clock()
            if nxt is None:
                del steps[r]
                for kv in kvs:
                    kv.finish(r)
                return
            steps[r], reply = nxt, None
            for kv in kvs:
                kv.restart(r)
        spent[r] += clock() - start

    def priority(request) -> int:
        if isinstance(request, Forward):
            return request.engine.kv.priority
        return CHECKS if isinstance(request, Check) else READS

    try:
        for r in list(steps):
            advance(r, None)
        while waiting and not errors:
            served = clock()
            first = min(waiting.values(), key=priority)
            if isinstance(first, Check):
                rows = sorted(r for r, q in waiting.items() if isinstance(q, Check))
                replies = judge_rows([waiting[r] for r in rows])
            elif isinstance(first, Read):
                rows = sorted(r for r, q in waiting.items() if isinstance(q, Read))
                replies = read_together([waiting[r].tensor for r in rows], read)
                for r in rows:
                    reads[r] += 1
            else:
                kv = first.engine.kv
                rows = sorted(r for r, q in waiting.items() if isinstance(q, Forward) and q.engine.kv is kv)
                for r in rows:
                    request = waiting[r]
                    request.engine.count(request.tokens, request.positions, request.tree)
                logits = kv.forward({r: waiting[r][1:6] for r in rows})  # (tokens, positions, tree, last, prefix)
                replies = [logits[r] for r in rows]
            share = (clock() - served) / len(rows)
            for r in rows:
                spent[r] += share
            for r, reply in zip(rows, replies):
                advance(r, reply)
    finally:
        for gen in steps.values():  # rows still running after an error
            gen.close()
    if errors:
        failed = sorted(errors)
        error = errors[failed[0]]
        error.add_note(f"(in row {failed[0]} of a batch of {len(reads)})")
        for r in failed[1:]:
            error.add_note(f"row {r} failed too: {type(errors[r]).__name__}: {errors[r]}")
        raise error
    return reads


def read_together(tensors: list[torch.Tensor], read: Callable[[torch.Tensor], list]) -> list:
    """Each tensor's ``tolist()``, from one host read per dtype (in practice one: every verdict is a long tensor)."""
    replies: list = [None] * len(tensors)
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        which = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        values = read(torch.cat([tensors[i].reshape(-1) for i in which]))
        at = 0
        for i in which:
            t, n = tensors[i], tensors[i].numel()
            chunk, at = values[at:at + n], at + n
            replies[i] = chunk[0] if t.dim() == 0 else chunk if t.dim() == 1 else \
                torch.tensor(chunk, dtype=dtype).view(t.shape).tolist()  # host values: no device read
    return replies
