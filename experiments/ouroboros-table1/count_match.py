"""Ouroboros Table 1 in miniature: how many draft tokens the target agrees with (#Match) against the accepted prefix A.

OUR-P §3.3 defines, for one speculative-decoding step with draft d_1..d_γ and the target's predictions v_1..v_γ at the
same positions, #Match = Σ_i [d_i = v_i], and finds it much larger than A, the length of the accepted prefix (Table 1,
speculative decoding with γ = 20): the discarded tail of a draft still holds text the target would write, misplaced.
The runner records accepted tokens per step, not the target's predictions over a rejected tail, so this script runs
greedy speculative decoding with ``decoder.gamma`` (default 20 here) through the library, reads the target's argmax
at every draft row with the verdict (the verifier's ``read_argmax`` hook) and averages A and #Match over the steps
whose draft had its full length (steps shortened by the budget left out).

    python experiments/ouroboros-table1/count_match.py [hydra overrides...]   # prints a markdown table

Default: the shipped pair (small-code-msn target, small-code-draft), 10 HumanEval and 10 CNN/DM prompts, 128 new
tokens, one thread. Exact counts: no timing is involved.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specnoise.bench.runner import set_up
from specnoise.conf_store import register
from specnoise.decoding.proposal import read_argmax

CONF = Path(__file__).resolve().parents[2] / "conf"
DEFAULTS = ["pair=small-code", "decoder=speculative", "decoder.gamma=20", "logger=none", "benchmark.threads=1",
            "benchmark.check_lossless=false"]


def count(overrides: list[str]) -> dict:
    register()  # the config schemas, as the entry point does
    with initialize_config_dir(str(CONF), version_base="1.3"):
        conf = OmegaConf.to_object(compose("config", overrides=DEFAULTS + overrides))
    setup = set_up(conf, None)
    decoder = setup.decoders["speculative"]
    drafter, gamma = decoder.drafter, conf.decoder.gamma
    propose_steps, observe = drafter.propose_steps, drafter.observe
    steps: list[tuple[int, int]] = []  # (A, #Match) per full-length step
    drafted = {}

    def propose_reading_argmax(room):  # a generator, as the drafter's: it yields the draft model's forwards
        proposal = yield from propose_steps(room)
        proposal.after = read_argmax  # the target's argmax at every block row comes back with the verdict
        drafted["d"] = proposal.tokens
        return proposal

    def observe_counting(v):
        d = drafted["d"].tolist()
        if len(d) == gamma:
            y = v.extra  # y[i] is the target's prediction after the root and d_1..d_i, i.e. v_{i+1}
            steps.append((min(v.accepted, gamma), sum(d[i] == y[i] for i in range(gamma))))
        observe(v)

    drafter.propose_steps, drafter.observe = propose_reading_argmax, observe_counting
    for sample in setup.samples:
        decoder.generate(setup.encode(sample, []), setup.budget)
    n = max(len(steps), 1)
    return {"prompts": len(setup.samples), "steps": len(steps), "A": sum(a for a, _ in steps) / n,
            "match": sum(m for _, m in steps) / n}


def main(argv: list[str]) -> None:
    print("| benchmark | prompts | full-length steps | A (accepted prefix) | #Match | #Match / A |")
    print("|---|---:|---:|---:|---:|---:|")
    for subset in ("humaneval-10", "cnndm-10"):
        r = count([f"+subset={subset}", *argv])
        print(f"| {subset} | {r['prompts']} | {r['steps']} | {r['A']:.2f} | {r['match']:.2f} | "
              f"{r['match'] / max(r['A'], 1e-9):.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
