"""Bridges from other libraries into attnkit (each imports its library lazily, on first use).

- :mod:`attnkit.integrations.hf`: Hugging Face transformers — attnkit as an attention implementation
  (``attn_implementation="attnkit"``) and converters between transformers models and attnkit models.
"""
