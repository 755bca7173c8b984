"""The static-cache engine: the ``Engine`` interface (kv.py) over a Hugging Face ``StaticCache``, so forwards have fixed
shapes and can be compiled (``torch.compile``) and, on CUDA, recorded as one CUDA graph per bucket.

Eager decoding on a GPU waits on Python: one forward costs the same for 1 or 69 new tokens (the forward-cost curves
of experiments/gpu/README.md). This engine removes the shape changes that stop compilation:
  * one ``StaticCache`` per model, sized once (prompt + budget + the largest block, a power of two of at least
    ``MIN_CAPACITY`` slots, at most the model's context) and grown, never shrunk, when a longer generation needs it;
  * every block of up to ``BUCKETS[-1]`` tokens is padded to the next bucket size; pad tokens see only themselves
    and are never cached as valid: after the forward the write offset is set back to the true length;
  * the additive mask spans the whole static length: 0 below the length, the block's own tree mask at
    ``[length, length + block)``, the minimum everywhere else, so stale slots at or past the length are invisible;
  * crop = moving the write offset back; compaction = in-place index copies (``Engine.compact``).
Longer blocks (a long prompt's prefill) run eagerly, unpadded, on the same cache. A lock-step batch (batch.py) runs on
the engine's cache of its batch bucket (``batch_cache``: one per power of two of rows, kept for the engine's life), so
its forwards are compiled, and graphed on CUDA, once per (batch bucket, block bucket) shape it meets.

In transformers 5.17-5.24 (pyproject's range) each ``StaticLayer`` keeps its own write offset (``cumulative_length``,
a tensor with a static address) and ignores ``cache_position``; the offsets always equal ``length`` between calls,
so moving them is one fused ``_foreach_add_``. The host keeps ``length`` as a Python int: no forward or crop reads
the device.

GPU check (compiled vs eager tokens and timings, one command): ``python -m specnoise.bench.engine_check``.
"""

from __future__ import annotations

import functools
import time

import torch
from transformers import StaticCache

from specnoise.config import STATIC_BUCKETS
from specnoise.decoding.kv import Engine, Graphed, as_ids, attention_mask, causal_block
from specnoise.numerics import numerics

BUCKETS = STATIC_BUCKETS  # padded block sizes (model.static_buckets' default): one compiled graph each
MIN_CAPACITY = 256  # slots allocated at least: every forward attends over all of them, so no more than a run needs
WARMUP_CALLS = 3  # per bucket: compile, then warm-up calls before the CUDA graph is recorded


def capacity_for(need: int, context: int, block: int = BUCKETS[-1]) -> int:
    """At least ``need`` slots: a power of two of at least ``MIN_CAPACITY``, capped at the context plus one padded
    block. A benchmark reserves for its longest prompt before the first generation, so it allocates (and compiles)
    once; only a later turn of a multi-turn prompt can make the cache grow."""
    return max(need, min(max(MIN_CAPACITY, 1 << (need - 1).bit_length()), context + block))


class StaticEngine(Engine):
    """The engine over a static cache. ``compile``: ``torch.compile`` the padded forward and, on CUDA, record it as a
    CUDA graph, for every bucket, when the cache is allocated (``reserve``, before a generation's clock starts); that
    time is ``compile_seconds``."""

    def __init__(self, model: torch.nn.Module, compile: bool = False, buckets: tuple[int, ...] | None = None):
        super().__init__(model)  # checks the model
        self.cache: StaticCache | None = None  # allocated by reserve() or the first forward
        self.buckets, self.compiled = tuple(sorted(buckets or BUCKETS)), compile
        self.capacity, self._length = 0, 0
        self.compile_seconds = 0.0
        self._offsets: list[torch.Tensor] = []  # every layer's write offset; all equal self._length between calls
        self._step = self._logits
        self._graphs: dict[int, Graphed] = {}  # CUDA: per bucket, the compiled forward recorded over static inputs
        self.graphs = compile and self.device.type == "cuda"
        # lock-step batches (batch.py): a cache per batch bucket, kept for the engine's life, and per (batch bucket,
        # block bucket) its compiled forward's CUDA graph
        self._batches: dict[int, StaticCache] = {}
        self._batch_ready: set[tuple[int, int]] = set()  # compiled (batch bucket, block bucket) shapes
        self._batch_graphs: dict[tuple[int, int], Graphed] = {}
        self._batch_pool = None  # CUDA: the batch graphs' shared memory pool
        self._batch_step = self._batch_logits
        if compile:
            # one compilation per (bucket, capacity), and per (batch bucket, bucket, capacity) for batches (25 per
            # capacity at B = 16 with five block buckets): more than dynamo's default 8 of a frame
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 128)
            self._step = torch.compile(self._logits, dynamic=False)
            self._batch_step = torch.compile(self._batch_logits, dynamic=False)

    # -------------------------------------------------------------------------------------- bookkeeping
    @property
    def length(self) -> int:
        return self._length

    @torch.inference_mode()
    def reserve(self, n: int) -> None:
        """A generation of up to ``n`` tokens follows: size the cache for it (and its last padded block) now."""
        self._ensure(n + self.buckets[-1])

    def reset(self) -> None:
        self.crop(0)
        self.forwards, self.forward_log = 0, []
        self.clock.reset()

    @torch.inference_mode()  # the offsets are inference tensors
    def crop(self, n: int) -> None:
        if n < self._length:
            self._shift(n - self._length)
            self._length = n

    def _shift(self, delta: int) -> None:
        if delta:
            torch._foreach_add_(self._offsets, delta)

    # ------------------------------------------------------------------------------------------ forward
    @torch.inference_mode()
    def forward(self, tokens, positions=None, tree: torch.Tensor | None = None,
                last: int | None = None, prefix: int = 0) -> torch.Tensor:
        # (``prefix`` is ignored: every forward here, AR's prefill too, is one masked block over the allocated cache)
        ids = as_ids(tokens, self.device).view(-1)
        P, q = self._length, ids.numel()
        pos = (torch.arange(P, P + q, device=self.device) if positions is None
               else as_ids(positions, self.device).view(-1))
        keep = causal_block(q, self.device) if tree is None else tree.to(self.device)
        size = next((b for b in self.buckets if b >= q), q)  # q itself past the largest bucket: eager, unpadded
        self._ensure(P + size)
        if size > q:  # pads: token 0 at the last real position, each seeing only itself
            ids = torch.cat([ids, ids.new_zeros(size - q)])
            pos = torch.cat([pos, pos[-1:].expand(size - q)])
            padded = torch.eye(size, dtype=torch.bool, device=self.device)
            padded[:q, :q] = keep
            keep = padded
        mask = self._mask(P, keep)
        rows = slice(q - last if last is not None else 0, q)
        with numerics(self.model), self.clock.timing():  # the attention-backend / strict-numerics policy
            if size in self._graphs:
                # a copy: the next replay overwrites the graph's output
                logits = self._graphs[size](ids, pos, mask)[0, rows].to(torch.float32, copy=True)
            elif size in self.buckets:
                logits = self._step(ids, pos, mask)[0, rows].float()
            else:
                kwargs = {"logits_to_keep": last} if last is not None and self.can_keep_last else {}
                logits = self._logits(ids, pos, mask, **kwargs)[0]
                logits = (logits[-last:] if last is not None else logits).float()
        self._shift(q - size)  # the model advanced every offset by the padded size
        self._length = P + q
        self.forwards += 1
        self.forward_log.append((size, True, P))  # the model ran the padded block, always with a mask
        return logits

    def _logits(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, **kwargs) -> torch.Tensor:
        kwargs[self.cache_kw] = self.cache
        return self.model(input_ids=ids.view(1, -1), position_ids=pos.view(1, -1), attention_mask=mask,
                          use_cache=True, **kwargs).logits

    def _mask(self, P: int, keep: torch.Tensor) -> torch.Tensor:
        """[1, 1, block, capacity] additive mask: every cached slot below P, the block by ``keep``, nothing else."""
        return attention_mask(P, keep, P, self.capacity, self.dtype)

    # ------------------------------------------------------------------------------------------ the cache
    def _ensure(self, need: int) -> None:
        """Make room for ``need`` slots: allocate (and compile) on first use, grow (copying the live KV) past it."""
        if need <= self.capacity:
            return
        with numerics(self.model):  # graphs are traced under the policy the forwards will run with
            self._allocate(need)

    def _allocate(self, need: int) -> None:
        old, n = self.cache, self._length
        self.capacity = capacity_for(need, self.max_length, self.buckets[-1])
        # the batch caches were sized for the old capacity: allocated (and their shapes compiled) again on next use
        self._batches, self._batch_ready, self._batch_graphs = {}, set(), {}
        self.cache = StaticCache(config=self.model.config, max_cache_len=self.capacity)
        self._length = 0
        # one eager one-token forward allocates every layer's tensors (with the shapes, dtype and device the model
        # really produces) before anything is compiled; its slot is then forgotten
        self._logits(torch.zeros(1, dtype=torch.long, device=self.device), torch.zeros(1, dtype=torch.long,
                     device=self.device), self._mask(0, causal_block(1, self.device)))
        self._offsets = [layer.cumulative_length for layer in self.cache.layers]
        self._shift(-1)
        if self.compiled:
            self._compile()
        if old is not None and n:
            for new_layer, old_layer in zip(self.cache.layers, old.layers):
                new_layer.keys[..., :n, :] = old_layer.keys[..., :n, :]
                new_layer.values[..., :n, :] = old_layer.values[..., :n, :]
            self._shift(n)
            self._length = n

    def _compile(self) -> None:
        """Compile every bucket's forward on the empty cache and, on CUDA, record it as a CUDA graph over static input
        buffers: a step then costs three buffer copies and one graph launch on the host, with no guard checks or
        per-call bookkeeping (torch.compile's own CUDA-graph mode spent ~0.3 ms of host time per call on those, as
        much as the tiny model's whole forward). The slots the warm-up writes are junk that the mask hides and the
        next forwards overwrite."""
        self._graphs = {}
        pool = torch.cuda.graph_pool_handle() if self.graphs else None
        for size in self.buckets:
            inputs = (torch.zeros(size, dtype=torch.long, device=self.device),
                      torch.arange(size, device=self.device), self._mask(0, causal_block(size, self.device)))
            graph = self._trace(self._step, inputs, self._offsets, pool)
            if graph is not None:
                self._graphs[size] = graph

    def _trace(self, step, inputs: tuple[torch.Tensor, ...], offsets: list[torch.Tensor], pool) -> Graphed | None:
        """Compile ``step`` (a compiled forward) for ``inputs``: ``WARMUP_CALLS`` calls, each forgotten (the cache's
        write ``offsets`` moved back by the block), then, given a CUDA graph ``pool``, record it over ``inputs`` as a
        CUDA graph (None without one). The time goes to ``compile_seconds``."""
        start = time.perf_counter()
        for _ in range(WARMUP_CALLS):
            step(*inputs)
            torch._foreach_add_(offsets, -inputs[0].shape[-1])
        # recording does not run the forward: no offsets to move back
        graph = None if pool is None else Graphed(step, pool).record(*inputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.compile_seconds += time.perf_counter() - start
        return graph

    # ------------------------------------------------------------------------------------------ batches
    @torch.inference_mode()
    def batch_cache(self, rows: int, need: int) -> StaticCache:
        """The cache of a lock-step batch (batch.py) whose ``rows`` is a batch bucket, every offset at 0, at this
        engine's capacity (grown to ``need`` plus a padded block first). One per bucket for the engine's life, so that
        compiled forwards (and CUDA graphs, recorded over its tensors) serve every group. The first call allocates the
        bucket and every smaller one (a batch moves its rows into the smaller ones as they finish): together they hold
        2 x ``rows`` - 1 rows."""
        self._ensure(need + self.buckets[-1])
        size = 1
        while size <= rows:
            if size not in self._batches:
                cache = self._batches[size] = StaticCache(config=self.model.config, max_cache_len=self.capacity)
                with numerics(self.model):  # one eager pad forward allocates the layers' tensors (as ``_allocate``)
                    self._batch_logits(cache, *self._batch_inputs(size))
            size *= 2
        cache = self._batches[rows]
        torch._foreach_zero_([layer.cumulative_length for layer in cache.layers])
        return cache

    def _batch_inputs(self, rows: int) -> tuple[torch.Tensor, ...]:
        """Ids, positions and mask of one pad token per row after an empty cache."""
        zeros = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
        return zeros, zeros, attention_mask(zeros.view(-1), causal_block(1, self.device).repeat(rows, 1, 1), 0,
                                            self.capacity, self.dtype)

    @torch.inference_mode()
    def prepare_batch(self, cache: StaticCache, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> None:
        """Before a batch's forward, outside its clock: on a compiling engine, a (batch bucket, block bucket) shape met
        for the first time is compiled now (``_trace``, on copies of these very inputs: the warm-up calls write the
        slots the forward then writes) and, on CUDA, recorded as a CUDA graph over those copies. Once per shape
        for the engine's life, in practice in a benchmark's untimed warm-up; the time is ``compile_seconds``, which a
        batch leaves out of its own (``Decoder.generate_batch``)."""
        rows, q = ids.shape
        if not self.compiled or q not in self.buckets or (rows, q) in self._batch_ready:
            return
        if self.graphs and self._batch_pool is None:
            self._batch_pool = torch.cuda.graph_pool_handle()
        graph = self._trace(functools.partial(self._batch_step, cache), (ids.clone(), pos.clone(), mask.clone()),
                            [layer.cumulative_length for layer in cache.layers], self._batch_pool)
        if graph is not None:
            self._batch_graphs[rows, q] = graph
        self._batch_ready.add((rows, q))

    def batch_forward(self, cache: StaticCache, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                      last: int) -> torch.Tensor:
        """A lock-step batch's forward over its ``cache`` (from ``batch_cache``): ids and positions [rows, q], the mask
        [rows, 1, q, capacity]; the logits of every row's last ``last`` tokens, [rows, last, vocab]. A shape that
        ``prepare_batch`` compiled runs compiled (its CUDA graph on CUDA) and keeps every token's logits
        (``logits_to_keep`` would be one more specialisation: at most rows x the largest bucket, never a prompt's
        length); any other runs eagerly and keeps the last ``last`` only."""
        rows, q = ids.shape
        if (rows, q) in self._batch_graphs:  # a copy: the next replay overwrites the graph's output
            return self._batch_graphs[rows, q](ids, pos, mask)[:, q - last:].to(torch.float32, copy=True)
        if (rows, q) in self._batch_ready:
            return self._batch_step(cache, ids, pos, mask)[:, q - last:]
        kwargs = {"logits_to_keep": last} if self.can_keep_last else {}
        return self._batch_logits(cache, ids, pos, mask, **kwargs)[:, -last:]

    def _batch_logits(self, cache: StaticCache, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                      **kwargs) -> torch.Tensor:
        kwargs[self.cache_kw] = cache
        return self.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True, **kwargs).logits
