"""Models built from attnkit modules: the TransformerLM, its presets, and generation."""
