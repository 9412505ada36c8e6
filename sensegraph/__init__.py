"""sensegraph: GraphRAG (Edge et al., 2024) on your own documents, offline by default."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Settings", "aindex", "index", "load_index", "load_settings"]


def __getattr__(name: str) -> Any:
    # Imported on first use so `sensegraph --help` and `import sensegraph.config` stay quick.
    if name in ("aindex", "index", "load_index"):
        from . import api

        return getattr(api, name)
    if name in ("Settings", "load_settings"):
        from . import config

        return getattr(config, name)
    raise AttributeError(name)
