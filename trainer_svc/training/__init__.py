"""Training a model: the optimizer step, its settings, and what a run leaves behind.

`trainer.py` (Trainer and TrainConfig: one optimizer step on the GPU model), `precision.py`
(what "auto" runs on a device), `schedule.py` (the learning rate), `checkpoint.py` (save,
verify, resume), `export_hf.py` (a checkpoint as a Hugging Face folder), `tensorboard_log.py`
(a run's scalars).
"""
