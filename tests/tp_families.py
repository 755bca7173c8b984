"""Run under ``torchrun --nproc-per-node 2``: every saved tiny family model in ROOT loaded with transformers' tensor
parallel (``tp_plan="auto"``, gloo on the CPU), decoded by AR and a few decoders; rank 0 writes ROOT/tp.json with each
family's tokens per decoder and prompt, or the error that stopped it (test_families.py compares them with one
process). Usage: torchrun --nproc-per-node 2 tests/tp_families.py ROOT FAMILY..."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
torch.set_num_threads(1)

from conftest import EOS  # noqa: E402
from helpers_decoding import schema  # noqa: E402
from specnoise.config import ModelConfig  # noqa: E402
from specnoise.decoding.base import build_decoder  # noqa: E402
from specnoise.models import LoadedModel, load_model  # noqa: E402
from specnoise.ranks import check_agree, rank  # noqa: E402

TP_DECODERS = ["ar", "tr_jacobi", "lookahead", "speculative"]
ATTENTION = {"gemma2": "eager"}  # transformers has no SDPA path for Gemma 2 (its logit soft-capping)


def decode(model: LoadedModel, draft: LoadedModel, prompts: list[list[int]], new_tokens: int) -> dict:
    return {name: [build_decoder(schema(name), model, draft).generate(p, new_tokens).tokens for p in prompts]
            for name in TP_DECODERS}


def as_loaded(path: Path, tp: bool) -> LoadedModel:
    family = path.name.removesuffix("-draft")
    loaded = load_model(ModelConfig(name=path.name, path=str(path), tp_plan="auto" if tp else None,
                                    static_cache=False, attn_implementation=ATTENTION.get(family, "sdpa")))
    return LoadedModel(loaded.name, loaded.path, loaded.model, loaded.tokenizer, frozenset({EOS}), "raw")


def main(root: Path, families: list[str]) -> None:
    spec = json.loads((root / "prompts.json").read_text())
    found = {}
    for family in families:
        try:
            target, draft = as_loaded(root / family, tp=True), as_loaded(root / f"{family}-draft", tp=False)
            tokens = decode(target, draft, spec["prompts"], spec["new_tokens"])
            check_agree([t for name in TP_DECODERS for t in tokens[name]])
            found[family] = tokens
        except Exception as err:  # noqa: BLE001  (a family's verdict, not the run's)
            found[family] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    if rank() == 0:
        (root / "tp.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
