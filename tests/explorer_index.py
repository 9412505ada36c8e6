"""A small index for the server tests, built once per test session against the mock LLM, and a
mock whose plain-text answers carry a citation (the stock mock's answers cite nothing).

The index is deterministic: the mock's answers depend only on the request body, so every build
gives the same tables, and any mock server can answer queries over it. Two lazy indexes of the
same documents: build_lazy_index (synthetic, from the standard one: no NLP needed) and
build_nlp_lazy_index (`index_method: lazy`, the lazy extra's NLP).
"""
from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import random
import threading
from pathlib import Path
from typing import Any

import pandas as pd

import mock_llm
from mock_llm import MockServer
from sensegraph.config import Settings, load_settings
from sensegraph.index.communities import titles_from_members
from sensegraph.index.pipeline import run_index
from sensegraph.store.tables import TABLES, read_table, write_table

DOCS = {
    "harbor.txt": (
        "The Harbor Cooperative of Port Ellison was founded in 1998 by Maria Okafor and Daniel Reyes. "
        "Maria Okafor had worked for twenty years at the Northern Shipping Company before she left to "
        "organise the fishing families of Port Ellison. Daniel Reyes, a former union negotiator, wrote "
        "the first charter of the cooperative and chaired its board until 2010. The cooperative buys "
        "fuel and ice in bulk, runs a cold store on Pier Nine, and sells the catch directly to the "
        "Ellison Fish Market every morning. In 2004 the Harbor Cooperative signed a supply agreement "
        "with Bluewater Foods, a processor based in Halden. Critics at the Port Ellison Town Council "
        "argued that the cooperative had become too dependent on Bluewater Foods. When the Great Storm "
        "of 2012 destroyed Pier Nine, the cooperative rebuilt the cold store with a loan from the "
        "Coastal Development Bank. Daniel Reyes negotiated the loan."
    ),
    "council.txt": (
        "The Island Council of Maren governs the three islands of the Maren Archipelago. Its chair, "
        "Elena Voss, was elected in 2015 after a campaign about the ferry service. The ferry between "
        "Maren Harbour and the mainland port of Halden is run by the Halden Ferry Line, a private "
        "company owned by Tomas Brandt. Elena Voss accused the Halden Ferry Line of cutting winter "
        "sailings, and the Island Council of Maren opened an inquiry led by Judge Ingrid Sol. The "
        "Island Council of Maren also funds the Maren Fisheries School, which trains young people for "
        "work on the boats of the Harbor Cooperative in Port Ellison. Elena Voss met Maria Okafor to "
        "discuss a shared fish auction at Maren Harbour."
    ),
    "observatory.txt": (
        "The Halden Observatory stands on Mount Kell above the town of Halden. It was built in 1921 by "
        "the astronomer Jonas Fell with money from the Halden Science Society. Jonas Fell trained Clara "
        "Hesse, who later directed the Northern Institute of Astronomy. In 1978 the Halden Science "
        "Society sold the observatory to the University of Halden, which installed a telescope built "
        "by Kessler Optics. The Halden Ferry Line offers special sailings for visitors."
    ),
    # Chinese text in the same index: the explorer must show and search it like English.
    "harbor-zh.txt": (
        "海港合作社成立于一九九八年，创始人是王丽华和陈国强。王丽华曾在北方航运公司工作二十年。"
        "二零零四年，海港合作社与蓝水食品公司签订了供货协议。沿海发展银行后来称赞合作社是渔镇的榜样。"
    ),
}
MTIME = 1_700_000_000
_BUILT: dict[str, Path] = {}


def _entities_in(prompt: str) -> list[tuple[str, str]]:
    """(id, name) rows of the `-----Entities-----` table of a community-report prompt."""
    at = prompt.find("-----Entities-----")
    if at < 0:
        return []
    lines = prompt[at:].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.strip() or line.startswith("-----"):
            break
        cells = next(csv.reader(io.StringIO(line)), [])
        if len(cells) >= 2 and cells[0].isdigit():
            rows.append((cells[0], cells[1]))
    return rows


def _report(body: dict[str, Any], digest: bytes) -> str | None:
    """A report that reads like one: titled after its main entities, findings citing them."""
    ents = _entities_in(mock_llm._last_user(body))
    if not ents:
        return None
    names = [n for _, n in ents]
    rng = random.Random(digest)
    title = " and ".join(names[:2]) if len(names) > 1 else names[0]
    findings = [{"summary": f"The role of {n}",
                 "explanation": f"{n} is one of the central entities of this community [Data: Entities ({i})]."}
                for i, n in ents[:4]]
    return json.dumps({
        "title": title,
        "summary": f"This community links {', '.join(names[:4])}{' and others' if len(names) > 4 else ''}.",
        "rating": round(rng.uniform(2, 9), 1),
        "rating_explanation": f"The impact of {names[0]} on the others.",
        "findings": findings,
    }, ensure_ascii=False)


class CitingServer(MockServer):
    """The mock LLM, except that community reports read like reports (titled after their
    entities) and plain-text answers (the reduce and answer steps) are `self.answer` when it is
    set, so a test decides which records an answer cites."""

    answer: str = ""

    def _chat(self, writer: asyncio.StreamWriter, body: dict[str, Any], digest: bytes, fault: str) -> None:
        schema_name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        report = _report(body, digest) if schema_name == "Report" else None
        if report is not None:
            self._send(writer, 200, {"id": "chatcmpl-" + digest[:8].hex(), "object": "chat.completion", "created": 0,
                                     "model": "mock", "choices": [{"index": 0, "finish_reason": "stop",
                                                                   "message": {"role": "assistant", "content": report}}],
                                     "usage": {"prompt_tokens": 100, "completion_tokens": 100, "total_tokens": 200}})
            return
        structured = bool(body.get("response_format")) or mock_llm._hint_schema(body) is not None
        if not self.answer or structured:
            super()._chat(writer, body, digest, fault)
            return
        usage = {"prompt_tokens": 100, "completion_tokens": len(self.answer) // 4,
                 "total_tokens": 100 + len(self.answer) // 4}
        ident = "chatcmpl-" + digest[:8].hex()
        if body.get("stream"):
            self._stream(writer, ident, body.get("model") or "mock", self.answer, "stop", usage)
            return
        self._send(writer, 200, {"id": ident, "object": "chat.completion", "created": 0, "model": "mock",
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": self.answer}}],
                                 "usage": usage})


def settings_for(root: Path, server: MockServer, index_method: str = "standard") -> Settings:
    endpoint = {"provider": "openai", "base_url": server.base_url, "model": "mock", "api_key": "k",
                "retry_base_seconds": 0.01, "max_retries": 2}
    # No answer cache: tests change the scripted answer between questions.
    return load_settings(root, env={}, overrides={"chat": endpoint, "embedding": endpoint,
                                                  # small chunks and clusters: a 3-level hierarchy with
                                                  # the mock's answers (they follow the request body)
                                                  "chunks": {"size": 80, "overlap": 20},
                                                  "communities": {"max_cluster_size": 3},
                                                  "cache": {"enabled": False}, "index_method": index_method})


def build_index(base: Path) -> Path:
    """The project folder of the test index (built on first use in this session)."""
    if "root" not in _BUILT:
        _BUILT["root"] = _index(base / "explorer-project")
    return _BUILT["root"]


def build_lazy_index(base: Path) -> Path:
    """The project folder of a lazy index of the same documents (built on first use).

    Synthetic, made from a standard index the way a lazy index differs from one: no community
    reports (an empty table with the right columns) and no claims; communities named by their
    most frequent members; relationships as co-occurrence edges; stats.json naming the concept
    steps; text-unit vectors only. Its graph came from the mock's extraction rather than from
    NLP, which the explorer cannot tell apart and need not.
    """
    if "lazy" not in _BUILT:
        root = _index(base / "explorer-lazy-project")
        out = root / "output"
        entities = read_table(out, "entities")
        write_table(titles_from_members(read_table(out, "communities"), entities), out, "communities")
        write_table(pd.DataFrame(columns=TABLES["community_reports"]), out, "community_reports")
        write_table(pd.DataFrame(columns=TABLES["covariates"]), out, "covariates")
        units = read_table(out, "text_units")
        units["covariate_ids"] = [[] for _ in range(len(units))]
        write_table(units, out, "text_units")
        rels = read_table(out, "relationships")
        rels["description"] = [f"{s} and {t} occur together in {int(w)} sentences"
                               for s, t, w in zip(rels["source"], rels["target"], rels["weight"])]
        rels["pmi"] = 1.0
        write_table(rels, out, "relationships")
        for name in ("entities", "community_reports"):
            (out / "embeddings" / f"{name}.parquet").unlink(missing_ok=True)
        stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
        stats["steps"] = {("concepts" if k == "extract" else "concept_graph" if k == "summarize" else k): v
                          for k, v in stats["steps"].items()}
        (out / "stats.json").write_text(json.dumps(stats), encoding="utf-8")
        _BUILT["lazy"] = root
    return _BUILT["lazy"]


def build_nlp_lazy_index(base: Path) -> Path:
    """The project folder of a real lazy index of the same documents (`index_method: lazy`:
    concepts by NLP, which needs the `lazy` extra; no chat call)."""
    if "nlp-lazy" not in _BUILT:
        _BUILT["nlp-lazy"] = _index(base / "explorer-nlp-lazy-project", "lazy")
    return _BUILT["nlp-lazy"]


def _index(root: Path, index_method: str = "standard") -> Path:
    (root / "input").mkdir(parents=True, exist_ok=True)
    for name, text in DOCS.items():
        p = root / "input" / name
        p.write_text(text, encoding="utf-8")
        os.utime(p, (MTIME, MTIME))
    with start_citing_server() as server:
        # In a thread of its own: Playwright's sync API keeps an event loop running in this one.
        settings = settings_for(root, server, index_method)
        failed: list[BaseException] = []

        def work() -> None:
            try:
                asyncio.run(run_index(settings, log=lambda m: None))
            except BaseException as exc:  # re-raised below, in the test's thread
                failed.append(exc)

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        if failed:
            raise failed[0]
    return root


def start_citing_server() -> CitingServer:
    return CitingServer().start()  # type: ignore[return-value]
