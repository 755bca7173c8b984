"""A tokenized corpus and its suffix arrays: the datastore of REST and the static part of SAM-Decoding.

``load_corpus`` turns a JSON / JSONL file of text rows (the shipped SFT data, any alpaca / text / chat rows) into
one token array, documents separated by -1 so that no match or continuation crosses a document boundary. It is
tokenized once per (file content, tokenizer) and cached as ``.npy`` + ``.json`` under ``cache_dir``; a ``.npy``
given as the corpus is taken as token ids already (a cache built elsewhere, or a user's own ids) and checked against
the tokenizer it records. ``SuffixArray`` sorts the corpus suffixes with numpy prefix doubling (no dependency; a
corpus of a million tokens sorts in seconds), and those of the corpus reversed, where the longest suffix of a text
that occurs is found token by token; both are cached under ``cache_dir`` too.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from specnoise.config import check_corpus
from specnoise.errors import UserError
from specnoise.files import read_json_rows, write_atomic

TEXT_KEYS = ("instruction", "input", "output", "response", "text", "content", "value")


def texts(path: Path, key: str = "decoder.corpus") -> list[str]:
    """The text of each row: its string fields (``TEXT_KEYS``, chat turns included) joined by newlines."""
    rows = [row for _, row in read_json_rows(path, key)]  # the benchmark's reader: file, line, column on an error

    def text(row) -> str:
        if isinstance(row, str):
            return row
        if isinstance(row, list):
            return "\n".join(map(text, row))
        if isinstance(row, dict):
            return "\n".join(text(row[k]) for k in (*TEXT_KEYS, "conversations") if k in row).strip()
        return ""
    return [t for t in map(text, rows) if t.strip()]


def fingerprint(tokenizer) -> str:
    """A tokenizer's identity for caches: the hash of its vocabulary (token -> id)."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode()
    return hashlib.sha256(vocab).hexdigest()[:16]


def load_corpus(path: str, tokenizer, vocab: int, cache_dir: str, tokenizer_id: str | None = None
                ) -> tuple[np.ndarray, dict]:
    """(tokens int32 with -1 between documents, what a run records: tokens, cache file, seconds to build or load).
    ``tokenizer_id``: ``fingerprint(tokenizer)`` when the caller has it (hashing a vocabulary takes a while)."""
    check_corpus(path)
    if tokenizer is not None and tokenizer_id is None:
        tokenizer_id = fingerprint(tokenizer)
    start, file = time.perf_counter(), Path(path)
    key = hashlib.sha256(file.read_bytes()).hexdigest()[:16]  # content, not name: an edited corpus is rebuilt
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    if file.suffix == ".npy":  # token ids already
        tokens, cache = np.load(file).astype(np.int32), Path(cache_dir) / f"{file.stem}-{key}.npy"
        meta = file.with_suffix(".json")
        recorded = json.loads(meta.read_text()).get("tokenizer") if meta.is_file() else None
        if recorded and tokenizer is not None and recorded != tokenizer_id:
            raise UserError(f"decoder.corpus={path} was tokenized with another tokenizer than the target's: give "
                            "the text corpus instead (it is tokenized and cached for this model)")
    else:
        if tokenizer is None:
            raise UserError(f"decoder.corpus={path} is text but the target has no tokenizer: give a .npy of token ids")
        cache = Path(cache_dir) / f"{file.stem}-{key}-{tokenizer_id}.npy"
        if cache.is_file():
            tokens = np.load(cache)
        else:
            docs = texts(file)
            if not docs:
                raise UserError(f"decoder.corpus={path} has no text rows: give rows with a text or output field")
            ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
            tokens = np.fromiter((t for doc in ids for t in (*doc, -1)), dtype=np.int32)
            write_atomic(cache, lambda tmp: np.save(tmp, tokens))  # an interrupted build leaves no half cache behind
            write_atomic(cache.with_suffix(".json"), json.dumps({"corpus": str(file), "tokenizer": tokenizer_id}))
    if not (tokens >= 0).any():
        raise UserError(f"decoder.corpus={path} holds no tokens: give a corpus with text in it")
    if tokens.max() >= vocab:
        raise UserError(f"decoder.corpus={path} holds token ids up to {tokens.max()}, past the target's vocabulary of "
                        f"{vocab}: it was tokenized for another model, give the text corpus instead")
    return tokens, {"corpus_tokens": int((tokens >= 0).sum()), "corpus_cache": str(cache),
                    "corpus_seconds": round(time.perf_counter() - start, 3)}


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """The suffixes of ``tokens`` in lexicographic order: prefix doubling, sorting by rank pairs until ranks differ."""
    n = len(tokens)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64) + 1  # 0 is the end of the corpus
    k = 1
    while True:
        second = np.zeros(n, dtype=np.int64)
        second[:n - k] = rank[k:]
        order = np.lexsort((second, rank))
        pair = np.stack([rank[order], second[order]])
        new = np.empty(n, dtype=np.int64)
        new[order] = np.concatenate([[1], 1 + np.cumsum((np.diff(pair, axis=1) != 0).any(0))])
        rank, k = new, 2 * k
        if rank.max() == n or k >= n:
            return order.astype(np.int32)


class Match(NamedTuple):
    """A suffix of a token list found in the corpus: its length ``n`` (0: none), its suffix-array interval [lo, hi),
    and the list's length when it was looked up."""

    n: int
    lo: int
    hi: int
    end: int


class SuffixArray:
    """Suffix-array search over a corpus: where a token string occurs, and what follows it there."""

    def __init__(self, tokens: np.ndarray, cache: Path | None = None, backward: bool = True):
        self.tokens = tokens
        file = cache.with_suffix(".sa.npy") if cache is not None else None
        if file is not None and file.is_file():
            self.sa = np.load(file)
        else:
            self.sa = suffix_array(tokens)
            if file is not None:
                write_atomic(file, lambda tmp: np.save(tmp, self.sa))
        # the arrays read through memoryviews: indexing one gives a Python int, with no numpy scalar or op made
        self.sa_view, self.tokens_view = memoryview(self.sa), memoryview(tokens)
        self.heads = memoryview(tokens[self.sa])  # each suffix's first token, ascending: the first narrowing's
        # the reversed corpus's suffix array (over a view: 8 more bytes per token with its heads): a text's last n
        # tokens occur here where they occur read backwards there, so the longest suffix that occurs is one narrowing
        # per token, backwards from the text's end, until none is left (``longest_suffix``)
        back = cache.with_suffix(".back.npy") if cache is not None else None
        self.back = SuffixArray(tokens[::-1], back, backward=False) if backward else None

    def narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int]:
        """Of the suffixes sa[lo:hi] (which share their first ``depth`` tokens), those whose next token is ``token``.
        Their next tokens ascend (the end of the corpus, -2, first), so the answer is one interval, bisected: ~2 log2(hi
        - lo) reads of the suffix array and the corpus. Reading all their next tokens in one numpy gather (up to 256)
        and searching them in C cost more inside a generation: ~37 us a narrowing against ~11 (REST's look-ups on the
        shipped model, CPU), as every token read misses the caches a forward has just filled with its weights."""
        if depth == 0 and lo == 0 and hi == len(self.sa):
            return bisect.bisect_left(self.heads, token), bisect.bisect_right(self.heads, token)
        sa, tokens, end = self.sa_view, self.tokens_view, len(self.tokens)

        def at(i: int) -> int:
            j = sa[i] + depth
            return tokens[j] if j < end else -2

        span = range(lo, hi)
        first = bisect.bisect_left(span, token, key=at)
        return lo + first, lo + bisect.bisect_right(span, token, lo=first, key=at)

    def reach(self, pattern: Iterable[int]) -> tuple[int, int, int]:
        """(k, lo, hi): the longest prefix of ``pattern`` that occurs, its length k and its suffix-array interval."""
        lo, hi, k = 0, len(self.sa), 0
        for depth, token in enumerate(pattern):
            narrower = self.narrow(lo, hi, depth, token)
            if narrower[0] == narrower[1]:
                break
            (lo, hi), k = narrower, depth + 1
        return k, lo, hi

    def longest_suffix(self, seq: list[int], longest: int, last: Match | None = None) -> Match:
        """The longest n <= ``longest`` such that seq's last n tokens occur, and where (n = 0: none).

        ``last``: this search's answer for ``seq`` when it was shorter (REST and SAM pass their previous step's). It
        bounds the answer: a suffix longer than that match plus the tokens appended since would have made the earlier
        match longer. When the bound is that match extended by the new tokens and it still occurs, it is the answer:
        one narrowing per new token. Otherwise the reversed corpus (``back``) is narrowed by seq's tokens backwards from
        its end, up to the bound (less one when the extension failed), until none is left: n + 1 narrowings give n,
        then n more give its interval here. REST on three HumanEval-style prompts: ~7 narrowings per look-up, against
        ~10 when the lengths were searched down and bisected here, each length narrowed from its first token."""
        high = min(longest, len(seq))
        grown = len(seq) - last.end if last is not None else -1
        if grown >= 0:
            high = min(high, last.n + grown)
            if last.n and grown and last.n + grown == high:
                lo, hi = last.lo, last.hi
                for depth, token in enumerate(seq[-grown:], start=last.n):
                    lo, hi = self.narrow(lo, hi, depth, token)
                    if lo == hi:
                        break
                if hi > lo:
                    return Match(last.n + grown, lo, hi, len(seq))
                high -= 1  # that suffix is missing, so is every longer one
        n = self.back.reach(itertools.islice(reversed(seq), high))[0]
        _, lo, hi = self.reach(seq[-n:]) if n else (0, 0, 0)
        return Match(n, lo, hi, len(seq))

    def first(self, n: int, lo: int, hi: int, depth: int) -> list[int]:
        """The ``depth`` tokens after the first occurrence in the corpus of a match of length ``n`` (up to its
        document's end): what a suffix automaton's first end position gives."""
        start = int(self.sa[lo:hi].min()) + n
        row = self.tokens[start:start + depth].tolist()
        return row[:row.index(-1)] if -1 in row else row

    def continuations(self, n: int, lo: int, hi: int, depth: int, limit: int) -> np.ndarray:
        """[m, depth]: the ``depth`` tokens after up to ``limit`` occurrences (spread evenly over the interval) of a
        match of length ``n``; -1 past a document's end. In the suffix array's order, so the rows ascend
        lexicographically (-1 first: a document's end, as the corpus's, sorts before every token)."""
        spread = np.unique(np.linspace(lo, hi - 1, limit).astype(np.int64)) if hi - lo > limit else slice(lo, hi)
        picks = self.sa[spread] + n
        idx = picks[:, None] + np.arange(depth)[None, :]
        out = np.where(idx < len(self.tokens), self.tokens[np.minimum(idx, len(self.tokens) - 1)], -1)
        return np.where(np.cumsum(out < 0, axis=1) > 0, -1, out)  # nothing after a document's end


_OPEN: dict[tuple, tuple[SuffixArray, dict]] = {}  # one datastore per corpus, tokenizer and vocabulary per process


def open_datastore(path: str, tokenizer, vocab: int, cache_dir: str) -> tuple[SuffixArray, dict]:
    """The corpus's suffix array (built once, cached on disk and in the process) and what a run records about it:
    tokens, cache file, and ``corpus_build_seconds`` (tokenizing + sorting, or loading both from the cache)."""
    tokenizer_id = fingerprint(tokenizer) if tokenizer is not None else None
    key = (str(Path(path).resolve()), tokenizer_id, vocab, str(Path(cache_dir).resolve()))
    if key not in _OPEN:
        start = time.perf_counter()
        tokens, meta = load_corpus(path, tokenizer, vocab, cache_dir, tokenizer_id)
        store = SuffixArray(tokens, Path(meta["corpus_cache"]))
        meta["corpus_build_seconds"] = round(time.perf_counter() - start, 3)
        _OPEN[key] = store, meta
    return _OPEN[key]
