"""Hugging Face transformers and attnkit.

>>> import attnkit.integrations.hf                       # registers attn_implementation="attnkit"
>>> from transformers import AutoModelForCausalLM
>>> model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnkit")  # doctest: +SKIP

Every attention call of the model then runs through :func:`attnkit.attention` (``auto`` routing,
``ak.explain``, weights capture, the doctor), with transformers' masks arriving as ``ak.masks`` expressions.
An existing model switches with ``model.set_attn_implementation("attnkit")``.
"""

from __future__ import annotations

from attnkit.integrations.hf.attention import attention_forward, set_backend
from attnkit.integrations.hf.masks import HFMask, mask_interface

NAME = "attnkit"


def register(name: str = NAME) -> str:
    """Register attnkit with transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` under ``name``
    (idempotent; done on import). Returns the name to pass as ``attn_implementation``."""
    from attnkit.integrations.hf._deps import transformers

    tf = transformers()
    from transformers.masking_utils import AttentionMaskInterface

    tf.AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_interface)
    return name


register()

__all__ = ["NAME", "register", "set_backend", "attention_forward", "mask_interface", "HFMask"]
