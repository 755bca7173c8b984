"""``decoder=``: one dataclass per decoder option of conf/decoder/, and the registry of their names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specnoise.config.checks import ASSETS_DIR, MISSING, at_least, check, check_corpus, one_of
from specnoise.tree_templates import TEMPLATES as TREE_TEMPLATES


@dataclass
class DecoderConfig:
    # whether the decoder samples at temperature > 0 (the one place this is said): every drafter does, through the
    # verifier; a greedy-only decoder (the generate() peers) keeps the sampling keys below neutral
    samples: ClassVar[bool] = True

    name: str = MISSING
    # benchmark jobs use benchmark.max_new_tokens (this key may repeat it, but not differ: Config checks);
    # without a benchmark this is the budget for `prompt` (None: benchmark.max_new_tokens)
    max_new_tokens: int | None = None
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0  # seeds noise initialisation and sampling
    # hardware-aware drafting (decoding/auto.py): size every step's proposal from the measured forward cost and the
    # drafter's running acceptance (0: a plain AR step); False keeps the faithful fixed sizes. AR and the generate()
    # peers have nothing to size (a no-op there, so one override flips a whole sweep)
    auto: bool = False
    # decoder.auto's forward-cost timings: a folder of one file per machine + model + settings, or one .json file used
    # whatever the machine (a pinned curve: reproducible choices); None: probe every run
    cost_cache: str | None = "outputs/cost_cache"

    def __post_init__(self) -> None:
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "decoder.max_new_tokens",
              f"got {self.max_new_tokens}, must be >= 1")
        at_least(self.temperature, "decoder.temperature", 0.0)
        check(0.0 < self.top_p <= 1.0, "decoder.top_p", f"got {self.top_p}, must be in (0, 1]")
        at_least(self.top_k, "decoder.top_k", 0)
        if not self.samples:  # a greedy-only decoder would silently ignore these
            for key, neutral in NEUTRAL_SAMPLING.items():
                check(getattr(self, key) == neutral, f"decoder.{key}",
                      f"decoder={self.name} is greedy-only, so {key}={getattr(self, key)} would be ignored: use "
                      f"{key}={neutral}, or a decoder that samples ({', '.join(sampling_decoders())})")

    @property
    def sampling_keys_set(self) -> bool:
        """Any sampling key off its neutral value (with temperature 0 AR still decodes greedily)."""
        return any(getattr(self, key) != neutral for key, neutral in NEUTRAL_SAMPLING.items())


NEUTRAL_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}  # the values under which decoding is greedy


# a ``decoders`` entry NAME+auto: decoder NAME with decoder.auto=true, timed in the same job as the others (beside NAME
# itself, faithful): comparing two jobs compares their AR baselines too, which moved 6-8% between the faithful and the
# auto job of a GPU lease (experiments/gpu/h100/checks2)
AUTO_VARIANT = "+auto"


def decoder_entry(entry: str) -> tuple[str, bool]:
    """A ``decoders`` entry's decoder name, and whether it is the ``NAME+auto`` variant."""
    name = entry.removesuffix(AUTO_VARIANT)
    return name, name != entry


def sampling_decoders() -> list[str]:
    return [name for name, schema in DECODER_SCHEMAS.items() if schema.samples]


@dataclass
class ARConfig(DecoderConfig):
    name: str = "ar"


@dataclass
class JacobiConfig(DecoderConfig):
    name: str = "jacobi"
    draft_len: int = 4  # noise slots verified per step (MSN: = training noise length)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.draft_len, "decoder.draft_len", 1)


@dataclass
class TRJacobiConfig(DecoderConfig):
    name: str = "tr_jacobi"
    tree: str = "mc_sim_7b_63"  # template name in decoding/trees.py
    topk: int = 10  # Jacobi candidates per depth
    retrieval: bool = True  # False = the paper's "w/o R" ablation
    retrieval_len: int = 5
    retrieval_ngram: int = 3
    faithful: bool = False  # reproduce MSN-R's speed-relevant quirks (never its lossy ones)
    calibrate: int = 1  # tree=auto: generations on the full tree before picking a sub-tree (then re-picked after each)

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self.tree, "decoder.tree", (*TREE_TEMPLATES, "auto"))
        check(not (self.auto and self.tree == "auto"), "decoder.tree",
              "tree=auto picks one sub-tree per generation, decoder.auto=true sizes every step: set decoder.tree to a "
              "template (auto cuts its node list) or decoder.auto=false")
        at_least(self.calibrate, "decoder.calibrate", 1)
        at_least(self.topk, "decoder.topk", 1)
        at_least(self.retrieval_len, "decoder.retrieval_len", 1)
        at_least(self.retrieval_ngram, "decoder.retrieval_ngram", 1)


@dataclass
class PLDConfig(DecoderConfig):
    name: str = "pld"
    max_ngram_size: int = 3
    num_pred_tokens: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.max_ngram_size, "decoder.max_ngram_size", 1)
        at_least(self.num_pred_tokens, "decoder.num_pred_tokens", 1)


@dataclass
class LookaheadConfig(DecoderConfig):
    name: str = "lookahead"
    W: int = 7  # window
    N: int = 5  # n-gram size including the key
    G: int = 7  # n-grams kept per key and verified per step
    faithful: bool = False  # LADE: a fully matched n-gram drops its bonus token

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.W, "decoder.W", 1)
        at_least(self.N, "decoder.N", 2)
        at_least(self.G, "decoder.G", 0)


@dataclass
class TokenRecyclingConfig(DecoderConfig):
    name: str = "token_recycling"
    tree: str = "mc_sim_7b_63"  # static tree template in decoding/trees.py, drafted by BFS over the matrix
    topk: int = 10  # candidates kept per token (the adjacency matrix's columns; the template's ranks must fit)
    reuse_history: bool = True  # keep the matrix across prompts (reset after the benchmark warm-up)

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self.tree, "decoder.tree", tuple(TREE_TEMPLATES))
        at_least(self.topk, "decoder.topk", 1)
        widest = 1 + max(c for node in TREE_TEMPLATES[self.tree] for c in node)
        check(self.topk >= widest, "decoder.topk", f"got {self.topk}: tree {self.tree} uses candidate ranks up to "
                                                   f"{widest - 1}, set decoder.topk >= {widest} or a smaller tree")


SHIPPED_CORPUS = str(ASSETS_DIR / "data" / "codegen-instruct.json")  # the shipped SFT data (conf/data/codegen-instruct)


@dataclass
class SAMConfig(TokenRecyclingConfig):
    """SAM-Decoding; ``tree`` / ``topk`` / ``reuse_history`` are its Token Recycling fallback's."""

    name: str = "sam"
    corpus: str | None = None  # JSON/JSONL text (or .npy token ids) for the static automaton; None: dynamic only
    cache_dir: str = "outputs/corpus_cache"  # tokenized corpora and suffix arrays (relative: to the working dir)
    max_draft: int = 10  # tokens drafted after the longest match
    min_match: int = 2  # shorter matches draft with the fallback instead
    fallback: str = "token_recycling"  # token_recycling | none (a plain AR step)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_corpus(self.corpus)
        at_least(self.max_draft, "decoder.max_draft", 1)
        at_least(self.min_match, "decoder.min_match", 1)
        one_of(self.fallback, "decoder.fallback", ("token_recycling", "none"))


@dataclass
class RESTConfig(DecoderConfig):
    name: str = "rest"
    corpus: str = SHIPPED_CORPUS  # JSON/JSONL text (or .npy token ids): the datastore
    cache_dir: str = "outputs/corpus_cache"  # tokenized corpora and suffix arrays (relative: to the working dir)
    max_suffix: int = 16  # longest context suffix looked up (the longest that occurs is used)
    min_suffix: int = 2  # a shorter match drafts nothing
    num_draft: int = 64  # trie nodes verified per step (the most frequent continuation prefixes)
    max_depth: int = 8  # tokens per retrieved continuation
    matches: int = 500  # occurrences whose continuations build the trie (spread over all of them)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_corpus(self.corpus)
        at_least(self.min_suffix, "decoder.min_suffix", 1)
        check(self.max_suffix >= self.min_suffix, "decoder.max_suffix",
              f"got {self.max_suffix}, must be >= decoder.min_suffix={self.min_suffix}")
        for key in ("num_draft", "max_depth", "matches"):
            at_least(getattr(self, key), f"decoder.{key}", 1)


@dataclass
class SpeculativeConfig(DecoderConfig):
    name: str = "speculative"
    gamma: int = 5
    schedule: str = "constant"  # constant | heuristic (+2 on full acceptance, -1 otherwise, floor 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.gamma, "decoder.gamma", 1)
        one_of(self.schedule, "decoder.schedule", ("constant", "heuristic"))


@dataclass
class OuroborosConfig(DecoderConfig):
    name: str = "ouroboros"
    gamma: int = 6  # draft tokens per target step (paper: γ)
    W: int = 15  # lookahead window of the draft model (= phrase pool capacity per key; paper: W = G)
    # phrase body length M: tokens a phrase adds. The draft's lookahead n-gram size is N = M + 1 (OUR-R's
    # lookahead_level) and the paper's β is N + 1 = M + 2 (docs/algorithms.md §9.1): paper β 8 -> phrase_len 6
    phrase_len: int = 4
    beta: int | None = None  # renamed phrase_len (a different quantity from the paper's β); setting it is an error
    K: int = 3  # phrases that lengthen a draft
    phrase_drafting: bool = True  # ablation: False = plain token-by-token drafting
    lengthening: bool = True  # ablation: False = no phrase candidates after the draft
    harvest: str = "paper"  # paper | specbench | none (ablation: no harvest from verification)
    reuse_history: bool = True  # keep the phrase pool across prompts
    faithful: bool = False  # OUR-R: a fully matched phrase drops its bonus token
    # under sampling (temperature > 0): draft tokens sampled from the draft model and kept by rejection sampling, as
    # speculative decoding does (pool phrases stay deterministic guesses); False = greedy drafts verified by matching
    # the target's draws. Both are exact; no effect when greedy
    sampled_drafts: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.gamma, "decoder.gamma", 1)
        at_least(self.W, "decoder.W", 1)
        check(self.beta is None, "decoder.beta", "renamed decoder.phrase_len (the phrase body length M = paper β - 2): "
                                                 f"set decoder.phrase_len={self.beta} for what beta meant before")
        at_least(self.phrase_len, "decoder.phrase_len", 1)
        at_least(self.K, "decoder.K", 0)
        one_of(self.harvest, "decoder.harvest", ("paper", "specbench", "none"))


@dataclass
class HFGreedyConfig(DecoderConfig):
    samples: ClassVar[bool] = False  # the peers run generate() greedily
    name: str = "hf_greedy"


@dataclass
class HFStaticConfig(DecoderConfig):
    samples: ClassVar[bool] = False  # the peers run generate() greedily
    name: str = "hf_static"  # generate() greedy with a static cache (compiled on CUDA): the fastest stock AR


@dataclass
class HFPLDConfig(DecoderConfig):
    samples: ClassVar[bool] = False  # the peers run generate() greedily
    name: str = "hf_pld"
    prompt_lookup_num_tokens: int = 10
    max_matching_ngram_size: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.prompt_lookup_num_tokens, "decoder.prompt_lookup_num_tokens", 1)
        at_least(self.max_matching_ngram_size, "decoder.max_matching_ngram_size", 1)


@dataclass
class HFAssistedConfig(DecoderConfig):
    samples: ClassVar[bool] = False  # the peers run generate() greedily
    name: str = "hf_assisted"
    num_assistant_tokens: int = 5
    schedule: str = "constant"

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self.num_assistant_tokens, "decoder.num_assistant_tokens", 1)
        one_of(self.schedule, "decoder.schedule", ("constant", "heuristic"))


DECODER_SCHEMAS: dict[str, type[DecoderConfig]] = {
    c.name: c  # the class default: no instance, whose checks may import modules that import this one
    for c in (ARConfig, JacobiConfig, TRJacobiConfig, PLDConfig, LookaheadConfig, TokenRecyclingConfig, SAMConfig,
              RESTConfig, SpeculativeConfig, OuroborosConfig, HFGreedyConfig, HFPLDConfig, HFAssistedConfig,
              HFStaticConfig)
}
