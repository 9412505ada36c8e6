"""Basic search: vector RAG over text units (the paper's SS baseline, "semantic search").

The source text units nearest to the question, nearest first, as many as fit the same token
budget as the other methods (the paper fills every condition's context to one limit; a fixed
top-k would hand SS less text), answered with the same prompt as local search, so the
comparison isolates what the graph adds. `query.top_text_units` > 0 caps the count.
"""
from __future__ import annotations

from .answer import Query, QueryResult, final_answer, no_answer, result
from .context import Context, pack
from .local_search import allowed_refs


async def basic_search(q: Query) -> QueryResult:
    vectors = await q.index.vectors("text_units", q.embedder, q.log)
    query_vector = (await q.embedder.embed([q.search_text()], kind="query", step="embed"))[0]
    cap = q.settings.query.top_text_units
    hits = vectors.search(query_vector, k=cap if cap > 0 else len(vectors.ids))
    rows = q.index.rows_by("text_units", "id", [i for i, _ in hits])
    context = Context([pack("Sources", (r for _, r in rows.iterrows()), q.budget)])
    if context.units:
        answer = await final_answer(q, q.render("query_answer", context=context.text()), step="answer")
    else:  # nothing matched (e.g. an index without entities): say so rather than ask about nothing
        answer = no_answer(q)
    stats = {"context_units": context.units, "context_tokens": context.tokens,
             "similarity": [round(score, 4) for _, score in hits[:context.units]]}
    return result(q, "basic", answer, context, stats=stats, allowed=allowed_refs(context))
