"""The mask kinds, by family: :mod:`.positional` (read token positions: causal, windows, chunks, strides, global
tokens, custom) and :mod:`.data` (carry tensors: padding, documents, dense). Each is a :class:`~attnkit.masks.spec.MaskSpec`
subclass; the public constructors are in :mod:`attnkit.masks`."""
