"""Training the TransformerLM: data and packing, the loop, checkpoints and resume, torch.distributed.

>>> from attnkit.training import TrainConfig, train
>>> train(TrainConfig(run_dir="runs/tiny", steps=300))  # doctest: +SKIP
"""

from attnkit.runs.read import CheckpointError
from attnkit.training.data import ByteTokenizer, PackedDataset, load_documents, split_by_file
from attnkit.training.loop import TrainConfig, Trainer, TrainResult, load_model, train

__all__ = ["ByteTokenizer", "CheckpointError", "PackedDataset", "TrainConfig", "TrainResult", "Trainer", "load_documents",
           "load_model", "split_by_file", "train"]
