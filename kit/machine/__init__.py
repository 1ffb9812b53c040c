"""The machine: what it has (probe, GPUs, torch build, platform) and what that allows (verdicts)."""
