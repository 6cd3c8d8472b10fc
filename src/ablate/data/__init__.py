"""Text to training batches: sources, tokenizers, the prepared token files, samplers and the batch schedule."""
