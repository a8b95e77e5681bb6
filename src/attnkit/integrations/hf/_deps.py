"""The one place that imports transformers, with a typed error naming the fix when it is missing."""

from __future__ import annotations

from attnkit.errors import EnvironmentUnsupportedError


def transformers():
    try:
        import transformers as tf
    except ImportError as exc:
        raise EnvironmentUnsupportedError(f"attnkit.integrations.hf needs the transformers package ({exc}); install "
                                          "it with pip install 'attnkit[hf]' (or pip install transformers).") from exc
    return tf
