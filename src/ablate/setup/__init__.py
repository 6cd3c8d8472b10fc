"""From an experiment file to checked runs: variants, overrides, the "auto" rules and the checks before compute."""
