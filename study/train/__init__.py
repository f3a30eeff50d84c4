"""One trial: settings, the training step, the trainer, objectives, metrics, efficiency figures, the result row."""
