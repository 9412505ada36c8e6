"""`sensegraph serve`: the explorer page and the HTTP APIs over one index."""
from __future__ import annotations

import click

from .common import ROOT_OPTION, console, fail, settings_for


@click.command("serve")
@ROOT_OPTION
@click.option("--index", "index_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Serve this index folder instead of the project's output/ (settings still come from --root).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the index: set --api-key too.")
@click.option("--port", "-p", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--api-key", envvar="SENSEGRAPH_API_KEY", default=None,
              help="Require this key (header X-API-Key or Authorization: Bearer) on every API call; "
                   "also read from $SENSEGRAPH_API_KEY.")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="Allow browser pages from this origin to call the API (repeatable). Default: none.")
@click.option("--max-body", default=1_000_000, show_default=True, type=click.IntRange(1024),
              help="Largest request body accepted, in bytes.")
def serve_command(root: str, index_dir: str | None, host: str, port: int, api_key: str | None,
                  cors_origins: tuple[str, ...], max_body: int) -> None:
    """Browse the index in a web page and query it over HTTP.

    \b
    Opens http://127.0.0.1:8000/ : root-level communities as cards, drill down through
    sub-communities to entities and source text, a graph view, and a question box whose
    citations link to the cited records. Also serves:
      /api/...                 JSON: communities, reports, entities, relationships, text units, queries
      /v1/chat/completions     OpenAI-compatible (models sensegraph-global, sensegraph-local, ...)
      /docs                    the API reference
    \b
    Examples:
      sensegraph serve --root myproject
      sensegraph serve --root myproject --host 0.0.0.0 --api-key "$(openssl rand -hex 16)"
    """
    try:
        import uvicorn

        from ..server import create_app
    except ImportError as exc:
        fail(f"`sensegraph serve` needs the serve extra ({exc.name} is missing): pip install 'sensegraph[serve]'")
    from ..query import IndexNotFound

    settings = settings_for(root)
    folder = index_dir or settings.path(settings.output_dir)
    try:
        app = create_app(folder, settings, api_key=api_key, cors_origins=cors_origins, max_body_bytes=max_body)
    except IndexNotFound as exc:
        fail(str(exc))
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        console.print(f"[yellow]warning: listening on {host} without --api-key: anyone who can reach this "
                      "port can read the index and spend model calls[/]", highlight=False)
    console.print(f"sensegraph explorer on [bold]http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/[/] "
                  f"(index {folder}; API docs at /docs; Ctrl+C to stop)", highlight=False)
    uvicorn.run(app, host=host, port=port, log_level="warning")
