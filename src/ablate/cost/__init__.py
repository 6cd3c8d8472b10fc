"""What a run costs before it starts: parameters, FLOPs, tokens, time, and the per-rank memory peak of a step."""
