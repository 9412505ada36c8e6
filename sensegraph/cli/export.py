"""`sensegraph export`: the entity graph for other tools (Gephi, yEd, networkx, Neo4j)."""
from __future__ import annotations

from pathlib import Path

import click

from .common import ROOT_OPTION, fail, out, settings_for


@click.command("export")
@ROOT_OPTION
@click.option("--format", "fmt", type=click.Choice(["graphml", "gexf", "neo4j", "cypher"]), default="graphml",
              show_default=True, help="graphml/gexf: Gephi, yEd, networkx; neo4j: CSV files for "
                                      "neo4j-admin database import; cypher: one .cypher script.")
@click.option("--index", "index_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Export this index folder instead of the project's output/.")
@click.option("--out", "-o", "dest", type=click.Path(), default=None,
              help="File (graphml, gexf, cypher) or folder (neo4j). Default: output/export/.")
def export_command(root: str, fmt: str, index_dir: str | None, dest: str | None) -> None:
    """Write the entity graph for other tools, with community levels as attributes.

    \b
    sensegraph export --format graphml        # output/export/graph.graphml (Gephi, yEd)
    sensegraph export --format gexf           # output/export/graph.gexf
    sensegraph export --format neo4j          # output/export/neo4j/*.csv + import.sh
    sensegraph export --format cypher         # output/export/graph.cypher (cypher-shell < file)
    """
    from ..export import export_index

    settings = settings_for(root)
    folder = Path(index_dir) if index_dir else settings.path(settings.output_dir)
    try:
        written = export_index(folder, fmt, Path(dest) if dest else None)
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    for p in written:
        out.print(str(p))
