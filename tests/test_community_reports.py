"""Paper step 2.5: community reports, bottom-up, higher levels composed from sub-reports."""
from __future__ import annotations

import asyncio
import csv
import json
import re
from types import SimpleNamespace

import httpx
import pandas as pd
import pytest
from scripted import ScriptedLLM, schema_name
from test_communities import make_graph

from sensegraph.config import ReportSettings, Settings
from sensegraph.index import community_reports, report_checks
from sensegraph.index.communities import build_communities
from sensegraph.index.community_reports import COLUMNS, SINGLE_ENTITY_EXPLANATION, write_reports
from sensegraph.tokens import count_tokens

LOREM = ("The record notes meetings, letters and shared projects over several years, with details "
         "of places, dates and the people who took part in each of them.")


def graph(long: bool = True):
    entities, relationships = make_graph()
    if long:  # descriptions long enough that a leaf overflows a small budget
        entities["description"] = entities["title"] + " is a thing. " + LOREM
        relationships["description"] = relationships["source"] + " works with " + relationships["target"] + ". " + LOREM
    return entities, relationships


def section(prompt: str, header: str) -> list[list[str]]:
    """Rows of one CSV-like table of the context (header row skipped)."""
    marker = f"-----{header}-----\n"
    if marker not in prompt:
        return []
    body = prompt.split(marker, 1)[1].split("\n\n", 1)[0]
    return list(csv.reader(body.splitlines()))[1:]


def entities_in(prompt: str) -> set[str]:
    return {row[1] for row in section(prompt, "Entities")}


def llm_written(reports: pd.DataFrame) -> pd.DataFrame:
    """Reports an LLM wrote: not carried copies, not single-entity or small ones written from rows."""
    single = reports["rating_explanation"].isin([SINGLE_ENTITY_EXPLANATION["en"],
                                                 community_reports.ELEMENTARY_EXPLANATION["en"]])
    return reports[~reports["carried"] & ~single]


class Reporter:
    """Answers each report request with a report titled by its request number; fails (HTTP 500,
    after the client's retries) every request whose context holds exactly the `fail` entities."""

    def __init__(self, fail: set[str] | None = None):
        self.fail = fail
        self.llm = ScriptedLLM(self.respond)
        self.prompts: list[str] = []

    def respond(self, body):
        assert schema_name(body) == "Report"
        prompt = "\n".join(m["content"] for m in body["messages"])
        if self.fail is not None and entities_in(prompt) == self.fail:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        self.prompts.append(prompt)
        n = len(self.prompts) - 1
        return {"title": f"T{n}", "summary": f"Summary {n}.", "rating": float(n % 11) + 0.5,
                "rating_explanation": "Because.",
                "findings": [{"summary": f"F{n}.{i}", "explanation": f"E{n}.{i} {first_citation(prompt)}"}
                             for i in range(6)]}


def first_citation(prompt: str) -> str:
    """A citation of a record of the context (the checks drop findings that cite nothing in it)."""
    rows = section(prompt, "Entities")
    if rows:
        return f"[Data: Entities ({rows[0][0]})]"
    report = re.search(r"## Report (\d+):", prompt)
    return f"[Data: Reports ({report.group(1)})]"


def run(comms, entities, relationships, reporter: Reporter, *, budget: int, covariates=None,
        language: str = "en", advance=None, cache=None, counts=None, elementary_roots: bool = True):
    settings = Settings(reports=ReportSettings(max_input_tokens=budget, max_tokens=800,
                                               elementary_roots=elementary_roots))

    async def go():
        llm = reporter.llm.client(cache=cache)
        try:
            return await write_reports(comms, entities, relationships, covariates, llm, settings=settings,
                                       language=language, advance=advance, counts=counts)
        finally:
            await llm.aclose()

    return asyncio.run(go())


def prompt_of(reporter: Reporter, row) -> str:
    return reporter.prompts[int(row["title"][1:])]


@pytest.fixture(scope="module")
def small_budget():
    entities, relationships = graph()
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    reporter = Reporter()
    ticks: list[int] = []
    reports, failed = run(comms, entities, relationships, reporter, budget=500, advance=ticks.append)
    return entities, relationships, comms, reporter, reports, failed, ticks


def test_every_community_gets_a_report(small_budget):
    entities, relationships, comms, reporter, reports, failed, ticks = small_budget
    assert failed == []
    assert list(reports.columns) == COLUMNS
    assert sorted(reports["community"]) == sorted(comms["community"])
    assert sum(ticks) == len(comms)
    merged = reports.merge(comms, on="community", suffixes=("", "_c"))
    assert (merged["level"] == merged["level_c"]).all()
    assert (merged["parent"] == merged["parent_c"]).all()
    assert (merged["size"] == merged["size_c"]).all()
    assert reports["id"].is_unique and (reports["human_readable_id"] == reports["community"]).all()
    row = reports.iloc[0]
    content = json.loads(row["full_content_json"])
    assert set(content) == {"title", "summary", "rating", "rating_explanation", "findings"}
    assert row["full_content"].startswith(f"# {row['title']}\n\n{row['summary']}\n\n## ")
    assert row["rank"] == content["rating"] and 0 <= row["rank"] <= 10
    assert [set(f) for f in row["findings"]] == [{"summary", "explanation"}] * 6
    assert (reports["context_tokens"] <= 500).all()


def test_composed_report_is_requested_after_its_sub_reports(small_budget):
    _, _, comms, reporter, reports, _, _ = small_budget
    order = llm_written(reports).assign(order=lambda d: d["title"].str[1:].astype(int)).set_index("community")["order"]
    composed = reports[reports["used_sub_reports"]]
    assert len(composed) > 0
    for _, row in composed.iterrows():
        kids = [k for k in row["children"] if k in order.index]
        assert kids and all(order[k] < order[row["community"]] for k in kids)


class GatedLLM:
    """Stands in for the chat client: holds every request of `held_level` until a request from
    a shallower level has arrived. A level-by-level scheduler would never get there."""

    def __init__(self, level_of: dict[str, int], held_level: int):
        self.level_of, self.held = level_of, held_level
        self.opened = asyncio.Event()
        # Servers that take 25 requests at once: the window of communities in progress
        # (windows.window_of, 100) holds every held request and the shallower one after them.
        self.endpoints = SimpleNamespace(all=[SimpleNamespace(concurrency=25)])
        self.started: list[int] = []

    async def structured(self, messages, schema, *, step, item, max_tokens, **kw):
        level = self.level_of[item]
        self.started.append(level)
        if level < self.held:
            self.opened.set()
        else:
            await asyncio.wait_for(self.opened.wait(), timeout=10)
        return schema(title=f"R{item}", summary="S.", rating=1.0, rating_explanation="E.",
                      findings=[{"summary": "F.", "explanation": "E."}])


def test_community_whose_elements_fit_does_not_wait_for_the_level_below():
    entities, relationships = graph(long=False)
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    deepest = int(comms["level"].max())
    assert deepest >= 1
    level_of = {str(c): int(lv) for c, lv in zip(comms["community"], comms["level"])}
    llm = GatedLLM(level_of, held_level=deepest)
    settings = Settings(reports=ReportSettings(max_input_tokens=200_000, max_tokens=800))
    reports, failed = asyncio.run(write_reports(comms, entities, relationships, None, llm, settings=settings,
                                                language="en"))
    assert failed == [] and len(reports) == len(comms)
    # the deepest level was queued first, yet a shallower report started while it was held
    assert llm.started[0] == deepest and min(llm.started) < deepest


def test_carried_communities_cost_no_call(small_budget):
    _, _, comms, reporter, reports, _, _ = small_budget
    carried = comms[comms["carried"]]
    assert len(carried) > 0
    assert len(reporter.llm.requests) == len(llm_written(reports))
    by_number = reports.set_index("community")
    for row in carried.itertuples():
        origin = row.parent
        while comms.set_index("community").loc[origin, "carried"]:
            origin = comms.set_index("community").loc[origin, "parent"]
        mine, theirs = by_number.loc[row.community], by_number.loc[origin]
        assert mine["title"] == theirs["title"] and mine["full_content"] == theirs["full_content"]
        assert mine["level"] == row.level and mine["id"] != theirs["id"]


def test_higher_level_over_budget_uses_sub_reports(small_budget, large_budget):
    entities, relationships, comms, reporter, reports, _, _ = small_budget
    by_number = reports.set_index("community")
    composed = reports[reports["used_sub_reports"]]
    assert len(composed) > 0
    # Only communities with real (non-carried) children can be composed from sub-reports.
    assert composed["children"].map(len).gt(0).all()
    checked = 0
    for _, row in composed.iterrows():
        prompt = prompt_of(reporter, row)
        assert "-----Sub-community reports-----" in prompt
        kids = [by_number.loc[k] for k in row["children"] if not by_number.loc[k, "carried"]]
        cited = [k for k in kids if f": {k['title']}\n" in prompt]
        assert cited, "the parent's prompt must hold sub-community report titles"
        for k in cited:
            assert f"## Report {k.name}: {k['title']}\nSummary" in prompt
        checked += 1
    assert checked == len(composed)
    # Such a community's raw elements really exceed the budget (as measured by the run with a
    # budget large enough for everything).
    _, _, _, _, raw_reports = large_budget
    raw_tokens = raw_reports.set_index("community")["context_tokens"]
    assert (raw_tokens.loc[composed["community"]] > 500).all()


@pytest.fixture(scope="module")
def large_budget():
    entities, relationships = graph()
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=200_000)
    assert failed == []
    return entities, relationships, comms, reporter, reports


def test_large_budget_uses_raw_elements(large_budget):
    entities, relationships, comms, reporter, reports = large_budget
    assert not reports["used_sub_reports"].any()
    title_of = dict(zip(entities["id"], entities["title"]))
    hrid = dict(zip(relationships["id"], relationships["human_readable_id"].astype(str)))
    for _, row in llm_written(reports).iterrows():
        prompt = prompt_of(reporter, row)
        c = comms.set_index("community").loc[row["community"]]
        assert entities_in(prompt) == {title_of[e] for e in c["entity_ids"]}
        assert sorted(r[0] for r in section(prompt, "Relationships")) == sorted(hrid[r] for r in c["relationship_ids"])
        assert "Sub-community reports" not in prompt


def test_leaf_context_respects_budget_and_combined_degree(small_budget):
    entities, relationships, comms, reporter, reports, _, _ = small_budget
    rel = relationships.set_index("id")
    leaves = llm_written(reports[reports["children"].map(len) == 0])
    truncated = 0
    for _, row in leaves.iterrows():
        prompt = prompt_of(reporter, row)
        assert row["context_tokens"] <= 500
        context = prompt.split("Data:\n\n", 1)[1].removesuffix("\n")
        assert count_tokens(context) == row["context_tokens"]
        c = comms.set_index("community").loc[row["community"]]
        ranked = rel.loc[list(c["relationship_ids"])].sort_values(
            ["combined_degree", "human_readable_id"], ascending=[False, True])
        shown = [int(r[0]) for r in section(prompt, "Relationships")]
        # Edges are a prefix of the community's edges by descending combined degree.
        assert shown == ranked["human_readable_id"].tolist()[:len(shown)]
        # Every shown edge has its endpoints in the entity table.
        ents = entities_in(prompt)
        for r in section(prompt, "Relationships"):
            assert r[1] in ents and r[2] in ents
        truncated += len(shown) < len(ranked)
    assert truncated > 0  # the budget really bit


def test_claims_join_their_entities():
    entities, relationships = graph(long=False)
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    covariates = pd.DataFrame({
        "id": ["k0", "k1"], "human_readable_id": [0, 1], "covariate_type": "claim", "type": ["FRAUD", "GIFT"],
        "description": ["C0N1 was accused of fraud.", "ISO2 gave a gift."], "subject_id": ["C0N1", "ISO2"],
        "object_id": ["NONE", "C0N3"], "status": ["SUSPECTED", "TRUE"], "start_date": ["2020-01-01", None],
        "end_date": ["2020-02-01", None], "source_text": "", "text_unit_id": "tu0",
    })
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=200_000, covariates=covariates)
    assert failed == []
    claims_seen = {}
    for prompt in reporter.prompts:
        for r in section(prompt, "Claims"):
            claims_seen.setdefault(r[1], set()).add(r[-1])
            assert r[1] in entities_in(prompt)
    assert claims_seen["C0N1"] == {"C0N1 was accused of fraud."}
    assert claims_seen["ISO2"] == {"ISO2 gave a gift."}


def test_failed_report_is_listed_and_parent_uses_raw_elements():
    entities, relationships = graph()
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    by_number = comms.set_index("community")
    title_of = dict(zip(entities["id"], entities["title"]))
    # A non-carried leaf whose siblings are real communities too.
    target = next(r for r in comms.itertuples()
                  if not r.carried and len(r.children) == 0 and r.level > 0
                  and len(by_number.loc[r.parent, "children"]) > 1 and not by_number.loc[r.parent, "carried"]
                  and r.size <= 4)
    reporter = Reporter(fail={title_of[e] for e in target.entity_ids})
    reports, failed = run(comms, entities, relationships, reporter, budget=500)
    assert failed == [str(target.community)]
    assert target.community not in set(reports["community"])
    assert len(reports) == len(comms) - 1
    assert target.parent in set(reports["community"])


def test_parent_of_a_failed_report_uses_its_raw_elements():
    entities, relationships, comms = hand_made({"A": 5, "B": 4, "C": 3}, [("A", "B"), ("B", "C")])
    reporter = Reporter(fail={"B0", "B1", "B2", "B3"})
    reports, failed = run(comms, entities, relationships, reporter, budget=850)
    assert failed == ["2"]
    root = reports.set_index("community").loc[0]
    prompt = prompt_of(reporter, root)
    assert "## Report 1:" in prompt and "## Report 2:" not in prompt
    assert {"B1", "B2", "B3"} <= entities_in(prompt)
    assert root["used_sub_reports"]


def test_failed_origin_fails_its_carried_copies():
    entities, relationships = graph(long=False)
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    title_of = dict(zip(entities["id"], entities["title"]))
    by_number = comms.set_index("community")

    def origin(n):
        while by_number.loc[n, "carried"]:
            n = by_number.loc[n, "parent"]
        return n

    # A community with relationships whose branch ends early, so carried copies hang below it.
    copies = comms[comms["carried"]].assign(origin=lambda d: d["community"].map(origin))
    leaf = next(r for r in comms.itertuples() if not r.carried and len(r.relationship_ids)
                and r.community in set(copies["origin"]))
    reporter = Reporter(fail={title_of[e] for e in leaf.entity_ids})
    reports, failed = run(comms, entities, relationships, reporter, budget=20000)
    lost = [leaf.community] + copies.loc[copies["origin"] == leaf.community, "community"].tolist()
    assert sorted(failed) == sorted(str(n) for n in lost)
    assert len(reports) == len(comms) - len(lost)


def test_isolated_entity_report_comes_from_its_description_without_a_call():
    entities, relationships = graph(long=False)
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=2000)
    iso = entities[entities["title"] == "ISO1"].iloc[0]
    mine = reports[reports["title"] == "ISO1"]
    assert len(mine) == comms["level"].nunique()  # one per level: the singleton and its copies
    assert (mine["summary"] == iso["description"]).all()
    assert all(f"Entities ({iso['human_readable_id']})" in fs[0]["explanation"] for fs in mine["findings"])
    assert not any("ISO1" in entities_in(p) and len(entities_in(p)) == 1 for p in reporter.prompts)
    assert len(reporter.llm.requests) == len(llm_written(reports))


def test_chinese_prompt_and_cache(tmp_path):
    entities, relationships = graph(long=False)
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    reporter = Reporter()
    reports, _ = run(comms, entities, relationships, reporter, budget=2000, language="zh",
                     cache=tmp_path / "llm.sqlite")
    assert "中文" in reporter.prompts[0] and "[Data: Entities" in reporter.prompts[0]
    # Contexts are deterministic, so a rerun is answered from the cache entirely.
    again = Reporter()
    reports2, _ = run(comms, entities, relationships, again, budget=2000, language="zh",
                      cache=tmp_path / "llm.sqlite")
    assert again.llm.requests == []
    pd.testing.assert_frame_equal(reports, reports2)


def test_christmas_carol_contexts(shared_data):
    folder = shared_data / "msgraphrag-christmas-carol-index"
    if not (folder / "entities.parquet").exists():
        pytest.skip("Microsoft's Christmas Carol index not found")
    entities = pd.read_parquet(folder / "entities.parquet")
    relationships = pd.read_parquet(folder / "relationships.parquet")
    covariates = pd.read_parquet(folder / "covariates.parquet")
    comms = build_communities(entities, relationships, max_cluster_size=10, seed=0xDEADBEEF)
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=6000, covariates=covariates)
    assert failed == [] and len(reports) == len(comms)
    assert (reports["context_tokens"] <= 6000).all()
    stats = reports[~reports["carried"]].groupby("level").agg(
        reports=("community", "size"), composed=("used_sub_reports", "sum"),
        mean_context=("context_tokens", "mean"))
    print(f"\nChristmas Carol reports at 6000 tokens (LLM calls {len(reporter.llm.requests)} "
          f"for {len(comms)} communities):\n{stats}")


def hand_made(groups: dict[str, int], cross: list[tuple[str, str]]):
    """One root community whose children are the `groups` (fully connected inside), linked by
    `cross` edges between their first members."""
    titles = [f"{g}{i}" for g, n in groups.items() for i in range(n)]
    pairs = [(f"{g}{i}", f"{g}{j}") for g, n in groups.items() for i in range(n) for j in range(i + 1, n)]
    pairs += [(f"{a}0", f"{b}0") for a, b in cross]
    entities = pd.DataFrame({
        "id": [f"e-{t}" for t in titles], "human_readable_id": range(len(titles)), "title": titles,
        "type": "thing", "description": [f"{t} is a thing. {LOREM}" for t in titles],
        "text_unit_ids": [["tu"]] * len(titles), "frequency": 1, "degree": 1})
    relationships = pd.DataFrame({
        "id": [f"r{i}" for i in range(len(pairs))], "human_readable_id": range(len(pairs)),
        "source": [a for a, _ in pairs], "target": [b for _, b in pairs],
        "description": [f"{a} works with {b}. {LOREM}" for a, b in pairs], "weight": 1.0,
        "combined_degree": 2, "text_unit_ids": [["tu"]] * len(pairs)})
    rows = [{"community": 0, "level": 0, "parent": -1, "children": list(range(1, len(groups) + 1)), "members": titles}]
    rows += [{"community": k + 1, "level": 1, "parent": 0, "children": [],
              "members": [t for t in titles if t.rstrip("0123456789") == g]} for k, g in enumerate(groups)]
    for r in rows:
        inside = set(r["members"])
        r.update(id=f"c{r['community']}", human_readable_id=r["community"], title=f"Community {r['community']}",
                 entity_ids=[f"e-{t}" for t in r["members"]], size=len(inside), period="2024-01-01",
                 relationship_ids=[i for i, (a, b) in zip(relationships["id"], pairs) if a in inside and b in inside],
                 text_unit_ids=["tu"], carried=False)
    return entities, relationships, pd.DataFrame(rows).drop(columns="members")


@pytest.mark.parametrize("budget, replaced", [(100_000, ""), (1200, "A"), (850, "AB"), (600, "ABC")])
def test_largest_sub_communities_are_replaced_first(budget, replaced):
    entities, relationships, comms = hand_made({"A": 5, "B": 4, "C": 3}, [("A", "B"), ("B", "C")])
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=budget)
    assert failed == []
    root = reports.set_index("community").loc[0]
    prompt = prompt_of(reporter, root)
    shown = entities_in(prompt)
    for k, g in enumerate("ABC", start=1):
        child = reports.set_index("community").loc[k]
        if g in replaced:
            assert f"## Report {k}: {child['title']}\n" in prompt
            # Its entities appear only as endpoints of edges between sub-communities.
            assert shown & {f"{g}{i}" for i in range(1, 5)} == set()
        else:
            assert f"## Report {k}:" not in prompt
            assert f"{g}1" in shown
    assert root["used_sub_reports"] == bool(replaced)
    assert root["context_tokens"] <= budget


def test_reads_stored_tables(tmp_path):
    from sensegraph.store.tables import read_table, write_table

    entities, relationships = graph(long=False)
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    write_table(comms, tmp_path, "communities")
    stored = read_table(tmp_path, "communities")
    reporter = Reporter()
    reports, failed = run(stored, entities, relationships, reporter, budget=1000)
    assert failed == [] and len(reports) == len(comms)
    write_table(reports, tmp_path, "community_reports")
    back = read_table(tmp_path, "community_reports")
    assert list(back["findings"].iloc[0][0]) == ["summary", "explanation"]


def test_claims_never_crowd_out_the_edges():
    entities, relationships, comms = hand_made({"A": 5, "B": 4, "C": 3}, [("A", "B"), ("B", "C")])
    n = 100
    covariates = pd.DataFrame({
        "id": [f"k{i}" for i in range(n)], "human_readable_id": range(n), "covariate_type": "claim",
        "type": "DEED", "description": [f"A0 did deed number {i}. {LOREM}" for i in range(n)], "subject_id": "A0",
        "object_id": None, "status": "TRUE", "start_date": None, "end_date": float("nan"),
        "source_text": "", "text_unit_id": "tu"})
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=1000, covariates=covariates)
    assert failed == []
    leaf = reports.set_index("community").loc[1]
    prompt = prompt_of(reporter, leaf)
    claims = section(prompt, "Claims")
    assert 0 < len(claims) < n and len(section(prompt, "Relationships")) >= 5
    assert leaf["context_tokens"] <= 1000
    assert all(c[5] == "" for c in claims)  # no period: missing dates stay empty, not "nan"


# -- checks on the answers (report_checks.py) ---------------------------------------------------

def composer_index():
    """One community of two entities and one relationship: a composer who joined ASCAP in 1947."""
    entities = pd.DataFrame({
        "id": ["e-ascap", "e-smith"], "human_readable_id": [5, 7], "title": ["ASCAP", "JOHN SMITH"],
        "type": ["organization", "person"],
        "description": ["ASCAP is a society of composers, authors and publishers.",
                        "John Smith is a composer from Chicago who wrote three symphonies."],
        "text_unit_ids": [["tu"], ["tu"]], "frequency": 1, "degree": [1, 1]})
    relationships = pd.DataFrame({
        "id": ["r0"], "human_readable_id": [23], "source": ["JOHN SMITH"], "target": ["ASCAP"],
        "description": ["John Smith joined ASCAP in 1947."], "weight": 1.0, "combined_degree": 2,
        "text_unit_ids": [["tu"]]})
    comms = pd.DataFrame([{
        "id": "c0", "human_readable_id": 0, "community": 0, "level": 0, "parent": -1, "children": [],
        "title": "Community 0", "entity_ids": ["e-ascap", "e-smith"], "relationship_ids": ["r0"],
        "text_unit_ids": ["tu"], "period": "2024-01-01", "size": 2, "carried": False}])
    return entities, relationships, comms


def answering(answer: dict) -> Reporter:
    """A reporter that gives every community the same answer."""
    reporter = Reporter()

    def respond(body):
        reporter.prompts.append("\n".join(m["content"] for m in body["messages"]))
        return answer

    reporter.llm = ScriptedLLM(respond)
    return reporter


def report_of(findings: list[tuple[str, str]], rating: float = 4.0) -> dict:
    return {"title": "John Smith and ASCAP", "summary": "A composer and his society [Data: Entities (5, 99)].",
            "rating": rating, "rating_explanation": "A composer's membership.",
            "findings": [{"summary": s, "explanation": e} for s, e in findings]}


def test_findings_that_cite_nothing_restate_bookkeeping_or_add_numbers_are_dropped_and_counted():
    entities, relationships, comms = composer_index()
    answer = report_of([
        ("John Smith joined ASCAP", "The composer John Smith joined ASCAP in 1947 [Data: Entities (5, 7); "
                                    "Relationships (23)]."),
        ("Three symphonies", "John Smith wrote three symphonies [Data: Entities (7, 41); Relationships (88)]."),
        ("A society of composers", "ASCAP is a society of composers, authors and publishers."),
        ("An invented record", "ASCAP works with many composers [Data: Entities (12)]."),
        ("Degree of connection: 3", "ASCAP is connected to John Smith [Data: Entities (5)]."),
        ("ASCAP's size", "ASCAP was founded in 1947 and currently has over 1 million members "
                         "[Data: Entities (5); Relationships (23)]."),
        ("A famous member", "John Smith met Leonard Bernstein at ASCAP [Data: Entities (5, 7)]."),
    ])
    counts: dict[str, int] = {}
    reports, failed = run(comms, entities, relationships, answering(answer), budget=2000, counts=counts, elementary_roots=False)
    assert failed == []
    findings = reports.iloc[0]["findings"]
    assert [f["summary"] for f in findings] == ["John Smith joined ASCAP", "Three symphonies", "A famous member"]
    # ids that are not in the context are taken out of the text; the report's summary too
    assert findings[1]["explanation"] == "John Smith wrote three symphonies [Data: Entities (7)]."
    assert reports.iloc[0]["summary"] == "A composer and his society [Data: Entities (5)]."
    assert counts == {"reports_checked": 1, "findings_written": 7, "findings_kept": 3, "findings_bookkeeping": 1,
                      "findings_uncited": 2, "findings_unsupported": 1, "findings_unknown_names": 1,
                      "citations_invalid": 4, "reports_without_findings": 0, "summary_sentences_unsupported": 0,
                      "ratings_capped": 1}
    assert "1 million" not in reports.iloc[0]["full_content"]
    assert json.loads(reports.iloc[0]["full_content_json"])["findings"] == findings


def test_a_report_whose_findings_are_all_dropped_keeps_its_title_and_summary():
    entities, relationships, comms = composer_index()
    answer = report_of([("Entities: ASCAP, JOHN SMITH", "The entity has a degree of 1 [Data: Degrees (1, 1)]."),
                        ("The Board", "The Board is a meal served during the day at ELAM.")], rating=2.0)
    counts: dict[str, int] = {}
    reports, failed = run(comms, entities, relationships, answering(answer), budget=2000, counts=counts, elementary_roots=False)
    assert failed == [] and len(reports) == 1
    row = reports.iloc[0]
    assert row["title"] == "John Smith and ASCAP" and row["findings"] == []
    assert row["full_content"] == "# John Smith and ASCAP\n\nA composer and his society [Data: Entities (5)]."
    assert counts["reports_without_findings"] == 1 and counts["findings_kept"] == 0
    assert counts["findings_bookkeeping"] == 1 and counts["findings_uncited"] == 1


def test_rating_is_capped_by_the_size_of_the_community():
    entities, relationships, comms = composer_index()
    counts: dict[str, int] = {}
    reports, _ = run(comms, entities, relationships, answering(report_of([], rating=9.0)), budget=2000, counts=counts, elementary_roots=False)
    tiny = reports.iloc[0]
    assert tiny["rank"] == 3.0 and json.loads(tiny["full_content_json"])["rating"] == 3.0
    assert counts["ratings_capped"] == 1
    # 12 entities: the root keeps its 9; groups of 5 (10 edges) and 3 entities are capped at 7 and 5
    entities, relationships, comms = hand_made({"A": 5, "B": 4, "C": 3}, [("A", "B"), ("B", "C")])
    counts = {}
    reports, _ = run(comms, entities, relationships, answering(report_of([], rating=9.0)), budget=100_000,
                     counts=counts, elementary_roots=False)
    assert reports.set_index("community")["rank"].to_dict() == {0: 9.0, 1: 7.0, 2: 5.0, 3: 5.0}
    assert counts["ratings_capped"] == 3


def test_single_entity_and_carried_reports_are_not_checked():
    entities, relationships = graph(long=False)
    comms = build_communities(entities, relationships, max_cluster_size=5, seed=1)
    counts: dict[str, int] = {}
    reports, _ = run(comms, entities, relationships, Reporter(), budget=2000, counts=counts)
    written = llm_written(reports)
    assert counts["reports_checked"] == len(written) < len(reports)
    # the reporter cites a record of each context: nothing is dropped, single-entity reports keep theirs
    assert counts["findings_kept"] == counts["findings_written"] == 6 * len(written)
    assert (reports["findings"].map(len) > 0).all()


# The context of a community as community_reports renders it, for the checks' unit tests.
CONTEXT = """-----Entities-----
id,entity,type,description,degree
5,ASCAP,organization,"ASCAP is a society of composers, authors and publishers.",1
7,JOHN SMITH,person,John Smith is a composer from Chicago who wrote three symphonies.,12

-----Claims-----
id,entity,object,type,status,period,description
2,JOHN SMITH,ASCAP,MEMBERSHIP,TRUE,1947-03-01 - 1947-03-01,John Smith became a member of ASCAP.

-----Relationships-----
id,source,target,description,combined_degree
23,JOHN SMITH,ASCAP,John Smith joined ASCAP in 1947.,13"""

COMPOSED = """-----Sub-community reports-----
## Report 12: Composers of New York
The composers of New York wrote 1,500 songs, 孙悟空 among them.
- Songs: A great deal of songs [Data: Relationships (77); Entities (99)]"""


@pytest.mark.parametrize("text, expected", [
    ("Smith [Data: Entities (5, 7); Relationships (23, 41); Claims (2)].",
     "Smith [Data: Entities (5, 7); Relationships (23); Claims (2)]."),
    ("Smith [Entities(5,7)].", "Smith [Data: Entities (5, 7)]."),                 # no "Data:", no spaces
    ("Smith [Data: Entity (5), Relationship (23, +more)]", "Smith [Data: Entities (5); Relationships (23, +more)]"),
    ("Smith【数据：实体（5，7）；关系（23）】。", "Smith[Data: Entities (5, 7); Relationships (23)]。"),
    ("Smith (Entity 5) is a composer.", "Smith [Data: Entities (5)] is a composer."),
    ("Smith is a composer (Data: Entities (5, 99)).", "Smith is a composer [Data: Entities (5)]."),
    ("Smith is a composer. Data: Entities (5, 7)", "Smith is a composer. [Data: Entities (5, 7)]"),
    ("[Data: Entities (5, 7, 5, +more)]", "[Data: Entities (5, 7, +more)]"),
    ("Born (1947) in Chicago [sic] (see Entities (7)).", "Born (1947) in Chicago [sic] (see [Data: Entities (7)])."),
    ("Nothing valid [Data: Entities (1, 2); Events (3)] here.", "Nothing valid here."),
])
def test_citation_variants_are_read_and_rewritten_with_valid_ids_only(text, expected):
    assert report_checks.rewrite_citations(text, report_checks.read_context(CONTEXT).ids).text == expected


def test_context_ids_and_evidence():
    ctx = report_checks.read_context(CONTEXT + "\n\n" + COMPOSED)
    assert ctx.ids == {"Entities": {5, 7, 99}, "Relationships": {23, 77}, "Claims": {2}, "Reports": {12}}
    # the id and degree columns support no statement: "12" is John Smith's degree, "13" a combined degree
    assert 12.0 not in ctx.numbers and 13.0 not in ctx.numbers and {1947.0, 1500.0, 3.0} <= ctx.numbers


@pytest.mark.parametrize("summary, explanation, bookkeeping", [
    ("Degree of connection: 3", "ASCAP is linked to Smith.", True),
    ("ASCAP", "The entity has a degree of 5.", True),
    ("Collaboration", "The combined degree of both teams is 12, indicating strong collaboration.", True),
    ("ASCAP", "ASCAP is the entity with id 5.", True),
    ("-----Entities-----", "ASCAP, JOHN SMITH", True),
    ("数据", "该实体的度数为3。", True),
    # real findings that only mention a degree, or the word
    ("Dulce Base", "Its degree of influence is high, so it matters to the operation.", False),
    ("Smith's studies", "Smith earned a degree in music in 1947.", False),
    ("ASCAP", "ASCAP is a society. Smith joined it in 1947. It has members. It has a degree of 1.", False),
])
def test_bookkeeping_findings(summary, explanation, bookkeeping):
    assert report_checks.is_bookkeeping(summary, explanation) is bookkeeping


@pytest.mark.parametrize("text, unsupported", [
    ("ASCAP was founded in 1947 and currently has over 1 million members.", ["1 million"]),
    ("ASCAP was founded in 1947.", []),                    # a number check alone passes it
    ("Smith wrote 3 symphonies and joined in March 1947.", []),  # three, and the claim's date 1947-03
    ("Smith joined in May 1950.", ["1950", "May"]),
    ("Smith joined ASCAP in 1947 with 2 entities and 1 relationship in the data.", []),  # row counts
    ("Smith has a degree of 12.", ["12"]),
    ("Smith wrote one million songs.", ["one million"]),
    ("史密斯于1947年加入。", []),
    ("史密斯于1950年加入，会员超过3万人。", ["1950", "3万"]),
    ("C0N1 and E3.2 are names, not numbers.", []),
    ("As Report 12 and Entity 7 say, Smith joined in 1947.", []),  # a record's number is no statement
])
def test_numbers_and_dates_must_occur_in_the_context(text, unsupported):
    ctx = report_checks.read_context(CONTEXT)
    assert report_checks.unsupported(text, ctx) == unsupported


def test_unknown_names_are_flagged():
    ctx = report_checks.read_context(CONTEXT + "\n\n" + COMPOSED)
    assert report_checks.unknown_names("The composer John Smith joined ASCAP in Chicago.", ctx) == []
    assert report_checks.unknown_names("Dr. John Smith met the Composers of New York.", ctx) == []
    assert report_checks.unknown_names("John Smith met Leonard Bernstein. The Board agreed.",
                                       ctx) == ["Leonard Bernstein"]
    assert report_checks.unknown_names("“孙悟空”与《西游记》", ctx) == ["西游记"]


def test_small_community_below_the_root_is_written_from_its_rows_without_a_call():
    """A pair below the root: an LLM report could only restate its two rows, which its parent's
    report reads anyway. Its report is written in code and cites them; the root still gets a call,
    and reports.llm_min_entities 1 asks the model for the pair again."""
    titles = ["Ada", "Bob", "Cy", "Dee"]
    entities = pd.DataFrame({"id": [f"e{i}" for i in range(4)], "human_readable_id": range(4), "title": titles,
                             "type": "person", "description": [f"{t} is a person." for t in titles],
                             "text_unit_ids": [["tu0"]] * 4, "degree": [2, 1, 2, 1]})
    pairs = [("Ada", "Bob"), ("Cy", "Dee"), ("Ada", "Cy")]
    relationships = pd.DataFrame({"id": [f"r{i}" for i in range(3)], "human_readable_id": range(3),
                                  "source": [a for a, _ in pairs], "target": [b for _, b in pairs],
                                  "description": [f"{a} married {b}." for a, b in pairs],
                                  "weight": 1.0, "combined_degree": 3, "text_unit_ids": [["tu0"]] * 3,
                                  "co_occurrence": [False, True, False]})
    comms = pd.DataFrame({"id": ["c0", "c1", "c2"], "community": [0, 1, 2], "level": [0, 1, 1], "parent": [-1, 0, 0],
                          "children": [[1, 2], [], []], "entity_ids": [["e0", "e1", "e2", "e3"], ["e0", "e1"], ["e2", "e3"]],
                          "relationship_ids": [["r0", "r1", "r2"], ["r0"], ["r1"]], "size": [4, 2, 2],
                          "carried": False})
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=2000)
    assert failed == [] and len(reports) == 3
    assert len(reporter.prompts) == 1 and entities_in(reporter.prompts[0]) == set(titles)  # the root only
    pair = reports.set_index("community").loc[1]
    assert pair["title"] == "Ada and Bob" and pair["summary"] == "Ada married Bob."
    cited = " ".join(f["explanation"] for f in pair["findings"])
    assert "[Data: Entities (0)]" in cited and "[Data: Entities (1)]" in cited and "[Data: Relationships (0)]" in cited
    weak = reports.set_index("community").loc[2]  # linked only by a co-occurrence edge
    assert weak["summary"] == "Cy is a person. Dee is a person." and weak["rank"] == 1.0
    assert pair["rank"] == 2.0  # below the cap of a two-entity community
    assert weak["rating_explanation"] == community_reports.ELEMENTARY_EXPLANATION["en"]

    every = Reporter()
    settings = Settings(reports=ReportSettings(max_input_tokens=2000, max_tokens=800, llm_min_entities=1))

    async def go():
        llm = every.llm.client(cache=None)
        try:
            return await write_reports(comms, entities, relationships, None, llm, settings=settings, language="en")
        finally:
            await llm.aclose()

    asyncio.run(go())
    # the root and the related pair; the pair named together only (a co-occurrence edge) stays free
    assert sorted(map(sorted, map(entities_in, every.prompts))) == [["Ada", "Bob"], titles]


def test_communities_of_only_co_occurring_entities_cost_no_call_at_the_root_too():
    """Leiden may split off entities that sentences merely name together: with no extracted
    relationship among them, their report is their rows, below the root and (unless
    reports.elementary_roots is false) at the root."""
    titles = ["Ada", "Bob", "Cy", "Dee", "Eve", "Fay"]
    entities = pd.DataFrame({"id": [f"e{i}" for i in range(6)], "human_readable_id": range(6), "title": titles,
                             "type": "person", "description": [f"{t} is a person." for t in titles],
                             "text_unit_ids": [["tu0"]] * 6, "degree": 2})
    pairs = [("Ada", "Bob", False), ("Bob", "Cy", False), ("Dee", "Eve", True), ("Eve", "Fay", True),
             ("Cy", "Dee", False)]
    relationships = pd.DataFrame({"id": [f"r{i}" for i in range(5)], "human_readable_id": range(5),
                                  "source": [a for a, _, _ in pairs], "target": [b for _, b, _ in pairs],
                                  "description": [f"{a} and {b}." for a, b, _ in pairs], "weight": 1.0,
                                  "combined_degree": 4, "text_unit_ids": [["tu0"]] * 5,
                                  "co_occurrence": [w for _, _, w in pairs]})
    comms = pd.DataFrame({"id": ["c0", "c1", "c2", "c3"], "community": [0, 1, 2, 3], "level": [0, 1, 1, 0],
                          "parent": [-1, 0, 0, -1], "children": [[1, 2], [], [], []],
                          "entity_ids": [["e0", "e1", "e2", "e3", "e4", "e5"], ["e0", "e1", "e2"], ["e3", "e4", "e5"],
                                         ["e3", "e4", "e5"]],
                          "relationship_ids": [["r0", "r1", "r2", "r3", "r4"], ["r0", "r1"], ["r2", "r3"], ["r2", "r3"]],
                          "size": [6, 3, 3, 3], "carried": False})
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=2000)
    asked = [entities_in(p) for p in reporter.prompts]
    assert failed == [] and sorted(map(sorted, asked)) == sorted([titles, ["Ada", "Bob", "Cy"]])
    for n in (2, 3):  # the co-named three, below the root and as a root of their own
        weak = reports.set_index("community").loc[n]
        assert weak["rating_explanation"] == community_reports.ELEMENTARY_EXPLANATION["en"]
        assert weak["summary"] == "Dee is a person. Eve is a person. Fay is a person."
    asking = Reporter()
    run(comms, entities, relationships, asking, budget=2000, elementary_roots=False)
    asked = [entities_in(p) for p in asking.prompts]
    assert sorted(map(sorted, asked)) == sorted([titles, ["Ada", "Bob", "Cy"], ["Dee", "Eve", "Fay"]])


def test_a_root_pair_is_written_from_its_rows_and_a_bigger_related_root_is_asked():
    """A root community of two related entities: a model could only restate the relationship.
    A root of three related entities, or one with a claim, is asked."""
    titles = ["Ada", "Bob", "Cy", "Dee", "Eve", "Fay", "Gus"]
    entities = pd.DataFrame({"id": [f"e{i}" for i in range(7)], "human_readable_id": range(7), "title": titles,
                             "type": "person", "description": [f"{t} is a person." for t in titles],
                             "text_unit_ids": [["tu0"]] * 7, "degree": 1})
    pairs = [("Ada", "Bob"), ("Cy", "Dee"), ("Dee", "Eve"), ("Fay", "Gus")]
    relationships = pd.DataFrame({"id": [f"r{i}" for i in range(4)], "human_readable_id": range(4),
                                  "source": [a for a, _ in pairs], "target": [b for _, b in pairs],
                                  "description": [f"{a} taught {b}." for a, b in pairs], "weight": 1.0,
                                  "combined_degree": 2, "text_unit_ids": [["tu0"]] * 4, "co_occurrence": False})
    covariates = pd.DataFrame({"id": ["k0"], "human_readable_id": [0], "covariate_type": ["claim"],
                               "subject_id": ["Fay"], "object_id": ["Gus"], "type": ["FRAUD"], "status": ["TRUE"],
                               "start_date": [None], "end_date": [None], "description": ["Fay defrauded Gus."],
                               "source_text": ["Fay defrauded Gus."], "text_unit_id": ["tu0"]})
    comms = pd.DataFrame({"id": ["c0", "c1", "c2"], "community": [0, 1, 2], "level": 0, "parent": -1,
                          "children": [[], [], []], "entity_ids": [["e0", "e1"], ["e2", "e3", "e4"], ["e5", "e6"]],
                          "relationship_ids": [["r0"], ["r1", "r2"], ["r3"]], "size": [2, 3, 2], "carried": False})
    reporter = Reporter()
    reports, failed = run(comms, entities, relationships, reporter, budget=2000, covariates=covariates)
    asked = sorted(map(sorted, (entities_in(p) for p in reporter.prompts)))
    assert failed == [] and asked == [["Cy", "Dee", "Eve"], ["Fay", "Gus"]]
    pair = reports.set_index("community").loc[0]
    assert pair["summary"] == "Ada taught Bob." and pair["title"] == "Ada and Bob"
