"""Servers that do not obey the JSON schema's `maxItems` (JSON mode, many Ollama/vLLM setups).

A list longer than its limit is cut to its first items, as a server with constrained decoding
would have ended it, and counted in usage as `truncated`; it is never a failed call. Two kinds of
server: one that takes `response_format: json_schema` but ignores maxItems, and one without
JSON-schema support at all (400, so the client falls back to JSON mode + repair).
"""
from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest

import mock_llm
from mock_llm import MockServer
from scripted import last_user, schema_name
from sensegraph.query.drift_search import drift_search
from sensegraph.query.global_search import global_search
from test_pipeline import DOCS, index, settings_for, snapshot, stats_json, write_docs
from test_query import make_query, run

SERVERS = ["ignores_max_items", "no_json_schema"]


def asked(body: dict[str, Any]) -> str:
    """What a request asks for: the schema's name, or in JSON mode the shape of the schema in
    the prompt ("map", "drift"); "text" for a plain request."""
    name = schema_name(body)
    if name == "MapAnswer":
        return "map"
    if name in ("Primer", "Intermediate"):
        return "drift"
    system = body["messages"][0]["content"]
    if "JSON schema:\n" in system:
        properties = json.loads(system.rsplit("JSON schema:\n", 1)[1]).get("properties", {})
        return "map" if "points" in properties else "drift" if "follow_ups" in properties else "other"
    return "text"


def refusing_json_schema(responder):
    """A server without JSON-schema support: 400 to `response_format: json_schema`."""
    def respond(body: dict[str, Any]):
        if (body.get("response_format") or {}).get("type") == "json_schema":
            return httpx.Response(400, json={"error": {"message": "response_format json_schema is not supported",
                                                       "type": "invalid_request_error"}})
        return responder(body)
    return respond


def disobedient(server: str, responder):
    return refusing_json_schema(responder) if server == "no_json_schema" else responder


# -- global search: 6 points of 11 ids each (MapAnswer allows 5 points, Point 10 ids) ----------------
@pytest.mark.parametrize("server", SERVERS)
def test_global_map_answers_with_too_many_points_and_ids_keep_the_first(tmp_path, server):
    def respond(body):
        if asked(body) == "map":
            return {"points": [{"description": f"POINT-{n} of the data", "ids": list(range(11)), "score": 90 - n}
                               for n in range(1, 7)]}
        return "The answer [Data: Reports (1)]."

    q, llm = make_query(tmp_path, disobedient(server, respond), context_tokens=4000)
    result = run(global_search(q, level=0))
    assert result.failures == [] and q.llm.usage.step("map").failures == []
    maps = result.stats["map_calls"]
    assert maps >= 1 and result.stats["points"] == 5 * maps  # the first 5 points of every answer
    # Every answer had one list of points and five kept lists of ids cut.
    assert q.llm.usage.step("map").truncated == 6 * maps
    reduce = [b for b in llm.requests if asked(b) == "text"]
    assert len(reduce) == 1
    context = last_user(reduce[0])
    assert all(f"POINT-{n} " in context for n in range(1, 6)) and "POINT-6" not in context
    assert result.answer.startswith("The answer")
    if server == "no_json_schema":
        kinds = [(b.get("response_format") or {}).get("type") for b in llm.requests]
        assert kinds[0] == "json_schema" and "json_object" in kinds


# -- DRIFT: a primer and follow-ups with 6 follow-up questions (at most 5) --------------------------
@pytest.mark.parametrize("server", SERVERS)
def test_drift_primer_with_too_many_follow_ups_keeps_the_first_five(tmp_path, server):
    followed: list[str] = []

    def respond(body):
        if asked(body) == "drift":
            text = last_user(body)
            if "Follow-up question:" not in text:  # the primer
                # The sixth scores highest: were it kept, it would be asked first.
                return {"answer": "Primer [Data: Reports (0)]", "score": 40,
                        "follow_ups": [{"question": f"Q{n}", "score": 10 * n} for n in range(1, 6)]
                        + [{"question": "Q6-dropped", "score": 99}]}
            question = text.rsplit("Follow-up question:", 1)[1].strip()
            followed.append(question)
            return {"answer": f"About {question}", "score": 70,
                    "follow_ups": [{"question": f"{question}-next{n}", "score": 5} for n in range(6)]}
        if asked(body) == "text" and "Key point" not in last_user(body):
            return "A hypothetical report about the harbor."
        return "Final [Data: Reports (0)]"

    q, _ = make_query(tmp_path, disobedient(server, respond), drift_breadth=2, drift_depth=1)
    result = run(drift_search(q))
    assert result.failures == []
    assert q.llm.usage.step("drift_primer").failures == [] and q.llm.usage.step("drift_followup").failures == []
    assert sorted(followed) == ["Q4", "Q5"]  # the best two of the first five; Q6 never reached the plan
    assert q.llm.usage.step("drift_primer").truncated == 1
    assert q.llm.usage.step("drift_followup").truncated == 2
    assert result.stats["follow_ups_answered"] == 2 and result.answer.startswith("Final")


# -- an index: extraction answers with more entities and relationships than maxItems -----------------
OVERFLOW = 3  # items beyond maxItems the disobedient server adds to every full list


def _overflow_items(value: Any, schema: Any) -> None:
    """Add items past maxItems to every list the obeying answer filled up to its limit, in place:
    what a server without constrained decoding sends when the model keeps listing."""
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        for key, v in value.items():
            _overflow_items(v, (schema.get("properties") or {}).get(key))
    elif isinstance(value, list):
        for v in value:
            _overflow_items(v, schema.get("items"))
        limit = schema.get("maxItems")
        if value and limit is not None and len(value) == limit:
            for n in range(OVERFLOW):
                extra = copy.deepcopy(value[-1])
                if isinstance(extra, dict):
                    extra = {k: f"Overflow {k} {n}" if isinstance(v, str) and k != "type" else v
                             for k, v in extra.items()}
                value.append(extra)


def ignoring_max_items(monkeypatch) -> list[int]:
    """Make the mock server answer like one without constrained decoding: the answer an obeying
    server gives, followed by extra items past every maxItems. Returns a list that counts the
    answers that were made too long."""
    real = mock_llm._chat_answer
    overlong: list[int] = []

    def answer(body, digest, fault):
        content, finish = real(body, digest, fault)
        rf = body.get("response_format") or {}
        schema = (rf.get("json_schema") or {}).get("schema") or mock_llm._hint_schema(body)
        if schema is None or fault != "ok":
            return content, finish
        data = json.loads(content)
        longer = json.dumps(data, ensure_ascii=False)
        _overflow_items(data, schema)
        if json.dumps(data, ensure_ascii=False) != longer:
            overlong.append(1)
        return json.dumps(data, ensure_ascii=False), finish

    monkeypatch.setattr(mock_llm, "_chat_answer", answer)
    return overlong


@pytest.mark.parametrize("server", SERVERS)
def test_index_against_a_server_ignoring_max_items_equals_an_obeying_one(tmp_path, monkeypatch, server):
    reject = ("json_schema",) if server == "no_json_schema" else ()
    limits = {"extraction": {"max_entities": 2, "max_relationships": 2}}

    obeying = tmp_path / "obeying"
    write_docs(obeying, DOCS)
    with MockServer(reject_formats=reject).start() as srv:
        assert index(settings_for(obeying, srv, **limits)).failures == {}

    overlong = ignoring_max_items(monkeypatch)
    disobeyed = tmp_path / "disobeyed"
    write_docs(disobeyed, DOCS)
    with MockServer(reject_formats=reject).start() as srv:
        result = index(settings_for(disobeyed, srv, **limits))
    assert overlong, "the server never sent a list longer than maxItems"
    assert result.failures == {} and result.stats["partial"] is False
    # The first maxItems items are the answer an obeying server gives: the same index.
    assert snapshot(disobeyed / "output") == snapshot(obeying / "output")
    extract = stats_json(disobeyed)["llm"]["extract"]
    assert extract["failures"] == [] and extract["truncated"] >= len(overlong)
