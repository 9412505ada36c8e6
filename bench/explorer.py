"""How fast the web explorer is on a real-sized index: page load, and the graph view of the
largest community, in headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

The index is the podcast corpus (../shared/data/podcast, 1,669 transcripts) built with the mock
LLM (tests/mock_llm.py in its own process), as bench/index_overhead.py does; it is built once
into --project (about 1.5 minutes) and reused by later runs. The server runs in this process
(uvicorn on 127.0.0.1); every timed page load uses a fresh browser context (empty cache).

Figures (each the median of --runs, with min-max):
  page load     navigation start -> the root community cards are on screen (in-page clock),
                plus DOMContentLoaded and the bytes transferred;
  graph view    route entered -> nodes laid out (fCoSE) and painted, for the community with the
                most entities: cold (first graph of the page: loads the graph chunk) and warm;
  API           server time of /api/communities/{c}/graph and the index load at start-up.

    python bench/explorer.py                     # build or reuse the index, 5 runs
    python bench/explorer.py --runs 10 --screenshot docs/screenshots/graph-podcast.png
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index_overhead import CORPUS, extract_corpus, write_settings  # noqa: E402
from mock_process import mock_server_process  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from live_server import CHROMIUM_ARGS, LiveServer  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
DEFAULT_PROJECT = Path(tempfile.gettempdir()) / "sensegraph-bench-podcast"


def ensure_index(project: Path) -> float | None:
    """Build the podcast index with the mock LLM unless `project` already holds one; seconds taken."""
    from sensegraph.query.data import REQUIRED
    from sensegraph.store.tables import has_table

    out = project / "output"
    if all(has_table(out, t) for t in REQUIRED):
        return None
    if not CORPUS.exists():
        sys.exit(f"corpus not found: {CORPUS}")
    from sensegraph.config import load_settings
    from sensegraph.index.pipeline import run_index

    print(f"building the podcast index with the mock LLM into {project} (once; ~1.5 min) ...", flush=True)
    t0 = time.perf_counter()
    with mock_server_process(0.0) as server:
        extract_corpus(project / "input", None)
        write_settings(project, server.base_url, 25)
        settings = load_settings(project, env={})
        asyncio.run(run_index(settings, cache=False, allow_partial=True, log=lambda m: None))
    return time.perf_counter() - t0


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.0f} ms  ({min(values):.0f}-{max(values):.0f})"


MARK = "(name) => { const m = performance.getEntriesByName(name); return m.length ? m[m.length - 1].startTime : null; }"


def graph_time(page, community: int) -> tuple[float, float]:
    """(route -> data and code ready, route -> painted) of the graph view, in ms."""
    page.evaluate("() => { location.hash = '#/'; }")
    page.locator("[data-testid=community-card]").first.wait_for()
    page.evaluate(f"() => {{ location.hash = '#/community/{community}/graph'; }}")
    page.locator(f"[data-testid=graph][data-community='{community}'][data-ready=true]").wait_for(timeout=120_000)
    start, data, done = (page.evaluate(MARK, n) for n in ("sg:graph-start", "sg:graph-data", "sg:graph-rendered"))
    return data - start, done - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", type=Path, default=DEFAULT_PROJECT, help="where the podcast index is built/reused")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--screenshot", type=Path, default=None, help="save the largest community's graph view here")
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} not found: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    from sensegraph.server import create_app

    built = ensure_index(args.project)
    t0 = time.perf_counter()
    app = create_app(args.project / "output")  # no settings: browsing only, no model is started
    startup = time.perf_counter() - t0
    explorer = app.state.sg.explorer
    largest = max(explorer.communities, key=lambda c: (explorer.community_summary(c)["entities"], -c))
    summary = explorer.community_summary(largest)

    with LiveServer(app) as live:
        import httpx

        api_ms = []
        with httpx.Client(base_url=live.url) as http:
            for _ in range(args.runs):
                t = time.perf_counter()
                graph = http.get(f"/api/communities/{largest}/graph", params={"max_nodes": 500}).json()
                api_ms.append((time.perf_counter() - t) * 1000)
        load, dcl, cards, transferred, cold, warm, cold_data = [], [], [], [], [], [], []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            for i in range(args.runs):
                context = browser.new_context(viewport={"width": 1366, "height": 800})
                page = context.new_page()
                t = time.perf_counter()
                page.goto(live.url + "/")
                page.locator("[data-testid=community-card]").first.wait_for()
                load.append((time.perf_counter() - t) * 1000)
                cards.append(page.evaluate(MARK, "sg:home-rendered"))
                nav = page.evaluate("() => { const n = performance.getEntriesByType('navigation')[0];"
                                    " return [n.domContentLoadedEventEnd, "
                                    " performance.getEntriesByType('resource').reduce((s, r) => s + r.transferSize,"
                                    " n.transferSize)]; }")
                dcl.append(nav[0])
                transferred.append(nav[1])
                data_ms, total_ms = graph_time(page, largest)
                cold.append(total_ms)
                cold_data.append(data_ms)
                warm.append(graph_time(page, largest)[1])
                if args.screenshot and i == 0:
                    args.screenshot.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(args.screenshot))
                context.close()
            browser.close()

    counts = explorer.info()["counts"]
    print(f"\nsensegraph explorer on the podcast index ({counts['text_units']} text units, {counts['entities']} "
          f"entities, {counts['relationships']} relationships, {counts['communities']} communities)")
    if built is not None:
        print(f"index built with the mock LLM in {built:.0f} s")
    print("-" * 78)
    print(f"server start-up (load tables, resolve links)   {startup * 1000:7.0f} ms")
    print(f"page load: root cards on screen (in-page)      {spread(cards)}")
    print(f"page load: DOMContentLoaded                    {spread(dcl)}")
    print(f"page load: wall time seen by the test driver   {spread(load)}")
    print(f"page load: bytes transferred                   {statistics.median(transferred) / 1024:7.0f} KiB")
    print(f"largest community                              {largest} (level {summary['level']}, "
          f"{len(graph['nodes'])} nodes, {len(graph['edges'])} edges)")
    print(f"graph API response (server + transfer)         {spread(api_ms)}")
    print(f"graph view, cold: data + graph code ready      {spread(cold_data)}")
    print(f"graph view, cold: laid out and painted         {spread(cold)}")
    print(f"graph view, warm: laid out and painted         {spread(warm)}")
    print("-" * 78)
    print(f"{args.runs} runs; headless Chromium with --disable-gpu (software rendering), server in this process.")
    if args.screenshot:
        print(f"screenshot: {args.screenshot}")


if __name__ == "__main__":
    main()
