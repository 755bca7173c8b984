"""``attn_implementation="sdpa_gqa"``: SDPA attention that never copies the KV cache for grouped-query heads.

With an attention mask (every tree, batched and static-cache forward passes one, and transformers builds one for a
chain of several tokens after a cache), transformers' ``sdpa`` expands each KV head to its group of query heads with
``repeat_kv``, a full copy of the cache in every layer and forward; under ``torch.compile`` even one-token steps
do. On an 8B model (8 KV heads for 32 query heads) over a 2048-slot static cache that is ~2 GB of memory traffic per
forward, a tenth of the weights'. Here the query heads of a group are packed into the query rows of their KV head
instead: each row still attends over exactly its own head's keys and values, and only the mask (rows x keys, no head
dimension) is repeated per group.

Registered with transformers' ``AttentionInterface`` / ``AttentionMaskInterface`` (its extension points; no modeling
file is touched), so ``from_pretrained(..., attn_implementation="sdpa_gqa")`` works for every model that dispatches
attention through them (Llama, Qwen2, Mistral, ...). Models without grouped heads run plain SDPA. The default of
every model config (``ModelConfig.attn_implementation``): on the 2-core CPU a 4-row batch's drafted forward of 2
tokens per row cost 1.55x its one-token forward with ``sdpa``'s copy, 1.12x without (small-code-msn, 1,024 cached
tokens), and the copy's cost grows with the rows and the context
(experiments/batch-scaling/tiny/sdpa-gqa-default.md).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "sdpa_gqa"


def sdpa_gqa_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0,
                               scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [b, H, q, d]; key, value [b, H_kv, L, d]; attention_mask additive or bool [b, 1, q, L] (or None: causal).
    Returns [b, q, H, d], as transformers' ``sdpa``."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups == 1 or attention_mask is None or attention_mask.shape[1] != 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)  # nothing to save, or a case transformers handles its own way
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    # query head h uses KV head h // groups (repeat_kv's order): rows (group member r, token i) of KV head h // groups
    packed = query.reshape(b, kv_heads, groups * q, d)
    mask = attention_mask.unsqueeze(2).expand(b, 1, groups, q, attention_mask.shape[-1]).reshape(b, 1, groups * q, -1)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)
    return out.reshape(b, heads, q, out.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_gqa_attention_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the same masks as "sdpa" when the model builds its own
