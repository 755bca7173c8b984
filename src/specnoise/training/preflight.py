"""Checks that run before any model is loaded or trained, so a doomed run fails in seconds, not hours.

* ``check_writable``: ``train.output_dir`` must be a folder this process can write (else the run would
  only find out when saving the final model).
* ``check_noise_fits``: MSN needs responses longer than the noise segment. Counted on the tokenised training
  samples with the collator's own rule (``noise.segment_lengths``): a sample is noised in full, shrunk
  (``short_response=shrink``), skipped (``short_response=skip``) or has an empty response (only its EOS is
  left, so nothing can be noised). A full segment in fewer than half of the samples is a ConfigError: that
  run would be (nearly) plain SFT, or MSN with segments shorter than ``train.noise.length``. Fewer short or
  empty responses are logged as a warning with the counts.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path

import torch

from specnoise.config import ConfigError, NoiseConfig
from specnoise.training.noise import segment_lengths

log = logging.getLogger("specnoise.train")


def check_writable(folder: Path, key: str = "train.output_dir", relative_to: str = "the run directory") -> None:
    """Create ``folder``, write and remove a probe file; leaves nothing behind that was not there before."""
    created = not folder.exists()
    probe = folder / f".write-test-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
        if created:
            folder.rmdir()
    except OSError as err:
        raise ConfigError(f"{key}: cannot write to {folder} ({type(err).__name__}: {err.strerror or err}); set "
                          f"{key} to a writable folder (a relative path is inside {relative_to})") from err


def noise_fit_counts(features: list[dict], noise: NoiseConfig) -> Counter:
    """How the collator will treat each sample: full | shrunk | skipped | empty (response without a token to
    noise); ``noised`` = full + shrunk."""
    prompt_lens = torch.tensor([int(f.get("prompt_len", 0)) for f in features]).clamp(min=1)  # as add_noise
    lengths = torch.tensor([len(f["input_ids"]) for f in features])
    seg = segment_lengths(prompt_lens, lengths, noise.length, noise.short_response)
    room = lengths - prompt_lens - 1  # the response's tokens before its last one
    counts = Counter(full=int((seg == noise.length).sum()), shrunk=int(((seg > 0) & (seg < noise.length)).sum()),
                     empty=int((room <= 0).sum()))
    counts["skipped"] = len(features) - counts["full"] - counts["shrunk"] - counts["empty"]
    counts["noised"] = counts["full"] + counts["shrunk"]
    return counts


def check_noise_fits(features: list[dict], noise: NoiseConfig) -> Counter:
    """Raise when the full segment fits fewer than half of the responses; warn when it does not fit them all."""
    c, n, L = noise_fit_counts(features, noise), len(features), noise.length
    detail = (f"of {n} training samples {c['full']} fit a {L}-token segment, {c['shrunk']} would be shrunk, "
              f"{c['skipped']} skipped (short_response={noise.short_response}), {c['empty']} have an empty response")
    fix = f"lower train.noise.length (responses need more than {L} tokens) or use data with longer responses"
    if c["noised"] == 0:
        raise ConfigError(f"train.noise.length={L}: no sample would be noised, this MSN run would be plain SFT: "
                          f"{detail}; {fix}")
    if c["full"] * 2 < n:
        what = "get a shrunk segment" if c["shrunk"] > c["skipped"] + c["empty"] else "get no noise"
        raise ConfigError(f"train.noise.length={L}: most samples would {what}: {detail}; {fix}")
    if c["full"] < n:
        log.warning("MSN noise: %s", detail)
    return c
