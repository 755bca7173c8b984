"""Pretraining corpora that need no network: Python source on this machine, or a local text file.

``python_source``: every ``.py`` file of the standard library (without its site-packages) and of the
installed packages in ``data.packages``. Files are de-duplicated by content and ordered by a hash of
their path, so the order is the same on every machine with the same files and a ``data.max_chars`` cut
samples all packages instead of the alphabetically first one. One file in ``HELDOUT_EVERY`` (again by
path hash) is held out, whole, for the held-out loss: no held-out line is ever trained on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sysconfig
from pathlib import Path

from specnoise.config import DataConfig, UserError

HELDOUT_EVERY = 50  # ~2% of files
MAX_FILE_CHARS = 400_000  # generated tables and vendored blobs teach little code


def _key(rel: str) -> str:
    return hashlib.sha1(rel.encode()).hexdigest()


def source_roots(data: DataConfig) -> list[tuple[str, Path]]:
    roots = []
    if data.include_stdlib:
        roots.append(("stdlib", Path(sysconfig.get_paths()["stdlib"])))
    for name in data.packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"data.packages: {name!r} is not an installed package; remove it or pip install it")
        roots.append((name, Path(list(spec.submodule_search_locations)[0])))
    if not roots:
        raise UserError("data: the python_source corpus is empty; set data.include_stdlib=true or data.packages=[...]")
    return roots


def python_files(data: DataConfig) -> list[tuple[str, Path]]:
    """(relative name, path) of every corpus file, in the corpus order."""
    files = {}
    for label, root in source_roots(data):
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if label == "stdlib" and rel.parts[0] in ("site-packages", "dist-packages"):
                continue
            files[f"{label}/{rel.as_posix()}"] = path
    return sorted(files.items(), key=lambda kv: _key(kv[0]))


def load_python_source(data: DataConfig) -> tuple[list[str], list[str]]:
    """(train texts, held-out texts); ``data.max_chars`` bounds the training part."""
    train, heldout, seen, chars = [], [], set(), 0
    for rel, path in python_files(data):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha1(text.encode()).digest()
        if not text.strip() or len(text) > MAX_FILE_CHARS or digest in seen:
            continue
        seen.add(digest)
        if int(_key(rel), 16) % HELDOUT_EVERY == 0:
            heldout.append(text)
        elif data.max_chars is None or chars < data.max_chars:
            train.append(text)
            chars += len(text)
    return train, heldout


def load_text(data: DataConfig) -> tuple[list[str], list[str]]:
    """A local .txt (one document) or .json/.jsonl file with ``data.text_field`` per record."""
    path = Path(data.path or "")
    if not path.is_file():
        raise UserError(f"data.path: no file at {path} (a .txt, or .json/.jsonl with a {data.text_field!r} field)")
    if path.suffix == ".txt":
        texts = [path.read_text(encoding="utf-8")]
    else:
        raw = path.read_text(encoding="utf-8")
        rows = json.loads(raw) if path.suffix == ".json" else [json.loads(x) for x in raw.splitlines() if x.strip()]
        try:
            texts = [row[data.text_field] for row in rows]
        except (KeyError, TypeError) as err:
            raise UserError(f"data.text_field: records of {path} lack the field {data.text_field!r}") from err
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UserError(f"data.path: {path} holds no text")
    heldout = texts[::HELDOUT_EVERY] if len(texts) >= HELDOUT_EVERY else []
    train = [t for i, t in enumerate(texts) if len(texts) < HELDOUT_EVERY or i % HELDOUT_EVERY]
    return train, heldout


def load_corpus(data: DataConfig) -> tuple[list[str], list[str]]:
    if data.format == "python_source":
        return load_python_source(data)
    if data.format == "text":
        return load_text(data)
    raise UserError(f"data.format={data.format} is instruction data: train=pretrain needs data=python-corpus "
                    "or data.format=text")
