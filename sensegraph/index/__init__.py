"""Indexing: one module per step of the paper, plus the pipeline that runs them in order."""
