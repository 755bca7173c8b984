"""One collator for SFT, MSN and pretraining: pad, mask the loss, and (MSN) noise the inputs.

A feature is ``{"input_ids": prompt + response ids, "prompt_len": P}`` (pretraining: P = 0). Labels are the
gold ids with -100 on the prompt and the padding; MSN changes only ``input_ids``, never the labels. Noise is
drawn here, at batching time, so every sample gets a fresh segment each time it is seen.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from specnoise.config import NoiseConfig
from specnoise.training.noise import add_noise


@dataclass
class Collator:
    pad_id: int
    noise: NoiseConfig | None = None  # None: plain SFT / pretraining
    vocab_size: int = 0
    seed: int = 0
    model: Any = None  # noise.location=ppl scores segments with the model being trained (set by the trainer)
    stats: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        lengths = torch.tensor([len(f["input_ids"]) for f in features])
        prompt_lens = torch.tensor([int(f.get("prompt_len", 0)) for f in features])
        ids = torch.full((len(features), int(lengths.max())), self.pad_id, dtype=torch.long)
        for row, f in enumerate(features):
            ids[row, : len(f["input_ids"])] = torch.as_tensor(f["input_ids"])
        pos = torch.arange(ids.shape[1])[None, :]
        real = pos < lengths[:, None]
        labels = ids.masked_fill(~real | (pos < prompt_lens[:, None]), -100)
        inputs = ids if self.noise is None else self.noised(ids, prompt_lens, lengths)
        return {"input_ids": inputs, "attention_mask": real.long(), "labels": labels}

    def noised(self, ids, prompt_lens, lengths) -> torch.Tensor:
        n = self.noise
        token_loss = self.token_loss(ids, lengths) if n.location == "ppl" else None
        noisy, mask, seg_lens = add_noise(ids, prompt_lens, lengths, length=n.length, content=n.content,
                                          segments=n.segments, short=n.short_response, vocab_size=self.vocab_size,
                                          token_loss=token_loss, generator=self.generator)
        self.stats["noise/samples"] += len(ids)
        self.stats["noise/short_shrunk"] += int(((seg_lens > 0) & (seg_lens < n.length)).sum())
        self.stats["noise/short_skipped"] += int((seg_lens == 0).sum())
        self.stats["noise/tokens"] += int(mask.sum())
        return noisy

    @torch.no_grad()
    def token_loss(self, ids, lengths) -> torch.Tensor:
        """[B, T] loss of each gold token given its prefix under the current model (0 at position 0)."""
        if self.model is None:
            raise RuntimeError("noise.location=ppl needs collator.model set to the model being trained")
        device = next(self.model.parameters()).device
        mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        loss = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:].to(device), reduction="none")
        return torch.cat([loss.new_zeros(len(ids), 1), loss], dim=1).cpu()

    def clean(self) -> Collator:
        """The same collator without noise: held-out losses of SFT and MSN are measured on clean inputs."""
        return Collator(self.pad_id, None, self.vocab_size, self.seed)
