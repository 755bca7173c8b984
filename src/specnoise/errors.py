"""The errors the entry point turns into one readable line (exit status 2): no Hydra or OmegaConf here, so every
layer, the decoding core included, can raise them."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config value, model path, data file, prompt): the message says what to change.

    The entry point prints it as one line and exits with status 2, with no stack trace."""


class ConfigError(UserError, ValueError):
    """A bad config value: the message names the key and what is allowed."""
