"""sensegraph: GraphRAG (Edge et al., 2024) on your own documents, offline by default."""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
_API = ("aindex", "index", "load_index", "search", "asearch", "global_search", "aglobal_search", "local_search",
        "alocal_search", "drift_search", "adrift_search", "basic_search", "abasic_search", "text_search",
        "atext_search", "lazy_search", "alazy_search")
__all__ = ["Settings", "load_settings", *_API]


def __getattr__(name: str) -> Any:
    # Imported on first use so `sensegraph --help` and `import sensegraph.config` stay quick.
    if name in _API:
        from . import api

        return getattr(api, name)
    if name in ("Settings", "load_settings"):
        from . import config

        return getattr(config, name)
    raise AttributeError(name)
