"""A run's life: its folder, the trainer and its step, parallelism, checkpoints and the callbacks around the loop."""
