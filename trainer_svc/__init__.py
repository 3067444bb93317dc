"""Training: model, kernels orchestration, checkpoints, Redis daemon."""
