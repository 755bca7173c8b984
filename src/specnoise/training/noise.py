"""MSN noise injection (docs/algorithms.md §2): pure tensor code, no model, no config objects.

A batch is right-padded ``ids`` [B, T] with, per row, ``prompt_lens`` P and real ``lengths`` T_b. The
response is positions [P, T_b); its last token (usually EOS) is never noised, so a segment of length L
starts at s in [P, T_b - L - 1]. Short responses (fewer than L + 1 tokens) follow ``short``:
``skip`` noise for that sample (the default, as the paper: responses of <= L tokens are not noised), or
``shrink`` the segment to R - 1 tokens (no noise when R = 1).
"""

from __future__ import annotations

import torch


def segment_lengths(prompt_lens: torch.Tensor, lengths: torch.Tensor, length: int, short: str) -> torch.Tensor:
    """Noise tokens per segment for each row; 0 means the row gets no noise."""
    room = (lengths - prompt_lens - 1).clamp(min=0)  # response tokens that may be noised
    if short == "shrink":
        return room.clamp(max=length)
    return torch.where(room >= length, torch.full_like(room, length), torch.zeros_like(room))


def random_starts(prompt_lens, lengths, seg_lens, segments: int, generator=None) -> torch.Tensor:
    """[B, segments] uniform segment starts inside each response (independent draws, may overlap)."""
    n_valid = (lengths - seg_lens - prompt_lens).clamp(min=1)
    u = torch.rand(len(lengths), segments, generator=generator)
    return prompt_lens[:, None] + (u * n_valid[:, None]).long()


def lowest_loss_starts(token_loss, prompt_lens, lengths, seg_lens, segments: int) -> torch.Tensor:
    """[B, segments] starts of the segments whose gold tokens have the lowest summed loss (paper App. A).

    ``token_loss[b, i]`` is the loss of token i given tokens < i under the current model."""
    B, T = token_loss.shape
    csum = torch.cat([token_loss.new_zeros(B, 1), token_loss.cumsum(1)], dim=1)  # csum[:, i] = sum of loss[:i]
    starts = torch.arange(T)[None, :].expand(B, T)
    ends = (starts + seg_lens[:, None]).clamp(max=T)
    score = csum.gather(1, ends) - csum[:, :T]
    valid = (starts >= prompt_lens[:, None]) & (starts <= (lengths - seg_lens - 1)[:, None])
    score = score.masked_fill(~valid, float("inf"))
    k = min(segments, T)
    best = score.topk(k, dim=1, largest=False)
    # rows with fewer valid starts than segments repeat their best one
    picks = torch.where(best.values.isinf(), best.indices[:, :1], best.indices)
    return picks if k == segments else torch.cat([picks, picks[:, :1].expand(B, segments - k)], dim=1)


def segment_mask(starts: torch.Tensor, seg_lens: torch.Tensor, width: int) -> torch.Tensor:
    """[B, width] True at every noised position."""
    pos = torch.arange(width)[None, None, :]
    inside = (pos >= starts[:, :, None]) & (pos < (starts + seg_lens[:, None])[:, :, None])
    return inside.any(1)


def fill_ahead(ids: torch.Tensor, starts: torch.Tensor, seg_lens: torch.Tensor, generator=None) -> torch.Tensor:
    """Each noised position i takes the token at a uniform earlier position j < i, filled left to right in
    place as the reference does (a later noise token may copy an earlier noise token)."""
    out = ids.clone()
    rows = torch.arange(len(ids))
    for start in starts.sort(dim=1).values.T:  # segments left to right
        for k in range(int(seg_lens.max()) if len(seg_lens) else 0):
            pos = (start + k).clamp(max=ids.shape[1] - 1)  # rows whose segment is shorter rewrite pos unchanged
            j = (torch.rand(len(ids), generator=generator) * pos).long()
            out[rows, pos] = torch.where(k < seg_lens, out[rows, j], out[rows, pos])
    return out


def fill_random(ids: torch.Tensor, mask: torch.Tensor, vocab_size: int, generator=None) -> torch.Tensor:
    """Noised positions take tokens drawn uniformly from the vocabulary."""
    noise = torch.randint(0, vocab_size, ids.shape, generator=generator)
    return torch.where(mask, noise, ids)


def add_noise(ids, prompt_lens, lengths, *, length: int, content: str = "ahead", segments: int = 1,
              short: str = "skip", vocab_size: int = 0, token_loss=None, generator=None):
    """(noisy ids, mask of noised positions, per-row segment lengths). ``token_loss`` given = ppl location."""
    prompt_lens = prompt_lens.clamp(min=1)  # position 0 has no earlier token to copy
    seg_lens = segment_lengths(prompt_lens, lengths, length, short)
    if token_loss is None:
        starts = random_starts(prompt_lens, lengths, seg_lens, segments, generator)
    else:
        starts = lowest_loss_starts(token_loss, prompt_lens, lengths, seg_lens, segments)
    mask = segment_mask(starts, seg_lens, ids.shape[1])
    if content == "ahead":
        noisy = fill_ahead(ids, starts, seg_lens, generator)
    else:
        noisy = fill_random(ids, mask, vocab_size, generator)
    return noisy, mask, seg_lens
