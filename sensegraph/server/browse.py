"""JSON endpoints for browsing the index: the community tree (roll-up and drill-down),
reports, entities (search, neighbourhood), relationships, claims and source text units."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from ..query import METHODS
from .security import require_key
from .state import state_of

router = APIRouter(prefix="/api", dependencies=[Depends(require_key)])


def _found(value: dict[str, Any] | None, what: str, ref: int) -> dict[str, Any]:
    if value is None:
        raise HTTPException(404, f"no {what} {ref} in this index")
    return value


@router.get("/info", tags=["browse"], summary="What the index holds and how it can be queried")
def info(request: Request) -> dict[str, Any]:
    st = state_of(request)
    out = st.explorer.info()
    default_level = st.settings.query.level if st.settings is not None else 2
    out.update({"methods": list(METHODS), "default_method": st.default_method,
                "default_level": min(default_level, out["levels"] - 1),
                "can_query": st.settings is not None or st.searcher is not None,
                "models": [m["id"] for m in chat_models(out["levels"])]})
    return out


def chat_models(levels: int) -> list[dict[str, Any]]:
    """The model names of /v1/chat/completions: one per method, and global search per level."""
    names = [f"sensegraph-{m}" for m in METHODS]
    names += [f"sensegraph-global-c{level}" for level in range(levels)] + ["sensegraph-global-dynamic"]
    return [{"id": n, "object": "model", "created": 0, "owned_by": "sensegraph"} for n in names]


@router.get("/communities", tags=["browse"], summary="The community tree")
def communities(request: Request, level: int | None = Query(None, ge=0, description="only this level")) -> dict[str, Any]:
    """Every community (or those of one level) with title, rating, summary, parent and children;
    `roots` lists the root-level communities, most important first. In a lazy index (`/api/info`
    `method`) communities have no report: their title names their most frequent concepts, and
    `top_concepts` lists those with type and frequency."""
    return state_of(request).explorer.tree(level)


@router.get("/communities/{community}", tags=["browse"], summary="One community with its report")
def community(request: Request, community: int,
              limit: int = Query(500, ge=1, le=5000, description="at most this many of each list")) -> dict[str, Any]:
    """The report, the breadcrumbs from the root, the sub-communities, and the member entities,
    relationships and source text units (best connected first)."""
    return _found(state_of(request).explorer.community(community, limit), "community", community)


@router.get("/communities/{community}/graph", tags=["browse"], summary="A community as a network")
def community_graph(request: Request, community: int,
                    max_nodes: int = Query(500, ge=1, le=5000, description="keep the best connected")) -> dict[str, Any]:
    """Member entities as nodes (with degree and the sub-community each belongs to, for colour)
    and the relationships among them as edges."""
    return _found(state_of(request).explorer.community_graph(community, max_nodes), "community", community)


@router.get("/reports/{community}", tags=["browse"], summary="A community report (as cited: Reports (n))")
def report(request: Request, community: int) -> dict[str, Any]:
    return _found(state_of(request).explorer.report(community), "report of community", community)


@router.get("/entities", tags=["browse"], summary="Search entities by name")
def search_entities(request: Request, q: str = Query(..., min_length=1, max_length=200),
                    limit: int = Query(20, ge=1, le=200)) -> dict[str, Any]:
    """Exact matches first, then prefix, word prefix and substring matches (names and aliases,
    case-insensitive); the better connected entity first among equals."""
    return {"query": q, "entities": state_of(request).explorer.search_entities(q, limit)}


@router.get("/entities/{ref}", tags=["browse"], summary="An entity (as cited: Entities (n))")
def entity(request: Request, ref: int) -> dict[str, Any]:
    """The entity, its communities at every level, relationships, claims and source text units."""
    return _found(state_of(request).explorer.entity(ref), "entity", ref)


@router.get("/entities/{ref}/neighbourhood", tags=["browse"], summary="An entity's neighbourhood as a network")
def neighbourhood(request: Request, ref: int, depth: int = Query(1, ge=1, le=3),
                  max_nodes: int = Query(200, ge=1, le=5000)) -> dict[str, Any]:
    return _found(state_of(request).explorer.neighbourhood(ref, depth, max_nodes), "entity", ref)


@router.get("/relationships/{ref}", tags=["browse"], summary="A relationship (as cited: Relationships (n))")
def relationship(request: Request, ref: int) -> dict[str, Any]:
    return _found(state_of(request).explorer.relationship(ref), "relationship", ref)


@router.get("/claims/{ref}", tags=["browse"], summary="A claim (as cited: Claims (n))")
def claim(request: Request, ref: int) -> dict[str, Any]:
    return _found(state_of(request).explorer.claim(ref), "claim", ref)


@router.get("/text_units/{ref}", tags=["browse"], summary="A source text unit (as cited: Sources (n))")
def text_unit(request: Request, ref: int) -> dict[str, Any]:
    return _found(state_of(request).explorer.text_unit(ref), "text unit", ref)
