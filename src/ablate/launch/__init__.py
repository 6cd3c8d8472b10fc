"""Many runs: side by side on this machine, as a SLURM job array, or in rounds until a decision is made."""
