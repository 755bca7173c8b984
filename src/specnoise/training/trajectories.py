"""Jacobi trajectories of the model being trained, for ``train=cllm`` and ``train=jacobi_forcing``.

Per prompt, the output is produced in ``block``-token blocks. A block starts from random tokens of the prompt (as
CLLM) and is Jacobi-iterated, greedy, on the project's engine (``specnoise.decoding.kv.DynamicEngine``: the accepted
context stays in the KV cache, each iteration is one forward of the block): state s -> s' with s'_i the argmax after
context + s_<i. Every state before the fixed point is kept; the fixed point (the greedy AR continuation) is
appended to the context and the next block starts, until an EOS or ``max_new_tokens``. An output that repeats
itself (one ``repeat_ngram``-gram ``repeat_count`` times: a loop, as greedy small models often fall into) is
dropped, as CLLM drops low-quality generations.

Cache: ``<cache_dir>/traj-<key>.jsonl`` with key = hash of the model's files (fingerprint), the prompt token ids
and the collection settings, so a rerun with the same model, data and settings collects nothing, and another
model or setting gets its own file. Records are appended per prompt to ``traj-<key>.part<rank>.jsonl`` and
flushed, so a killed collection continues where it stopped (with any number of processes: the prompts still
missing are split by rank); the parts are merged into the final file once all are done. An explicit
``trajectories=FILE`` must carry the same model fingerprint and settings in its ``.meta.json``, else UserError.

Record (one JSON line per prompt): ``{"index", "prompt": ids, "gold": response ids, "blocks": [{"states": [[ids]],
"fixed": ids}], "eos": bool}``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from collections import Counter
from pathlib import Path

import torch

from specnoise.config import TrajectoryConfig, UserError
from specnoise.files import exclusive

log = logging.getLogger("specnoise.train")

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def model_fingerprint(path: str, revision: str | None = None) -> str:
    """A hash of a local model folder's config and weight files (size + first and last MiB of each: cheap even for
    13 GB of weights, and any retraining changes them); a hub id without a local folder hashes its name+revision."""
    folder = Path(path).expanduser()
    h = hashlib.sha256()
    if not folder.is_dir():
        h.update(f"hub:{path}@{revision}".encode())
        return h.hexdigest()[:16]
    for f in sorted(folder.iterdir()):
        if f.name == "config.json" or f.suffix in WEIGHT_SUFFIXES:
            size = f.stat().st_size
            h.update(f"{f.name}:{size}".encode())
            with f.open("rb") as fh:
                h.update(fh.read(1 << 20))
                if size > 2 << 20:
                    fh.seek(-(1 << 20), os.SEEK_END)
                    h.update(fh.read())
    return h.hexdigest()[:16]


def file_fingerprint(path: str | Path) -> str:
    """A hash of one file's whole contents, wherever it lies: a moved or copied file keeps it, any edit changes it
    (unlike a model's weights, an edited data file may keep its size and its first and last MiB)."""
    h = hashlib.sha256()
    with Path(path).expanduser().open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):  # (hashlib.file_digest needs Python 3.11)
            h.update(chunk)
    return h.hexdigest()[:16]


def settings(cfg: TrajectoryConfig) -> dict:
    """What changes the collected trajectories (not the loss settings)."""
    return {"block": cfg.block, "max_new_tokens": cfg.max_new_tokens, "repeat_ngram": cfg.repeat_ngram,
            "repeat_count": cfg.repeat_count, "seed": cfg.seed}


def select_prompts(features: list[dict], cfg: TrajectoryConfig) -> list[dict]:
    """The first ``prompts`` training samples as ``{"index", "prompt", "gold"}``; more than the data has is an error."""
    n = len(features) if cfg.prompts is None else cfg.prompts
    if n > len(features):
        raise UserError(f"train.{cfg.key}.prompts={cfg.prompts}: the training split has only {len(features)} "
                        f"samples; use train.{cfg.key}.prompts<={len(features)} (or null for all)")
    return [{"index": i, "prompt": f["input_ids"][: f["prompt_len"]], "gold": f["input_ids"][f["prompt_len"]:]}
            for i, f in enumerate(features[:n])]


class TrajectoryStore:
    """Where one collection's records live, and the checks that it belongs to this model and these settings."""

    def __init__(self, cfg: TrajectoryConfig, fingerprint: str, prompts: list[dict]):
        self.cfg, self.fingerprint = cfg, fingerprint
        data_hash = hashlib.sha256(json.dumps([p["prompt"] for p in prompts]).encode()).hexdigest()[:16]
        self.meta = {"model": fingerprint, "prompts": len(prompts), "prompt_ids": data_hash, **settings(cfg)}
        key = hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode()).hexdigest()[:16]
        if cfg.trajectories:
            self.path = Path(cfg.trajectories).expanduser().resolve()
        else:
            self.path = Path(cfg.cache_dir).expanduser().resolve() / f"traj-{key}.jsonl"
        self.meta_path = self.path.with_suffix(".meta.json")

    def check(self) -> None:
        """An existing file (or its parts) must come from this model, these prompts and settings."""
        if not self.meta_path.is_file():
            if self.cfg.trajectories and self.path.is_file():
                raise UserError(f"train.{self.cfg.key}.trajectories: {self.path} has no {self.meta_path.name} saying "
                                "which model it was collected on; drop the key to collect for this model")
            return
        meta = json.loads(self.meta_path.read_text())
        if meta.get("model") != self.fingerprint:
            raise UserError(f"train.{self.cfg.key}.trajectories: {self.path} was collected on another model "
                            f"(fingerprint {meta.get('model')}, this model is {self.fingerprint}); its fixed points "
                            "are not this model's outputs: drop the key to collect for this model")
        differ = sorted(k for k in self.meta if meta.get(k) != self.meta[k])
        if differ:
            raise UserError(f"train.{self.cfg.key}.trajectories: {self.path} was collected with other settings ("
                            + ", ".join(f"{k}={meta.get(k)} here {self.meta[k]}" for k in differ)
                            + "): drop the key to collect anew, or set the same values")

    def parts(self) -> list[Path]:
        return sorted(self.path.parent.glob(self.path.stem + ".part*.jsonl"))

    def done(self) -> dict[int, dict]:
        """Records already collected: the final file, else every part (lines cut by a kill are skipped)."""
        files = [self.path] if self.path.is_file() else self.parts()
        records = {}
        for f in files:
            for line in f.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the last line of a killed writer
                records[rec["index"]] = rec
        return records


def repetitive(ids: list[int], n: int, count: int) -> bool:
    grams = Counter(tuple(ids[i:i + n]) for i in range(len(ids) - n + 1))
    return bool(grams) and max(grams.values()) >= count


@torch.no_grad()
def jacobi_trajectory(kv, prompt: list[int], cfg: TrajectoryConfig, eos: set[int], rng: random.Random) -> dict:
    """One prompt's blocks: each block's Jacobi states (before the fixed point) and its fixed point."""
    n = cfg.block
    kv.reset()
    context = list(prompt)
    if len(context) > 1:
        kv.forward(context[:-1], last=1)  # cache all but the newest token, which leads every block forward
    blocks, hit_eos = [], False
    while len(context) - len(prompt) < cfg.max_new_tokens and not hit_eos:
        cached = kv.length
        state = rng.choices(prompt, k=n)
        states = []
        for _ in range(n + 1):  # a block converges in at most n iterations (one more token fixed per iteration)
            logits = kv.forward([context[-1], *state[:-1]])
            new = logits.argmax(-1).tolist()
            if new == state:
                break
            states.append(state)
            state = new
            kv.crop(cached)
        else:  # never converged (an argmax tie flipping between shapes): the last state stands as the fixed point
            kv.forward([context[-1], *state[:-1]])
        # the last forward cached context[-1] + state[:-1], exactly the fixed point's context: keep it
        kv.crop(cached + n)
        blocks.append({"states": states, "fixed": state})
        context += state
        hit_eos = any(t in eos for t in state)
    return {"blocks": blocks, "eos": hit_eos}


def collect(model, tokenizer, prompts: list[dict], cfg: TrajectoryConfig, fingerprint: str) -> tuple[list[dict], dict]:
    """All prompts' trajectories (cached), split over the processes; returns (kept records, stats)."""
    from specnoise.training.trainer import process_state

    state = process_state()
    store = TrajectoryStore(cfg, fingerprint, prompts)
    store.check()
    store.path.parent.mkdir(parents=True, exist_ok=True)
    # two single-process jobs of a sweep (CLLM and Jacobi Forcing share a collection) must not append to the same
    # part file: the second waits for the first, then finds the finished file
    with exclusive(store.path.with_suffix(".lock"), state.num_processes == 1):
        return _collect(model, tokenizer, prompts, cfg, store, state)


def _collect(model, tokenizer, prompts, cfg, store, state):
    from specnoise.decoding.kv import DynamicEngine

    start = time.time()
    collected, fresh = 0, not store.path.is_file()
    if fresh:
        done = store.done()
        todo = [p for p in prompts if p["index"] not in done][state.process_index::state.num_processes]
        state.wait_for_everyone()  # every rank splits the same "done" before any rank appends a record
        if state.is_main_process:
            store.meta_path.write_text(json.dumps(store.meta, indent=2))
            log.info("collecting Jacobi trajectories for %d of %d prompts (%d cached) into %s", len(todo) *
                     state.num_processes, len(prompts), len(done), store.path)
        if todo:
            was_training = model.training
            model.eval()
            device = state.device
            model.to(device)
            kv = DynamicEngine(model)
            eos = {tokenizer.eos_token_id}
            part = store.path.with_name(f"{store.path.stem}.part{state.process_index}.jsonl")
            from tqdm.auto import tqdm

            with part.open("a") as out:
                if part.stat().st_size and not part.read_bytes().endswith(b"\n"):
                    out.write("\n")  # a line cut by a kill stays unreadable on its own, not merged with the next
                for p in tqdm(todo, desc=f"trajectories (rank {state.process_index})",
                              disable=not state.is_main_process):
                    rng = random.Random(f"{cfg.seed}:{p['index']}")  # the same per prompt, whatever the split
                    rec = {**p, **jacobi_trajectory(kv, p["prompt"], cfg, eos, rng)}
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
            collected = len(todo)
            model.train(was_training)
        state.wait_for_everyone()
        if state.is_main_process:
            records = store.done()
            missing = [p["index"] for p in prompts if p["index"] not in records]
            if missing:
                raise RuntimeError(f"trajectory collection left {len(missing)} prompts without a record")
            tmp = store.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(records[p["index"]]) + "\n" for p in prompts))
            tmp.rename(store.path)
            for f in store.parts():
                f.unlink()
        state.wait_for_everyone()
    seconds = time.time() - start
    records = store.done()
    kept = [records[p["index"]] for p in prompts
            if not repetitive(output(records[p["index"]], tokenizer.eos_token_id), cfg.repeat_ngram, cfg.repeat_count)]
    blocks = sum(len(r["blocks"]) for r in records.values())
    stats = {
        "trajectory_file": str(store.path),
        "trajectory_prompts": len(prompts),
        "trajectory_kept": len(kept),
        "trajectory_dropped_repetitive": len(prompts) - len(kept),
        "trajectory_blocks": blocks,
        "trajectory_mean_states_per_block": sum(len(b["states"]) for r in records.values() for b in r["blocks"])
        / max(blocks, 1),
        # wall-clock seconds of this run's collection, all processes (0 when the cache held everything)
        "collect_seconds": round(seconds, 1) if fresh else 0.0,
        "collected_prompts_here": collected,
    }
    if not kept:
        raise UserError(f"train.{cfg.key}: all {len(prompts)} collected outputs repeat themselves (an n-gram of "
                        f"{cfg.repeat_ngram} tokens {cfg.repeat_count} times); raise train.{cfg.key}.repeat_count "
                        "or use more prompts")
    log.info("trajectories: %d prompts, %d kept (%d repetitive dropped), %d blocks, %.2f states per block",
             len(prompts), len(kept), stats["trajectory_dropped_repetitive"], blocks,
             stats["trajectory_mean_states_per_block"])
    return kept, stats


def output(record: dict, eos_id: int) -> list[int]:
    """The collected output up to its first EOS."""
    ids = [t for b in record["blocks"] for t in b["fixed"]]
    return ids[: ids.index(eos_id)] if eos_id in ids else ids
