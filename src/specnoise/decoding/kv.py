"""The engine interface every drafter and the verifier call: a stock HF causal LM plus its KV cache.

Everything a draft-and-verify step needs is here, written once (``Engine``):
  * ``forward``: append a block of tokens after the cache, with explicit RoPE positions and, for trees,
    an additive 4D mask built from a boolean "who sees whom" matrix inside the block;
  * ``crop``: forget rejected slots;
  * ``compact``: move the KV of an accepted tree path next to the cache and forget the rest. A node at
    depth d was encoded at position P+d, which is exactly its position once the path is compacted;
  * ``length``, ``reserve``, ``reset``, ``forwards`` (model calls), ``seconds`` (time inside them), and
    ``graph(fn)``: a device-side step recorded as a CUDA graph where the engine replays graphs, else ``fn`` itself.
Two siblings implement it: ``DynamicEngine`` here (a growing ``DynamicCache``) and ``StaticEngine``
(``static_kv.py``: a fixed-size cache, padded buckets, compiled forwards); ``engines.engine_for`` builds them.
``self_test`` checks at start-up that the loaded model honours custom masks and positions.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import time
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specnoise.errors import UserError
from specnoise.models import context_length, execution_device, sliding_window
from specnoise.numerics import numerics


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a host clock measures it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def upload(values: list[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host values (ints, as a long tensor, or a CPU tensor) on ``device``. On a GPU through pinned memory, without
    waiting: a copy from pageable memory synchronises the stream, i.e. waits for every queued kernel."""
    if not isinstance(values, torch.Tensor):
        values = torch.tensor(values, dtype=torch.long)
    return values.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else values


def write(dst: torch.Tensor, values: list[int]) -> None:
    """``dst[:len(values)] = values`` from host ints: on the CPU through a numpy view of ``dst`` (no tensor built and no
    torch op, each ~10-50 us right after a forward there: hardware-aware/cold_ops.py), elsewhere from one upload."""
    if dst.device.type == "cpu":
        dst.numpy()[:len(values)] = values
    else:
        dst[:len(values)].copy_(upload(values, dst.device))


def upload_tables(tables: list[list[int]], device: torch.device | None) -> tuple[torch.Tensor, ...]:
    """Lists of ints as long tensors on ``device`` (None: the host) from one upload, views of one buffer: a tree's
    tables are built per new pick (decoder.auto, tree=auto, a REST trie), and a tensor per table cost ~6 us each on the
    CPU."""
    flat = torch.from_numpy(np.fromiter(itertools.chain.from_iterable(tables), dtype=np.int64,
                                        count=sum(map(len, tables))))  # (13 us less than a generator, 90 than tensor())
    return (flat if device is None else upload(flat, device)).split([len(t) for t in tables])


def as_ids(values, device: torch.device) -> torch.Tensor:
    """Token ids or positions, a list or a tensor, as a long tensor on ``device`` (lists through ``upload``)."""
    if isinstance(values, torch.Tensor):
        return values.to(device=device, dtype=torch.long)
    return upload(values, device)


def dense_cache(config) -> DynamicCache:
    """A DynamicCache of full layers: a sliding-window model's own layers roll once the window fills (a draft's
    lookahead probes may pass it) and then cannot be cropped; full layers are exact inside the window, which is such a
    model's context here (models.context_length)."""
    return DynamicCache() if sliding_window(config) else DynamicCache(config=config)


def cache_holding(layers: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A DynamicCache of full layers (as ``dense_cache`` makes) holding each layer's (keys, values) as they are: its
    layers are made empty and handed the tensors, where a layer given them concatenates them onto an empty tensor, a
    second copy (a batch's left-out rows: 0.54 -> 0.33 ms a call, batch-scaling/cache_copies.py)."""
    cache = DynamicCache(ddp_cache_data=[(keys[:0, :, :0], values[:0, :, :0]) for keys, values in layers])
    for layer, (keys, values) in zip(cache.layers, layers, strict=True):
        layer.keys, layer.values = keys, values
    return cache


def causal_block(q: int, device=None) -> torch.Tensor:
    return torch.ones(q, q, dtype=torch.bool, device=device).tril_()


def attention_mask(cached: int | torch.Tensor, keep: torch.Tensor, start: int, width: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """The additive 4D mask [B, 1, q, width] of every engine's forward (one builder for all three): a query sees the
    slots below its row's cached length ``cached`` (an int, or a long device tensor [B] in a batch) and, inside its
    block at slots [start, start + q), what ``keep`` (bool [q, q], or [B, q, q]) allows; nothing else, so stale slots
    and pads stay invisible. Built on ``keep``'s device: no host-built mask is copied up."""
    q, minimum = keep.shape[-1], torch.finfo(dtype).min
    if keep.dim() == 2 and isinstance(cached, int) and cached == start and width == start + q:
        # one row whose block follows its cache (every dynamic-engine forward): three ops instead of nine, per step
        block = torch.zeros(q, q, dtype=dtype, device=keep.device).masked_fill_(~keep, minimum)
        return F.pad(block, (start, 0)).view(1, 1, q, width)
    keep = keep if keep.dim() == 3 else keep[None]
    B = keep.shape[0]
    slots = torch.arange(width, device=keep.device)
    seen = (slots < (cached if isinstance(cached, int) else cached.view(-1, 1, 1))).expand(B, q, width).clone()
    seen[:, :, start:start + q] |= keep
    mask = torch.zeros(B, 1, q, width, dtype=dtype, device=keep.device)
    return mask.masked_fill_(~seen[:, None], minimum)


class Forward(NamedTuple):
    """A request that a decoding step yields (``Decoder.steps``, ``Verifier.steps``, draft loops): run
    ``engine.forward(tokens, positions, tree, last, prefix)``; the reply is its logits. Alone, ``drive`` runs it at
    once; in a batch (batch.py) the rows' requests of one model become one batched forward."""

    engine: Any
    tokens: Any
    positions: Any = None
    tree: torch.Tensor | None = None
    last: int | None = None
    prefix: int = 0  # the first tokens that form a causal run before the rest (``DynamicEngine.forward``)


def log_entry(tokens, positions=None, tree=None, context: int = 0) -> tuple[int, bool, int]:
    """A forward of ``tokens`` as ``Engine.forward_log`` logs it: (tokens, whether with a mask: explicit positions or a
    tree get one, a plain causal block does not, the cached tokens it attends to besides its own)."""
    q = tokens.numel() if isinstance(tokens, torch.Tensor) else len(tokens)
    return q, positions is not None or tree is not None, context


class Read(NamedTuple):
    """A request to read ``tensor`` on the host (the reply: ``tensor.tolist()``), counted; a batch reads every row's
    waiting tensor in one device-to-host copy."""

    tensor: torch.Tensor


def drive(steps: Generator, read: Callable[[torch.Tensor], Any]):
    """Run a generator of ``Forward`` / ``Read`` requests (and the verifier's ``Check``: its own ``run``) alone, each
    served at once (forwards on their engine, reads through ``read``); returns the generator's value. The batch=1
    case of batch.py's lock-step loop."""
    reply = None
    try:
        while True:
            request = steps.send(reply)
            if isinstance(request, Forward):
                reply = request.engine.forward(request.tokens, request.positions, request.tree, request.last,
                                               request.prefix)
            elif isinstance(request, Read):
                reply = read(request.tensor)
            else:
                reply = request.run()
    except StopIteration as stop:
        return stop.value


class Graphed:
    """``fn`` of tensors as a CUDA graph: calls copy their arguments into the recorded inputs and replay it, one launch
    for all its kernels. A verify step's two dozen small ops cost ~0.3 ms of host time launched one by one on an
    H100, as much as a compiled forward of the shipped model. Recorded on the first call, or ahead by ``record``
    (the static engine, per bucket). The outputs are the graph's own tensors: the next call overwrites them."""

    def __init__(self, fn, pool=None):
        self.fn, self.pool, self.graph = fn, pool, None

    def record(self, *inputs: torch.Tensor) -> Graphed:
        """Record ``fn`` over ``inputs``, which become the graph's input buffers (``fn`` must have run before: warm)."""
        self.inputs = inputs
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):  # records without running
            self.outputs = self.fn(*inputs)
        return self

    def __call__(self, *inputs: torch.Tensor):
        if self.graph is None:
            buffers = [x.clone() for x in inputs]
            side = torch.cuda.Stream()  # warm-up off the capture stream, as CUDA graphs require
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.fn(*buffers)
            torch.cuda.current_stream().wait_stream(side)
            self.record(*buffers)
        for buffer, x in zip(self.inputs, inputs):
            buffer.copy_(x)
        self.graph.replay()
        return self.outputs


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` since transformers 5.24, ``past_key_values`` before (the old
    name still works there, with a deprecation warning on every call)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class Clock:
    """Seconds spent inside model forwards, per forward (``laps``). On CUDA from events, so no forward waits for the
    device; read ``seconds`` and ``laps`` after the generation's final sync."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.host: list[float] = []  # the CPU's forwards, timed on the host
        self.events: list = []  # CUDA's, as (start, end) events

    @contextlib.contextmanager
    def timing(self):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.events.append((start, end))
        else:
            t = time.perf_counter()
            yield
            self.host.append(time.perf_counter() - t)

    @property
    def laps(self) -> list[float]:
        """Seconds of each forward timed since the reset, in order."""
        return self.host + [start.elapsed_time(end) / 1e3 for start, end in self.events]

    @property
    def seconds(self) -> float:
        return sum(self.laps)


# a block whose first tokens are a causal run (the prompt, fed with the first step's proposal) is fed in two model calls
# on the CPU from this many of them on (``DynamicEngine.forward``'s ``prefix``): the prompt as a plain causal forward,
# as AR's prefill runs it, then the proposal with its mask over the cache. In one masked forward the attention leaves
# SDPA's maskless causal path for the whole prompt, with a (P + q)^2 additive mask: 8 tree tokens after 1,024 prompt
# tokens cost 27-46 ms more than AR's prefill of the prompt alone (170-190 ms), 10 ms more in two calls; at 512 tokens
# both cost about the same, below it one call is cheaper by the second call's fixed cost (small-code-msn, one thread;
# in a scratch trace TR-Jacobi with decoder.auto ran 0.74x AR on a 1,206-token Spec-Bench prompt of 14 new tokens,
# 0.91x with the prompt fed first; the measurement: experiments/hardware-aware/prefill-split.md). On a GPU the second
# call would cost a whole decode step of the model while the masked attention stays fast (not measured): one forward
SPLIT_PREFIX = 512


class Engine:
    """What both engines share: the model's facts, the forward counter and clock, and KV moves. ``length`` slots of
    KV are cached; subclasses own the cache (``forward``, ``crop``, ``reset``, ``length``)."""

    graphs = False  # True: the engine replays CUDA graphs, and ``graph`` records device-side steps too

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = execution_device(model)  # a device-mapped model's inputs and logits live there
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_length = context_length(model.config)
        self.forwards = 0
        # per forward since ``reset``: (tokens the model was fed, whether with a mask, tokens cached before it): the
        # cost bound prices a run's own forwards by them, each at its context (bench/bound.py)
        self.forward_log: list[tuple[int, bool, int]] = []
        self.clock = Clock(self.device)
        self.cache_kw = cache_keyword(model)
        self.can_keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        # a sliding window is the context (models.context_length): the dense cache is exact inside it

    @property
    def seconds(self) -> float:
        """Time inside this engine's forwards since the last ``reset``."""
        return self.clock.seconds

    @property
    def attended(self) -> int:
        """Cached tokens the next forward's block attends to: the engine's own (a batch row's: the batch's)."""
        return self.length

    def reserve(self, n: int) -> None:
        """A generation of up to ``n`` tokens (prompt + new) follows: size a static cache now (no-op here)."""

    def splits(self, prefix: int, q: int, masked: bool) -> bool:
        """Whether a masked forward of q tokens whose first ``prefix`` form a causal run feeds them first, as a plain
        causal forward (``DynamicEngine.forward``; no other engine does): the cost bound prices such a first step as
        the two forwards it ran (bench/bound.py)."""
        return False

    def graph(self, fn):
        """``fn`` (tensors in, tensors out, fixed shapes) as this engine runs device-side steps: a CUDA graph recorded
        on the first call where the engine replays graphs, else ``fn`` itself."""
        return Graphed(fn) if self.graphs else fn

    @torch.inference_mode()  # the cached tensors are inference tensors: in-place writes need the same mode
    def move(self, start: int, src: list[int] | torch.Tensor) -> None:
        """Copy slots ``src`` (all >= start; a list, or a device tensor that the host never reads) to ``start, start+1,
        ...``. The length stays: ``crop`` after it."""
        idx = as_ids(src, self.device)
        n = start + idx.numel()
        for layer in self.cache.layers:
            # index_select copies the source first, so overlapping slots cannot alias
            layer.keys[..., start:n, :] = layer.keys.index_select(-2, idx)
            layer.values[..., start:n, :] = layer.values.index_select(-2, idx)

    def compact(self, start: int, keep: list[int], src: torch.Tensor | None = None) -> None:
        """Move slots ``keep`` (ascending, all >= start) to ``start, start+1, ...`` and drop everything after.
        ``src``: the same slots as a device tensor, moved from without uploading ``keep`` (the verifier's path)."""
        n = start + len(keep)
        if keep != list(range(start, n)):
            self.move(start, keep if src is None else src)
        self.crop(n)


class DynamicEngine(Engine):
    """The engine over a growing ``DynamicCache``: any block size, no padding, eager forwards."""

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self.cache = dense_cache(model.config)

    def reset(self) -> None:
        self.cache = dense_cache(self.model.config)
        self.forwards, self.forward_log = 0, []
        self.clock.reset()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def splits(self, prefix: int, q: int, masked: bool) -> bool:
        return masked and SPLIT_PREFIX <= prefix < q and self.device.type == "cpu"

    @torch.inference_mode()
    def forward(self, tokens, positions=None, tree: torch.Tensor | None = None,
                last: int | None = None, prefix: int = 0) -> torch.Tensor:
        """Feed ``tokens`` after the cached slots; return float32 logits, one row per token.

        positions: absolute positions (default: consecutive after the cache).
        tree: bool [q, q], ``tree[i, j]`` = token i may attend to new token j (default: causal).
        last: return only the last ``last`` rows (a long prefill then never materialises prompt-length x vocab
        logits, which for a 128k vocabulary costs more than the forward's attention).
        prefix: the first ``prefix`` tokens are a causal run at consecutive positions that every later token sees (a
        prompt fed with the first proposal): from ``SPLIT_PREFIX`` of them on (on the CPU) they are fed first, as a
        plain causal forward, then the rest, in one forward as counted and timed.
        Every new token always sees the whole cache.
        """
        ids = as_ids(tokens, self.device).view(1, -1)
        P, q = self.length, ids.shape[1]
        with numerics(self.model), self.clock.timing():  # the model's attention-backend / strict-numerics policy
            if self.splits(prefix, q, tree is not None):
                rest = q - prefix  # the prefix's rows among the last ``last``: none, some, or all of them
                head = prefix if last is None else min(max(last - rest, 0), prefix)
                first = self._logits(ids[:, :prefix], P, None, None, max(head, 1))  # (HF: 0 keeps every row)
                tail = self._logits(ids[:, prefix:], P + prefix,
                                    None if positions is None else as_ids(positions, self.device).view(-1)[prefix:],
                                    tree.to(self.device)[prefix:, prefix:], None if last is None else min(last, rest))
                logits = torch.cat([first[0, first.shape[1] - head:], tail[0]]) if head else tail[0]
            else:
                logits = self._logits(ids, P, positions, tree, last)[0]
        self.forwards += 1
        self.forward_log.append(log_entry(ids, positions, tree, P))
        return logits[-last:].float() if last is not None else logits.float()

    def _logits(self, ids: torch.Tensor, P: int, positions, tree: torch.Tensor | None,
                last: int | None) -> torch.Tensor:
        """The model's logits [1, rows, V] for ``ids`` after P cached slots (``forward``'s arguments)."""
        q = ids.shape[1]
        slots = torch.arange(P, P + q, device=self.device)
        kwargs = {self.cache_kw: self.cache, "use_cache": True, "cache_position": slots}
        if positions is not None or tree is not None:
            pos = slots if positions is None else as_ids(positions, self.device).view(-1)
            keep = causal_block(q, self.device) if tree is None else tree.to(self.device)
            kwargs.update(position_ids=pos.view(1, -1), attention_mask=attention_mask(P, keep, P, P + q, self.dtype))
        if last is not None and self.can_keep_last:
            kwargs["logits_to_keep"] = last
        return self.model(input_ids=ids, **kwargs).logits

    def crop(self, n: int) -> None:
        """Keep the first ``n`` cached slots."""
        extra = self.length - n
        if extra > 0:
            self.cache.crop(-extra)


@torch.inference_mode()
def self_test(model: torch.nn.Module, atol: float | None = None) -> float:
    """Check that a tree forward gives every node the logits of a plain causal forward of its path.

    Catches models or attention kernels that ignore custom 4D masks or ``position_ids`` before they can
    produce silently wrong tokens. Returns the largest difference seen.
    """
    kv = DynamicEngine(model)
    atol = atol if atol is not None else (1e-4 if kv.dtype == torch.float32 else 5e-2)
    gen = torch.Generator().manual_seed(0)
    vocab = min(kv.vocab_size, model.config.vocab_size)
    prefix = torch.randint(0, vocab, (5,), generator=gen).tolist()
    # tree: root r; children a, b; a's children c, d; b's child e   (parents by index, -1 = cache)
    parents = [-1, 0, 0, 1, 1, 2]
    nodes = torch.randint(0, vocab, (len(parents),), generator=gen).tolist()
    depth, tree = [0] * len(parents), torch.eye(len(parents), dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            depth[i] = depth[p] + 1
            tree[i] |= tree[p]
    kv.forward(prefix)
    logits = kv.forward(nodes, positions=[len(prefix) + d for d in depth], tree=tree)
    worst = 0.0
    for i in range(len(parents)):
        path = [j for j in range(i + 1) if tree[i, j]]
        ref = DynamicEngine(model).forward(prefix + [nodes[j] for j in path])[-1]
        worst = max(worst, (ref - logits[i]).abs().max().item())
    if worst > atol:
        impl = getattr(model.config, "_attn_implementation", "?")
        raise UserError(
            f"{model.config.model_type} with attn_implementation={impl!r} does not honour custom 4D attention "
            f"masks / position_ids (tree logits differ from path logits by {worst:.3g} > {atol}); "
            "load it with model.attn_implementation=sdpa or eager (FlashAttention cannot take tree masks)"
        )
    return worst
