"""`sensegraph update` against the mock server: an updated index equals a fresh index of the same
final corpus (entities, relationships, their text units, claims, community membership), only new
text units are extracted, unchanged communities keep their id, number and report, and a deleted
document leaves nothing behind that a query could cite."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from mock_llm import start_mock_server
from test_pipeline import DOCS, index, read_all, schema_name, settings_for, stats_json, write_docs
from sensegraph.cli import main as cli_main
from sensegraph.index.update import UpdateError, run_update, stable_numbers

# A fourth document sharing a few names with the others, and a changed version of one of them.
EXTRA = {
    "market.txt": (
        "The Ellison Fish Market opened a second hall in 2021. Its manager, Petra Lund, buys most of "
        "the morning catch from the Harbor Cooperative and sells ice to the Maren Fisheries School. "
        "Petra Lund also chairs the Port Ellison Traders Guild, which asked the Coastal Development Bank "
        "for a loan to build a smoke house on Pier Two."
    ),
}
# A document about something else entirely: it must leave the other communities alone.
UNRELATED = {
    "quarry.txt": (
        "The Vell Quarry near Stonebridge was opened in 1887 by Oskar Brandvik. The Stonebridge Mining "
        "Union organised its workers in 1921, and Greta Brandvik, his granddaughter, closed the quarry "
        "in 1969 and gave the land to the Stonebridge Nature Trust."
    ),
}
COUNCIL_V2 = DOCS["council.txt"] + (
    " In 2022 Elena Voss stepped down and the Island Council of Maren elected Arne Holm, a ferry "
    "captain of the Halden Ferry Line, as its new chair.")


@pytest.fixture
def server():
    with start_mock_server() as s:
        yield s


def write_settings_yaml(root: Path, server) -> None:
    """settings.yaml pointing at the mock, for tests that go through the CLI (which reads it)."""
    ep = f"  provider: openai\n  model: mock\n  base_url: {server.base_url}\n  api_key: x\n  retry_base_seconds: 0.01\n"
    (root / "settings.yaml").write_text("chat:\n" + ep + "embedding:\n" + ep +
                                        "chunks:\n  size: 120\n  overlap: 20\n", encoding="utf-8")


def update(settings, **kwargs: Any):
    return asyncio.run(run_update(settings, log=lambda m: None, **kwargs))


def _sorted(v: Any) -> Any:
    return sorted(v) if isinstance(v, list) else v


def content(output: Path) -> dict[str, Any]:
    """What must not depend on the history of updates: every table keyed by content ids, without
    human-readable numbers (those stay stable across updates, so they differ from a fresh run)."""
    t = read_all(output)
    ents = {r["id"]: {k: _sorted(v) for k, v in r.items() if k != "human_readable_id"}
            for r in t["entities"].to_dict("records")}
    rels = {r["id"]: {k: _sorted(v) for k, v in r.items() if k != "human_readable_id"}
            for r in t["relationships"].to_dict("records")}
    claims = {r["id"]: {k: v for k, v in r.items() if k != "human_readable_id"}
              for r in t["covariates"].to_dict("records")}
    units = {r["id"]: (r["document_id"], r["text"], sorted(r["entity_ids"]), sorted(r["relationship_ids"]),
                       sorted(r["covariate_ids"])) for r in t["text_units"].to_dict("records")}
    docs = {r["id"]: (r["title"], sorted(r["text_unit_ids"])) for r in t["documents"].to_dict("records")}
    comms = t["communities"]
    members = {int(n): frozenset(e) for n, e in zip(comms["community"], comms["entity_ids"])}
    tree = {(int(r["level"]), members[int(r["community"])],
             members.get(int(r["parent"])), frozenset(members[int(c)] for c in r["children"]),
             frozenset(r["relationship_ids"]), bool(r["carried"]))
            for r in comms.to_dict("records")}
    return {"entities": ents, "relationships": rels, "claims": claims, "text_units": units, "documents": docs,
            "communities": tree}


def assert_same_index(updated: Path, fresh: Path) -> None:
    a, b = content(updated), content(fresh)
    for key in a:
        assert a[key] == b[key], f"{key} differ between the updated and the fresh index"


def test_a_sequence_of_updates_equals_a_fresh_index(tmp_path, server):
    live, fresh = tmp_path / "live", tmp_path / "fresh"
    sections = {"extraction": {"claims": True}}  # covariates too
    write_docs(live, {k: DOCS[k] for k in ("harbor.txt", "council.txt")})
    settings = settings_for(live, server, **sections)
    index(settings)

    # 1. a new document
    write_docs(live, {"observatory.txt": DOCS["observatory.txt"]})
    r1 = update(settings)
    d = r1.stats["update"]["documents"]
    assert d["new"] == ["observatory.txt"] and d["changed"] == [] and d["deleted"] == []
    # 2. a changed document, a deleted one and a new one at once
    write_docs(live, {"council.txt": COUNCIL_V2, **EXTRA})
    (live / "input" / "harbor.txt").unlink()
    r2 = update(settings)
    d = r2.stats["update"]["documents"]
    assert (d["new"], d["changed"], d["deleted"]) == (["market.txt"], ["council.txt"], ["harbor.txt"])

    final = {"council.txt": COUNCIL_V2, "observatory.txt": DOCS["observatory.txt"], **EXTRA}
    write_docs(fresh, final)
    index(settings_for(fresh, server, **sections))
    assert_same_index(live / "output", fresh / "output")

    # the updated index keeps the table invariants of a fresh one
    t = read_all(live / "output")
    all_ids = sorted(t["entities"]["id"])
    for level, group in t["communities"].groupby("level"):
        assert sorted(e for ids in group["entity_ids"] for e in ids) == all_ids, level
    assert sorted(t["community_reports"]["community"]) == sorted(t["communities"]["community"])
    for name in ("entities", "relationships", "text_units", "covariates", "communities"):
        assert t[name]["human_readable_id"].is_unique, name
    # the stored instances are those of the surviving text units only
    inst = pd.read_parquet(live / "output" / "_work" / "entity_instances.parquet")
    assert set(inst["text_unit_id"]) <= set(t["text_units"]["id"])


def test_only_new_text_units_are_extracted_and_unchanged_work_is_reused(tmp_path, server):
    write_docs(tmp_path, DOCS)
    settings = settings_for(tmp_path, server)
    index(settings)
    before = read_all(tmp_path / "output")

    # nothing changed: no request at all, nothing renumbered
    n0 = server.stats["requests"]
    update(settings)
    assert server.stats["requests"] == n0

    extract_bodies: list[dict] = []
    real = server._respond

    async def spy(method, path, raw, reader, writer):
        body = json.loads(raw or b"{}")
        if schema_name(body) == "ExtractedGraph":
            extract_bodies.append(body)
        return await real(method, path, raw, reader, writer)

    server._respond = spy  # type: ignore[method-assign]
    write_docs(tmp_path, UNRELATED)
    result = update(settings)
    after = read_all(tmp_path / "output")
    new_units = set(after["text_units"]["id"]) - set(before["text_units"]["id"])
    assert new_units and set(before["text_units"]["id"]) <= set(after["text_units"]["id"])
    # one first-round extraction request per new unit, none for the old ones
    assert len(extract_bodies) == len(new_units)
    assert all("Brandvik" in b["messages"][-1]["content"] for b in extract_bodies)
    u = result.stats["update"]
    assert u["text_units"]["extracted"] == len(new_units) and u["text_units"]["kept"] == len(before["text_units"])

    # human-readable ids of what existed are unchanged; new rows come after them
    for name, key in (("entities", "id"), ("relationships", "id"), ("text_units", "id")):
        old = dict(zip(before[name][key], before[name]["human_readable_id"]))
        new = dict(zip(after[name][key], after[name]["human_readable_id"]))
        assert all(new[k] == v for k, v in old.items() if k in new), name
        assert min((v for k, v in new.items() if k not in old), default=10**9) > max(old.values()), name

    # communities with unchanged membership keep their number; their report is regenerated only
    # when a member's description, an internal relationship or a sub-report changed
    old_c = {r["id"]: r for r in before["communities"].to_dict("records")}
    new_c = {r["id"]: r for r in after["communities"].to_dict("records")}
    kept = set(old_c) & set(new_c)
    assert kept, "no community kept its membership"
    assert all(old_c[i]["community"] == new_c[i]["community"] for i in kept)
    old_r = dict(zip(before["community_reports"]["community"], before["community_reports"]["full_content_json"]))
    new_r = dict(zip(after["community_reports"]["community"], after["community_reports"]["full_content_json"]))
    old_e = dict(zip(before["entities"]["id"], before["entities"]["description"]))
    new_e = dict(zip(after["entities"]["id"], after["entities"]["description"]))
    old_deg = dict(zip(before["entities"]["id"], before["entities"]["degree"]))
    new_deg = dict(zip(after["entities"]["id"], after["entities"]["degree"]))

    def untouched(i: str) -> bool:
        c = new_c[i]
        return (all(old_e.get(e) == new_e[e] and old_deg.get(e) == new_deg[e] for e in c["entity_ids"])
                and sorted(old_c[i]["relationship_ids"]) == sorted(c["relationship_ids"])
                and all(untouched(ch) for ch in (next(k for k, r in new_c.items() if r["community"] == n)
                                                 for n in c["children"]) if ch in kept))
    same = [i for i in kept if untouched(i) and not new_c[i]["children"]]
    assert same, "the new document touched every community; the test needs an untouched one"
    for i in same:
        n = new_c[i]["community"]
        assert new_r[n] == old_r[n]
    reports = u["community_reports"]
    # what the model was asked again; reports written from their rows changed at no call
    assert reports["regenerated"] == result.stats["steps"]["community_reports"]["calls"]
    assert reports["regenerated"] + reports["rewritten_from_rows"] + reports["reused"] == reports["written"]
    assert reports["regenerated"] < reports["written"]
    assert sum(reports["reasons"].values()) == reports["regenerated"]


def test_deleting_a_document_removes_what_only_it_supported(tmp_path, server):
    write_docs(tmp_path, DOCS)
    write_settings_yaml(tmp_path, server)
    settings = settings_for(tmp_path, server)
    index(settings)
    before = read_all(tmp_path / "output")
    doc_id = before["documents"].set_index("title").loc["council.txt", "id"]
    gone_units = set(before["text_units"][before["text_units"]["document_id"] == doc_id]["id"])

    res = CliRunner().invoke(cli_main, ["update", "--root", str(tmp_path), "--remove", "council.txt"])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "input" / "council.txt").exists()
    assert (tmp_path / "output" / "_work" / "removed" / "council.txt").exists()  # moved, not destroyed
    after = read_all(tmp_path / "output")
    stats = stats_json(tmp_path)["update"]
    assert stats["documents"]["deleted"] == ["council.txt"]
    assert stats["documents"]["removed_by_option"] == ["council.txt"]
    assert stats["llm"]["extract"]["calls"] == 0
    assert not gone_units & set(after["text_units"]["id"])
    for name in ("entities", "relationships"):
        for tus in after[name]["text_unit_ids"]:
            assert tus and not set(tus) & gone_units
    titles = set(after["entities"]["title"])
    assert {"Elena Voss", "Tomas Brandt"} <= set(before["entities"]["title"])
    assert not {"Elena Voss", "Tomas Brandt"} & titles
    assert stats["entities"]["removed"] > 0 and "Elena Voss" in stats["entities"]["removed_sample"]
    # an entity also named in other documents stays, supported by their text units only
    old_units = dict(zip(before["entities"]["id"], before["entities"]["text_unit_ids"]))
    new_units = dict(zip(after["entities"]["id"], after["entities"]["text_unit_ids"]))
    shared = [e for e, tus in old_units.items() if set(tus) & gone_units and set(tus) - gone_units]
    assert shared
    for e in shared:
        assert sorted(new_units[e]) == sorted(set(old_units[e]) - gone_units)
    for e, tus in old_units.items():
        assert (e in new_units) == bool(set(tus) - gone_units)

    # queries can no longer reach (or cite) the deleted text
    import sensegraph

    for method, q in (("basic", "Who ran the inquiry into the winter ferry sailings?"),
                      ("local", "What did Elena Voss and Tomas Brandt agree?")):
        r = sensegraph.search(q, method, root=settings)
        assert "Ingrid Sol" not in r.context_text and "Tomas Brandt" not in r.context_text, method
        for rec in r.cited.get("Sources", []):
            assert rec.get("id") not in gone_units


def test_update_needs_an_index_and_an_existing_file(tmp_path, server):
    write_docs(tmp_path, {"harbor.txt": DOCS["harbor.txt"]})
    settings = settings_for(tmp_path, server)
    with pytest.raises(UpdateError, match="sensegraph index"):
        update(settings)
    index(settings)
    with pytest.raises(UpdateError, match="not a file"):
        update(settings, remove=["nope.txt"])


def test_stable_numbers_never_reuse_a_number():
    assert stable_numbers(["a", "c", "d"], {"a": 0, "b": 1, "c": 2}) == [0, 2, 3]
    assert stable_numbers(["x"], {}, floor=7) == [8]
    assert stable_numbers([], {"a": 4}) == []


def test_a_component_the_change_does_not_reach_keeps_its_communities():
    """Components are clustered one by one, so growing one leaves the others' partition alone
    (clustering the whole graph at once lets any change reshuffle everything)."""
    import random

    from sensegraph.index.communities import build_communities

    def graph(extra: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        rng = random.Random(3)
        names = [f"A{i}" for i in range(40)] + [f"B{i}" for i in range(30 + extra)]
        edges = {(f"A{rng.randrange(40)}", f"A{rng.randrange(40)}") for _ in range(160)}
        rng2 = random.Random(4)
        edges |= {(f"B{rng2.randrange(30 + extra)}", f"B{rng2.randrange(30 + extra)}") for _ in range(120 + 4 * extra)}
        edges = sorted((s, t) for s, t in edges if s != t)
        ents = pd.DataFrame({"id": names, "human_readable_id": range(len(names)), "title": names,
                             "text_unit_ids": [[n] for n in names]})
        rels = pd.DataFrame({"id": [f"{s}-{t}" for s, t in edges], "human_readable_id": range(len(edges)),
                             "source": [s for s, _ in edges], "target": [t for _, t in edges],
                             "weight": [1.0] * len(edges)})
        return ents, rels

    def a_side(comms: pd.DataFrame) -> set:
        return {(lv, frozenset(m)) for lv, m in zip(comms["level"], comms["entity_ids"])
                if all(str(x).startswith("A") for x in m)}

    before = build_communities(*graph(0), max_cluster_size=10, seed=7)
    after = build_communities(*graph(8), max_cluster_size=10, seed=7)
    assert a_side(before) and a_side(before) == a_side(after)
