"""The `sensegraph` command. Thin: parses flags, calls the library, shows progress and results.

One module per command (or family of commands); common.py holds what they share. Nothing in
the library imports this package: library functions return data, and the printing is here.
"""
from __future__ import annotations

import click

from .common import BUDGET_EXIT, console, out
from .doctor import doctor_command
from .eval import eval_group
from .export import export_command
from .index import index_command, resolve_command, update_command
from .project import demo_command, init_command
from .prompt_tune import prompt_tune_command
from .query import query_command
from .serve import serve_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sensegraph")
def main() -> None:
    """sensegraph: GraphRAG on your own documents, offline by default.

    \b
    Typical use:
      sensegraph init --root myproject      # settings.yaml, .env, input/, prompts/
      cp *.txt myproject/input/
      sensegraph prompt-tune --root myproject  # optional: entity types and examples from your corpus
      sensegraph index --root myproject     # build the graph index
      sensegraph doctor --root myproject    # check the configured models
      sensegraph query "What are the main themes?" --root myproject

    Try `sensegraph demo` to index a small built-in corpus with the embedded model.
    """


for _command in (init_command, prompt_tune_command, doctor_command, index_command, update_command, resolve_command,
                 export_command, query_command, demo_command, serve_command, eval_group):
    main.add_command(_command)

__all__ = ["main", "BUDGET_EXIT", "console", "out"]
