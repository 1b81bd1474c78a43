"""Training the drafters that read the target's hidden states (``python -m specdec.train
{block,medusa} --target smollm2 --out DIR``): teacher-forced distillation on text the machine
already has (data.py), with the target's own next-token distributions as soft labels
(loop.py)."""

from __future__ import annotations

from .data import Split, chunks, split_files, stdlib_files
from .loop import TrainConfig, TrainResult, teacher_pass, train

__all__ = [
    "Split",
    "TrainConfig",
    "TrainResult",
    "chunks",
    "split_files",
    "stdlib_files",
    "teacher_pass",
    "train",
]
