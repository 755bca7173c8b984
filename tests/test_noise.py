"""MSN noise and the collator on hand-made batches: where noise goes, what it is, what it leaves alone."""

from __future__ import annotations

import logging

import pytest
import torch

from specnoise.config import ConfigError, NoiseConfig
from specnoise.training.collator import Collator
from specnoise.training.noise import add_noise, lowest_loss_starts, segment_lengths
from specnoise.training.preflight import check_noise_fits, noise_fit_counts

PAD = 0


def features(seed: int = 0, n: int = 16, vocab: int = 50):
    """Rows of distinct lengths: prompts 2..9 tokens, responses 1..30 tokens (some shorter than a segment)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        p = 2 + i % 8
        r = 1 + (i * 7) % 30
        rows.append({"input_ids": torch.randint(1, vocab, (p + r,), generator=gen).tolist(), "prompt_len": p})
    return rows


def collate(noise: NoiseConfig | None, rows, seed: int = 0, vocab: int = 50):
    return Collator(PAD, noise, vocab_size=vocab, seed=seed)(rows)


def test_labels_and_prompt_untouched_noise_inside_one_response_segment():
    rows = features()
    clean = collate(None, rows)
    for seed in range(5):
        noisy = collate(NoiseConfig(length=4), rows, seed=seed)
        assert torch.equal(noisy["labels"], clean["labels"])
        assert torch.equal(noisy["attention_mask"], clean["attention_mask"])
        for row, f in enumerate(rows):
            p, t = f["prompt_len"], len(f["input_ids"])
            diff = (noisy["input_ids"][row] != clean["input_ids"][row]).nonzero().flatten().tolist()
            assert all(p <= i < t - 1 for i in diff)  # response only, never its last (EOS) token
            if diff:
                assert diff[-1] - diff[0] < min(4, t - p - 1)  # inside one segment of the (shrunk) length


def test_labels_mask_prompt_and_padding():
    rows = features()
    batch = collate(None, rows)
    for row, f in enumerate(rows):
        p, t = f["prompt_len"], len(f["input_ids"])
        labels = batch["labels"][row]
        assert (labels[:p] == -100).all() and (labels[t:] == -100).all()
        assert labels[p:t].tolist() == f["input_ids"][p:]


def test_segment_has_the_given_length_and_lies_in_the_response():
    ids = torch.arange(1, 41)[None, :].repeat(64, 1)  # all tokens distinct: every change is visible
    prompt, lengths = torch.full((64,), 10), torch.full((64,), 40)
    noisy, mask, seg = add_noise(ids, prompt, lengths, length=4, content="random", vocab_size=10_000,
                                 generator=torch.Generator().manual_seed(0))
    assert (seg == 4).all() and (mask.sum(1) == 4).all()
    for row in range(64):
        where = mask[row].nonzero().flatten()
        assert where[0] >= 10 and where[-1] <= 38 and where[-1] - where[0] == 3
    assert torch.equal(noisy[:, :10], ids[:, :10]) and torch.equal(noisy[~mask], ids[~mask])


def test_ahead_noise_copies_earlier_tokens_of_the_same_sequence():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 10_000, (32, 60), generator=gen)  # distinct enough that a copy is recognisable
    prompt, lengths = torch.randint(2, 20, (32,), generator=gen), torch.full((32,), 60)
    noisy, mask, _ = add_noise(ids, prompt, lengths, length=6, content="ahead", segments=2, generator=gen)
    assert mask.any()
    for row, col in mask.nonzero().tolist():
        assert noisy[row, col] in noisy[row, :col]  # an earlier position of the (noised, in place) sequence
    assert torch.equal(noisy[~mask], ids[~mask])


def test_random_noise_draws_from_the_vocabulary():
    ids = torch.full((32, 40), 7)  # ahead noise could only copy 7
    prompt, lengths = torch.full((32,), 5), torch.full((32,), 40)
    ahead, mask, _ = add_noise(ids, prompt, lengths, length=4, content="ahead")
    assert (ahead == 7).all()
    noisy, mask, _ = add_noise(ids, prompt, lengths, length=4, content="random", vocab_size=1000)
    values = noisy[mask]
    assert (values != 7).float().mean() > 0.9 and values.min() >= 0 and values.max() < 1000
    assert len(values.unique()) > 50


def test_ppl_location_picks_the_lowest_loss_segment():
    loss = torch.full((3, 30), 5.0)
    loss[0, 12:15] = 0.1  # the cheapest 3 tokens of row 0
    loss[1, 2:5] = 0.0  # cheap but inside the prompt: must not be chosen
    loss[1, 20:23] = 1.0
    loss[2, 27:30] = 0.0  # cheap but overlapping the last token: must not be chosen
    prompt, lengths = torch.tensor([5, 8, 5]), torch.full((3,), 30)
    seg = segment_lengths(prompt, lengths, 3, "shrink")
    starts = lowest_loss_starts(loss, prompt, lengths, seg, segments=1)
    assert starts[:, 0].tolist()[:2] == [12, 20]
    assert 5 <= starts[2, 0] <= 30 - 3 - 1
    ids = torch.arange(30)[None, :].repeat(3, 1) + 1
    noisy, mask, _ = add_noise(ids, prompt, lengths, length=3, content="random", vocab_size=10_000, token_loss=loss)
    assert mask[0, 12:15].all() and mask[0].sum() == 3 and mask[1, 20:23].all()


def test_ppl_collator_uses_the_model(target):
    rows = [{"input_ids": list(range(3, 40)), "prompt_len": 10}, {"input_ids": list(range(5, 30)), "prompt_len": 4}]
    collator = Collator(PAD, NoiseConfig(length=4, location="ppl"), vocab_size=96, model=target.model)
    batch = collator(rows)
    loss = collator.token_loss(Collator(PAD)(rows)["input_ids"], torch.tensor([37, 25]))
    for row, f in enumerate(rows):
        diff = (batch["input_ids"][row] != torch.tensor(f["input_ids"] + [PAD] * (37 - len(f["input_ids"])))).nonzero()
        p, t = f["prompt_len"], len(f["input_ids"])
        scores = [float(loss[row, s:s + 4].sum()) for s in range(p, t - 4)]
        best = p + min(range(len(scores)), key=scores.__getitem__)
        assert all(best <= i < best + 4 for i in diff.flatten().tolist())


def test_noise_is_fresh_each_time_a_sample_is_seen():
    rows = features()
    collator = Collator(PAD, NoiseConfig(length=4), vocab_size=50, seed=0)
    first, second = collator(rows)["input_ids"], collator(rows)["input_ids"]
    assert not torch.equal(first, second)


@pytest.mark.parametrize("rule", ["shrink", "skip"])
def test_short_responses_follow_the_documented_rule(rule):
    # responses of 1, 2, 3, 4, 5, 6 tokens; a segment of 4 needs 5 (the last token is never noised)
    rows = [{"input_ids": list(range(10, 13 + r)), "prompt_len": 3} for r in range(1, 7)]
    collator = Collator(PAD, NoiseConfig(length=4, short_response=rule, content="random"), vocab_size=10_000)
    batch = collator(rows)
    clean = Collator(PAD)(rows)["input_ids"]
    changed = (batch["input_ids"] != clean).sum(1).tolist()
    expected = [0, 1, 2, 3, 4, 4] if rule == "shrink" else [0, 0, 0, 0, 4, 4]
    assert all(c <= e for c, e in zip(changed, expected))  # a random token may equal the gold one
    assert sum(changed) >= sum(expected) - 2
    assert collator.stats["noise/short_skipped"] == (1 if rule == "shrink" else 4)
    assert collator.stats["noise/short_shrunk"] == (3 if rule == "shrink" else 0)


def test_short_responses_are_skipped_by_default_as_in_the_paper():
    assert NoiseConfig().short_response == "skip"


def rows_with_responses(*response_lens: int, prompt: int = 3) -> list[dict]:
    """Features whose responses (EOS included) have the given token counts."""
    return [{"input_ids": list(range(10, 10 + prompt + r)), "prompt_len": prompt} for r in response_lens]


@pytest.mark.parametrize("rule", ["shrink", "skip"])
def test_fit_counts_follow_the_collator(rule):
    # responses of 1 (empty: only EOS), 2..4 (short for a 4-token segment) and 5, 6, 9 tokens (fit)
    rows = rows_with_responses(1, 2, 3, 4, 5, 6, 9)
    noise = NoiseConfig(length=4, short_response=rule)
    counts = noise_fit_counts(rows, noise)
    collator = Collator(PAD, noise, vocab_size=50)
    collator(rows)
    assert counts["full"] == 3 and counts["empty"] == 1
    assert counts["shrunk"] == collator.stats["noise/short_shrunk"] == (3 if rule == "shrink" else 0)
    assert counts["skipped"] == (0 if rule == "shrink" else 3)
    assert counts["skipped"] + counts["empty"] == collator.stats["noise/short_skipped"]


def test_noise_longer_than_every_response_stops_training():
    rows = rows_with_responses(2, 3, 5, 5)  # at most 4 tokens can be noised
    with pytest.raises(ConfigError, match=r"train\.noise\.length=8: no sample would be noised.*plain SFT.*of 4 "
                                          r"training samples 0 fit.* 4 skipped"):
        check_noise_fits(rows, NoiseConfig(length=8, short_response="skip"))
    with pytest.raises(ConfigError, match=r"train\.noise\.length=8: most samples would get a shrunk segment.*"
                                          r"4 would be shrunk"):
        check_noise_fits(rows, NoiseConfig(length=8, short_response="shrink"))
    with pytest.raises(ConfigError, match="no sample would be noised.*4 have an empty response"):
        check_noise_fits(rows_with_responses(1, 1, 1, 1), NoiseConfig(length=1, short_response="shrink"))
    with pytest.raises(ConfigError, match=r"most samples would get no noise.*1 fit.*2 skipped.*1 have an empty"):
        check_noise_fits(rows_with_responses(1, 2, 3, 9), NoiseConfig(length=4))  # a few noised is not MSN either


def test_partly_short_responses_warn_with_counts(caplog):
    rows = rows_with_responses(1, 3, 9, 9, 9)
    with caplog.at_level(logging.WARNING, logger="specnoise.train"):
        counts = check_noise_fits(rows, NoiseConfig(length=4, short_response="shrink"))
    assert (counts["full"], counts["shrunk"], counts["empty"]) == (3, 1, 1)
    assert "of 5 training samples 3 fit a 4-token segment, 1 would be shrunk, 0 skipped" in caplog.text
    assert "1 have an empty response" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specnoise.train"):
        check_noise_fits(rows_with_responses(9, 9), NoiseConfig(length=4))
    assert not caplog.text  # every sample fits: nothing to say
