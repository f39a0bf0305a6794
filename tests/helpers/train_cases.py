"""Shared pieces of the `ringzero train` tests."""

TINY = ["--nproc", "2", "--batch", "8", "--seq", "32", "--layers", "2", "--d-model", "64", "--heads", "2",
        "--no-progress", "--val-batches", "1"]
"""2 ranks, a 0.13M-parameter model and tiny batches: a run of a few steps takes seconds."""
