"""Evaluation (paper section 3): compare query conditions on your own corpus.

    questions  -> K personas x N tasks x M global questions (or load a CSV/JSONL file)
    answers    -> every question under each condition (C0..Cn, TS, SS, other projects)
    judge      -> pairwise LLM-as-judge on four criteria, repeated and counterbalanced
    claims     -> claim-based comprehensiveness and diversity (ROUGE-L clustering)
    report     -> Markdown report and PNG figures from the stored results

Everything is stored under `<root>/evaluation/<name>/` as JSONL; every step skips what is
already stored, so a rerun of a finished evaluation makes no LLM call.
"""
