"""The HTTP API and web explorer behind `sensegraph serve` (needs the `serve` extra:
fastapi, uvicorn). `create_app(index_folder, settings)` builds the app."""
from .app import create_app

__all__ = ["create_app"]
