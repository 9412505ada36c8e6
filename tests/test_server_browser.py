"""The web explorer in real headless Chromium (Debian's /usr/bin/chromium driven by Playwright):
open the page over a small index, drill down two levels and on to an entity and its source
text, roll back up with the breadcrumbs, open the graph view and search it, ask questions whose
streamed answers cite a report and an entity, and follow each citation to the cited record.

A lazy index (no reports) shows its communities by their most frequent concepts, and asks
with the lazy method by default.

Screenshots of every view are written to $SG_SCREENSHOTS (e.g. docs/screenshots), else to the
test's temporary folder, as test artefacts.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip("browser tests need Debian's chromium at /usr/bin/chromium (apt-get install chromium; "
                ".ci/run installs it)", allow_module_level=True)
pytest.importorskip("fastapi", reason="the server tests need the serve extra: pip install '.[serve]'")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright: pip install '.[test]'")

from explorer_index import build_index, build_lazy_index, settings_for, start_citing_server  # noqa: E402
from live_server import CHROMIUM_ARGS, LiveServer  # noqa: E402
from sensegraph.query import METHODS, GraphIndex  # noqa: E402
from sensegraph.server import create_app  # noqa: E402

TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return build_index(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def llm():
    server = start_citing_server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def live(root, llm):
    with LiveServer(create_app(root / "output", settings_for(root, llm))) as server:
        yield server


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("SG_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        # executable_path: the system's Chromium; Playwright never downloads a browser here.
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1366, "height": 800}, locale="en-US")  # a laptop screen
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def three_levels(index: GraphIndex) -> tuple[int, int, int]:
    """The root with the most members that has a grandchild, one such child, and a grandchild."""
    c = index.communities.set_index("community")
    for r in c[c["level"] == 0].sort_values("size", ascending=False).index:
        for child in c.loc[r, "children"]:
            if len(c.loc[int(child), "children"]):
                return int(r), int(child), int(c.loc[int(child), "children"][0])
    raise AssertionError("the test index has no three-level branch")


def test_drill_down_two_levels_then_entity_source_and_back_up(page, live, root, shots):
    index = GraphIndex.load(root / "output")
    r, child, grandchild = three_levels(index)
    titles = dict(zip(index.reports["community"], index.reports["title"]))

    page.goto(live.url + "/")
    cards = page.locator("[data-testid=community-card]")
    cards.first.wait_for()
    assert cards.count() == int((index.communities["level"] == 0).sum())
    page.screenshot(path=str(shots / "explore.png"))

    page.click(f"[data-testid=root-cards] [data-community='{r}']")
    page.locator(f"[data-testid=report][data-community='{r}']").wait_for()
    assert page.locator("[data-testid=community-title]").inner_text() == titles[r]
    page.screenshot(path=str(shots / "community.png"), full_page=True)

    # level 1, then level 2
    page.click(f"[data-testid=sub-cards] [data-community='{child}']")
    page.locator(f"[data-testid=report][data-community='{child}']").wait_for()
    page.click(f"[data-testid=sub-cards] [data-community='{grandchild}']")
    page.locator(f"[data-testid=report][data-community='{grandchild}']").wait_for()
    crumbs = page.locator("[data-testid=breadcrumbs] a")
    assert [crumbs.nth(i).get_attribute("data-community") for i in range(crumbs.count())] == [None, str(r), str(child)]
    assert page.url.endswith(f"#/community/{grandchild}")

    # on to an entity of the community and the source text behind it
    first_entity = page.locator("[data-testid=entities] [data-testid=entity-link]").first
    name = first_entity.inner_text()
    first_entity.click()
    page.locator("[data-testid=entity]").wait_for()
    assert page.locator("[data-testid=entity] h1").inner_text() == name
    page.screenshot(path=str(shots / "entity.png"), full_page=True)
    page.locator("[data-testid=sources] [data-testid=source-link]").first.click()
    page.locator("[data-testid=source]").wait_for()
    assert name in page.locator("[data-testid=source] .source-text").inner_text()
    page.screenshot(path=str(shots / "source.png"), full_page=True)

    # roll back up: the entity's breadcrumbs lead to its root community
    page.go_back()
    page.locator("[data-testid=entity]").wait_for()
    page.click(f"[data-testid=breadcrumbs] a[data-community='{r}']")
    page.locator(f"[data-testid=report][data-community='{r}']").wait_for()
    page.click("[data-testid=breadcrumbs] a >> nth=0")
    cards.first.wait_for()


def test_graph_view_draws_the_community_and_finds_a_node(page, live, root, shots):
    index = GraphIndex.load(root / "output")
    r, child, _ = three_levels(index)
    members = index.communities.set_index("community").loc[r, "entity_ids"]

    page.goto(f"{live.url}/#/community/{r}")
    page.click("[data-testid=graph-button]")
    graph = page.locator(f"[data-testid=graph][data-community='{r}'][data-ready=true]")
    graph.wait_for()
    assert graph.get_attribute("data-nodes") == str(len(members))
    assert int(graph.get_attribute("data-edges") or 0) > 0
    assert graph.locator("canvas").count() >= 1  # cytoscape drew on its canvases
    legend = page.locator(".legend a")
    assert legend.count() == len(index.communities.set_index("community").loc[r, "children"])

    # search: matching nodes are highlighted; Enter selects the first and offers its record
    titles = index.entities.set_index("id").loc[list(members), "title"].tolist()
    target = sorted(titles, key=len)[-1]
    page.fill("[data-testid=graph-search]", target)
    page.press("[data-testid=graph-search]", "Enter")
    page.locator("[data-testid=graph-detail] h3").wait_for()
    assert page.locator("[data-testid=graph-detail] h3").inner_text() == target
    page.screenshot(path=str(shots / "graph.png"))
    page.click("[data-testid=graph-open-entity]")
    page.locator("[data-testid=entity]").wait_for()
    assert page.locator("[data-testid=entity] h1").inner_text() == target


def test_ask_streams_an_answer_whose_citations_open_the_cited_records(page, live, root, llm, shots):
    index = GraphIndex.load(root / "output")
    r, _, _ = three_levels(index)
    llm.answer = (f"The corpus is about a fishing cooperative and an island council "
                  f"[Data: Reports ({r})]. Ferries connect the islands to Halden.")

    page.goto(live.url + "/#/ask")
    page.fill("[data-testid=ask-input]", "What are the main themes?")
    page.select_option("[data-testid=ask-method]", "global")
    page.select_option("[data-testid=ask-level]", "0")
    page.click("[data-testid=ask-submit]")
    page.locator("[data-testid=answer][data-done=true]").wait_for()
    assert "fishing cooperative" in page.locator("[data-testid=answer]").inner_text()
    link = page.locator(f"[data-testid=answer] a.citation[data-kind=Reports][data-ref='{r}']")
    assert link.count() == 1
    page.screenshot(path=str(shots / "ask.png"), full_page=True)
    link.click()
    page.locator(f"[data-testid=report][data-community='{r}']").wait_for()
    assert page.url.endswith(f"#/community/{r}")
    page.go_back()  # the answer is still there
    page.locator("[data-testid=answer][data-done=true]").wait_for()

    # local search: an entity citation opens the entity
    maria = int(index.entities.set_index("title").loc["Maria Okafor", "human_readable_id"])
    llm.answer = f"Maria Okafor co-founded the Harbor Cooperative [Data: Entities ({maria})]."
    page.select_option("[data-testid=ask-method]", "local")
    assert page.locator("[data-testid=ask-level]").is_hidden()  # levels apply to global search only
    page.fill("[data-testid=ask-input]", "Who is Maria Okafor?")
    page.click("[data-testid=ask-submit]")
    page.locator(f"[data-testid=answer][data-done=true] a.citation[data-kind=Entities][data-ref='{maria}']").click()
    page.locator(f"[data-testid=entity][data-ref='{maria}']").wait_for()
    assert page.locator("[data-testid=entity] h1").inner_text() == "Maria Okafor"


def test_chinese_interface_and_entity_search(page, live, shots):
    page.goto(live.url + "/")
    page.locator("[data-testid=community-card]").first.wait_for()
    page.click("#lang")
    page.locator("h1", has_text="顶层主题").wait_for()
    assert page.locator("[data-nav=ask]").inner_text() == "提问"
    page.screenshot(path=str(shots / "explore-zh.png"))
    page.fill("#entity-search", "海港")
    result = page.locator("[data-testid=search-result]").first
    result.wait_for()
    name = result.inner_text()
    result.click()
    page.locator("[data-testid=entity]").wait_for()
    assert "海港" in page.locator("[data-testid=entity] h1").inner_text() and "海港" in name
    page.click("#lang")  # back to English for whoever shares this browser profile


# -- a lazy index ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lazy_root(tmp_path_factory) -> Path:
    return build_lazy_index(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def lazy_live(lazy_root, llm):
    with LiveServer(create_app(lazy_root / "output", settings_for(lazy_root, llm))) as server:
        yield server


def test_lazy_index_shows_concept_named_cards_and_asks_lazy_search(page, lazy_live, lazy_root, llm, shots):
    index = GraphIndex.load(lazy_root / "output")
    comms = index.communities.set_index("community")
    roots = comms[comms["level"] == 0]

    page.goto(lazy_live.url + "/")
    cards = page.locator("[data-testid=community-card]")
    cards.first.wait_for()
    assert cards.count() == len(roots)
    shown = {int(cards.nth(i).get_attribute("data-community")): cards.nth(i) for i in range(cards.count())}
    for c, card in shown.items():
        assert card.locator("h3").inner_text() == roots.loc[c, "title"]  # "A, B, C": its top concepts
        chips = card.locator("[data-testid=top-concepts] .chip")
        assert chips.count() == min(6, int(roots.loc[c, "size"]))
        name, frequency = chips.first.inner_text().rsplit(" ", 1)  # the most frequent concept, its count
        assert roots.loc[c, "title"].startswith(name) and int(frequency) >= 1
        assert card.locator(".rating").count() == 0 and card.locator(".summary").count() == 0
        assert f"{len(roots.loc[c, 'text_unit_ids'])} source text units" in card.locator(".meta").inner_text()
    notice = page.locator("[data-testid=lazy-notice]")
    assert "lazy index" in notice.inner_text()
    default = "lazy" if "lazy" in METHODS else "basic"
    assert f"answered by {default} search" in notice.inner_text()
    page.screenshot(path=str(shots / "lazy.png"))

    # a community: its concepts with type and frequency, sub-communities, sources; no report section
    r = max(shown, key=lambda c: (len(roots.loc[c, "children"]), int(roots.loc[c, "size"])))
    page.click(f"[data-testid=root-cards] [data-community='{r}']")
    page.locator(f"[data-testid=community-title][data-community='{r}']").wait_for()
    assert page.locator("[data-testid=community-title]").inner_text() == roots.loc[r, "title"]
    assert page.locator("[data-testid=report]").count() == 0
    assert "no report" not in page.locator("#app").inner_text()
    members = page.locator("[data-testid=entities] li")
    assert members.count() == len(roots.loc[r, "entity_ids"])
    first = members.first
    top = index.entities.set_index("title").loc[first.locator("[data-testid=entity-link]").inner_text()]
    assert first.locator(".tag").inner_text() == top["type"]
    assert f"frequency {int(top['frequency'])}" in first.locator("[data-testid=frequency]").inner_text()
    assert int(top["frequency"]) == int(index.entities.set_index("id").loc[list(roots.loc[r, "entity_ids"]),
                                                                            "frequency"].max())
    assert page.locator("[data-testid=sub-cards] [data-testid=community-card]").count() == len(roots.loc[r, "children"])
    assert page.locator("[data-testid=sources] [data-testid=source-link]").count() == \
        min(15, len(roots.loc[r, "text_unit_ids"]))
    page.screenshot(path=str(shots / "lazy-community.png"), full_page=True)

    # ask: the method list offers lazy search, the default here; a streamed answer's source
    # citation opens the text unit (basic search: its context is every unit of this small index)
    page.goto(lazy_live.url + "/#/ask")
    options = page.locator("[data-testid=ask-method] option").all_inner_texts()
    assert page.locator("[data-testid=ask-method]").input_value() == default
    llm.answer = "The Harbor Cooperative was founded in 1998 [Data: Sources (0)]."
    page.select_option("[data-testid=ask-method]", "basic")
    page.fill("[data-testid=ask-input]", "When was the Harbor Cooperative founded?")
    page.click("[data-testid=ask-submit]")
    link = page.locator("[data-testid=answer][data-done=true] a.citation[data-kind=Sources][data-ref='0']")
    link.click()
    page.locator("[data-testid=source][data-ref='0']").wait_for()
    assert page.locator("[data-testid=source] .source-text").inner_text() == \
        index.text_units.set_index("human_readable_id").loc[0, "text"]
    if "lazy" not in METHODS:
        pytest.skip("the `lazy` query method is not in sensegraph.query.REGISTRY yet (issue 16, query side): "
                    "the Ask box cannot list it")
    assert "lazy" in options

    # lazy search with a budget preset: the answer streams to the end and the status counts the tests
    page.go_back()
    page.locator("[data-testid=answer][data-done=true]").wait_for()
    assert page.locator("[data-testid=ask-budget]").is_hidden()  # budgets apply to lazy search only
    page.select_option("[data-testid=ask-method]", "lazy")
    assert page.locator("[data-testid=ask-level]").is_hidden()
    page.select_option("[data-testid=ask-budget]", "100")
    page.fill("[data-testid=ask-input]", "What are the main themes?")
    page.click("[data-testid=ask-submit]")
    page.locator("[data-testid=answer][data-done=true]").wait_for()
    status = page.locator("[data-testid=ask-status]").inner_text()
    assert status.startswith("lazy · ") and "/100 units tested" in status
