"""Training the TransformerLM: data and packing, the loop, checkpoints and resume, torch.distributed.

>>> from attnkit.training import TrainConfig, train
>>> train(TrainConfig(run_dir="runs/tiny", steps=300))  # doctest: +SKIP
"""

from attnkit.runs.read import CheckpointError, load_model
from attnkit.runs.tokens import ByteTokenizer
from attnkit.training.config import TrainConfig
from attnkit.training.data import PackedDataset, load_documents, split_by_file
from attnkit.training.loop import Trainer, TrainResult, train
from attnkit.training.steps import TrainingDiverged, lm_loss, param_groups, verdict

__all__ = ["ByteTokenizer", "CheckpointError", "PackedDataset", "TrainConfig", "TrainResult", "Trainer",
           "TrainingDiverged", "load_documents", "load_model", "lm_loss", "param_groups", "split_by_file", "train",
           "verdict"]
