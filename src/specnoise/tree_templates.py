"""Token-tree templates as data (``decoder.tree``): the config checks the names, ``decoding/trees.py`` builds them.

A template is a list of nodes; a node is a tuple of candidate columns, one per depth, Medusa style (trees.py).
"""

from __future__ import annotations

# Medusa's vicuna-7b tree (`mc_sim_7b_63`, the same list in Medusa and Spec-Bench): depth counts 10/28/23/2.
MC_SIM_7B_63 = [
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
]

TEMPLATES: dict[str, list[tuple[int, ...]]] = {
    "mc_sim_7b_63": MC_SIM_7B_63,
    # smaller trees for weak models or slow hardware, where 69-token verify forwards cost more than they win
    "3level_20": [
        (0,), (1,), (2,), (3,), (4,), (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0), (3, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (1, 0, 0), (0, 2, 0), (2, 0, 0),
    ],
    "2level_12": [(0,), (1,), (2,), (3,), (4,), (5,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)],
    # one top-1 chain: TR-Jacobi without branching (plus the retrieval chain)
    "chain_4": [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)],
}
