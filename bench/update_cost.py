"""What `sensegraph update` costs compared with a full re-index, and what a delete removes.

Indexes 90% of a corpus, adds the other 10% (every tenth document, so the new ones are spread
over the corpus) with `update`, and compares the update's LLM calls and tokens with a full
index of the final corpus made from an empty cache. Then checks that the updated index equals
that fresh one (entities, relationships, their text units, community membership), deletes one
document with `update --remove`, and shows what disappeared and that a query no longer reaches
it. Goal: the update costs no more than about twice the new data's share.

    python bench/update_cost.py                       # mock LLM, first 200 podcast transcripts
    python bench/update_cost.py --limit 400 --new-every 10
    python bench/update_cost.py --corpus ../shared/data/christmas-carol.txt --parts 10 --embedded 0.5b
    python bench/update_cost.py --corpus ../shared/data/christmas-carol.txt --lines 225:1022 --embedded 0.5b
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
PODCAST = ROOT.parent / "shared" / "data" / "podcast" / "transcripts.zip"


def podcast_docs(limit: int) -> dict[str, bytes]:
    with zipfile.ZipFile(PODCAST) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".txt"))[:limit]
        return {Path(n).name: z.read(n) for n in names}


def split_docs(path: Path, parts: int, lines: str | None = None) -> dict[str, bytes]:
    """A long text (or its lines A:B) split into `parts` documents at paragraph breaks."""
    text = path.read_text(encoding="utf-8")
    if lines:
        a, b = (int(x) if x else None for x in lines.split(":"))
        text = "\n".join(text.splitlines()[a:b])
    paras = text.split("\n\n")
    size = len(text) / parts
    groups: list[list[str]] = [[] for _ in range(parts)]
    at = 0
    for para in paras:
        groups[min(parts - 1, int((at + len(para) / 2) / size))].append(para)
        at += len(para) + 2
    return {f"{path.stem}-{n:02d}.txt": "\n\n".join(g).encode() for n, g in enumerate(groups) if g}


def settings_yaml(base_url: str | None, embedded: str | None, concurrency: int) -> str:
    if embedded:
        return (f"chat:\n  provider: local\nlocal:\n  size: {embedded}\n"
                "embedding:\n  provider: local\n")
    ep = f"  provider: openai\n  model: mock\n  base_url: {base_url}\n  api_key: x\n  concurrency: {concurrency}\n" \
         "  retry_base_seconds: 0.01\n"
    return "chat:\n" + ep + "embedding:\n" + ep + "  batch_size: 64\n"


def write_project(root: Path, docs: dict[str, bytes], yaml: str) -> None:
    (root / "input").mkdir(parents=True, exist_ok=True)
    for name, data in docs.items():
        (root / "input" / name).write_bytes(data)
    (root / "settings.yaml").write_text(yaml)


def totals(stats: dict) -> dict:
    chat = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
    for step in ("extract", "summarize", "community_reports"):
        e = stats["steps"].get(step, {})
        for k in chat:
            chat[k] += e.get(k, 0) or 0
    emb = stats["steps"].get("embed", {})
    return {**chat, "tokens": chat["prompt_tokens"] + chat["completion_tokens"],
            "embed_calls": emb.get("calls", 0), "embed_tokens": emb.get("prompt_tokens", 0),
            "reports": stats["steps"].get("community_reports", {}).get("reports", 0)}


def content(out: Path) -> dict:
    from sensegraph.store.tables import read_table

    e, r, c = (read_table(out, n) for n in ("entities", "relationships", "communities"))
    return {"entities": sorted((i, t, d, tuple(sorted(u))) for i, t, d, u in
                               zip(e["id"], e["title"], e["description"], e["text_unit_ids"])),
            "relationships": sorted((i, d, float(w), tuple(sorted(u))) for i, d, w, u in
                                    zip(r["id"], r["description"], r["weight"], r["text_unit_ids"])),
            "communities": sorted((int(lv), tuple(sorted(m))) for lv, m in zip(c["level"], c["entity_ids"]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=200, help="podcast transcripts to use")
    ap.add_argument("--new-every", type=int, default=10, help="every Nth document is the new one (10 = 10%%)")
    ap.add_argument("--corpus", type=Path, default=None, help="one text file, split into --parts documents")
    ap.add_argument("--parts", type=int, default=10)
    ap.add_argument("--lines", default=None, help="A:B: only these lines of --corpus (e.g. one chapter)")
    ap.add_argument("--embedded", choices=["0.5b", "1.5b"], default=None,
                    help="use the embedded model (slow) instead of the mock")
    ap.add_argument("--concurrency", type=int, default=25)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    from sensegraph.config import load_settings
    from sensegraph.index.pipeline import run_index
    from sensegraph.index.update import run_update

    docs = split_docs(args.corpus, args.parts, args.lines) if args.corpus else podcast_docs(args.limit)
    names = sorted(docs)
    new = [n for i, n in enumerate(names) if i % args.new_every == args.new_every - 1]
    base = {n: docs[n] for n in names if n not in new}
    tmp = Path(tempfile.mkdtemp(prefix="sg-update-"))
    quiet = lambda m: None  # noqa: E731

    def run(root: Path, coro_fn, **kw):
        settings = load_settings(root, env={})
        t0 = time.perf_counter()
        result = asyncio.run(coro_fn(settings, log=quiet, allow_partial=True, **kw))
        return result, time.perf_counter() - t0

    from contextlib import nullcontext

    if args.embedded:
        ctx = nullcontext(None)
    else:
        from mock_process import mock_server_process
        ctx = mock_server_process(0.0)
    try:
        with ctx as server:
            yaml = settings_yaml(server.base_url if server else None, args.embedded, args.concurrency)
            live, fresh = tmp / "live", tmp / "fresh"
            write_project(live, base, yaml)
            r_base, s_base = run(live, run_index)
            print(f"base index ({len(base)} documents): {totals(r_base.stats)}  ({s_base:.0f} s)", flush=True)
            for n in new:
                (live / "input" / n).write_bytes(docs[n])
            r_upd, s_upd = run(live, run_update)
            print(f"update (+{len(new)} documents): {totals(r_upd.stats)}  ({s_upd:.0f} s)", flush=True)
            write_project(fresh, docs, yaml)
            # fresh project, fresh cache: every call of a full re-index is made
            r_full, s_full = run(fresh, run_index)

            up, full = totals(r_upd.stats), totals(r_full.stats)
            units = r_full.tables["text_units"]
            new_doc_ids = set(r_full.tables["documents"][r_full.tables["documents"]["title"].isin(new)]["id"])
            new_tokens = int(units[units["document_id"].isin(new_doc_ids)]["n_tokens"].sum())
            share = new_tokens / max(1, int(units["n_tokens"].sum()))
            u = r_upd.stats["update"]
            rep = u["community_reports"]
            # The equality: a fresh index of the final corpus under the same cached
            # answers. The cost run above has its own cache, and a real model's answers are not
            # reproducible across runs (llama.cpp's batching changes the arithmetic), so equality
            # is checked on a third project that starts from a copy of the live cache.
            same = tmp / "fresh-same-cache"
            write_project(same, docs, yaml)
            shutil.copytree(live / "cache", same / "cache", dirs_exist_ok=True)
            r_same, _ = run(same, run_index)
            equal = content(live / "output") == content(same / "output")
            # Report prompts name entities by human-readable id, which an update keeps stable
            # and a fresh index numbers anew, so the fresh run's reports are new calls.
            same_calls = ", ".join(f"{k} {r_same.stats['steps'][k].get('calls', 0)}"
                                   for k in ("extract", "summarize", "community_reports"))
            equal_cost_run = content(live / "output") == content(fresh / "output")

            rows = [
                ("corpus", f"{len(docs)} documents ({'embedded ' + args.embedded if args.embedded else 'mock LLM'}); "
                           f"{len(new)} added by update"),
                ("new data share (tokens)", f"{share:.1%}  ({new_tokens:,} of {int(units['n_tokens'].sum()):,})"),
                ("full re-index: chat calls / tokens", f"{full['calls']:,} / {full['tokens']:,}  ({s_full:.0f} s)"),
                ("update: chat calls / tokens", f"{up['calls']:,} / {up['tokens']:,}  ({s_upd:.0f} s)"),
                ("update / full: calls", f"{up['calls'] / max(1, full['calls']):.1%}"),
                ("update / full: tokens", f"{up['tokens'] / max(1, full['tokens']):.1%}  "
                                          f"(ratio to new-data share: {up['tokens'] / max(1, full['tokens']) / share:.2f}x)"),
                ("  per step (update calls)", ", ".join(f"{k} {v['calls']}" for k, v in u["llm"].items())),
                ("  per step (full calls)", ", ".join(f"{k} {r_full.stats['steps'][k].get('calls', 0)}"
                                                     for k in u["llm"])),
                ("embedded tokens update / full", f"{up['embed_tokens']:,} / {full['embed_tokens']:,}"),
                ("reports regenerated", f"{rep['regenerated']} of {rep['written']} written "
                                        f"({rep['regenerated_share']:.1%}); reasons {json.dumps(rep['reasons'])}"),
                ("communities", json.dumps({k: v for k, v in u["communities"].items() if k != "note"})),
                ("entities", f"+{u['entities']['added']} -{u['entities']['removed']} "
                             f"re-summarised {u['entities']['resummarised']} unchanged {u['entities']['unchanged']}"),
                ("updated == fresh from the same cache (entities, relationships, membership)",
                 f"{equal}  (that fresh run's new chat calls: {same_calls})"),
                ("updated == fresh from an empty cache", f"{equal_cost_run}"
                 + ("" if equal_cost_run or not args.embedded else "  (expected: a real model's answers vary by run)")),
            ]
            w = max(len(k) for k, _ in rows)
            print("\nsensegraph update cost")
            print("-" * (w + 60))
            for k, v in rows:
                print(f"{k:<{w}}  {v}")
            print("-" * (w + 60))

            # delete one document (the first of the new ones) and query for it
            victim = new[0]
            before = {n: r_upd.tables[n] for n in ("entities", "relationships", "text_units", "communities")}
            r_del, _ = run(live, run_update, remove=[victim])
            d = r_del.stats["update"]
            gone_units = set(before["text_units"]["id"]) - set(r_del.tables["text_units"]["id"])
            print(f"\ndelete {victim}: text units -{len(gone_units)}, entities -{d['entities']['removed']} "
                  f"(e.g. {', '.join(d['entities']['removed_sample'][:8])}), relationships "
                  f"-{d['relationships']['removed']}, re-summarised {d['entities']['resummarised']} entities; "
                  f"reports regenerated {d['community_reports']['regenerated']} of {d['community_reports']['written']}; "
                  f"chat calls {sum(v['calls'] for k, v in d['llm'].items() if k != 'embed')}")
            import sensegraph

            text = docs[victim].decode("utf-8", "replace")
            question = "What is discussed here: " + " ".join(text.split()[:40]) + "?"
            cited_gone = 0
            for method in ("basic", "local"):
                r = sensegraph.search(question, method, root=load_settings(live, env={}))
                ctx_units = set()
                tables = r.context_tables
                for name in ("Sources",):
                    if name in tables and "id" in tables[name]:
                        ctx_units |= set(map(str, tables[name]["id"]))
                hit = [t for t in r.cited.get("Sources", []) if str(t.get("id")) in gone_units]
                cited_gone += len(hit)
                # a stretch of each deleted unit that no surviving unit contains (transcripts repeat)
                kept_text = "\n".join(r_del.tables["text_units"]["text"])
                probes = [" ".join(t.split())[len(t) // 3:len(t) // 3 + 80] for t in before["text_units"][
                    before["text_units"]["id"].isin(gone_units)]["text"]]
                probes = [x for x in probes if x and x not in " ".join(kept_text.split())]
                in_ctx = any(x in " ".join(r.context_text.split()) for x in probes)
                print(f"  {method} search for the deleted text: deleted text in context: {in_ctx}; "
                      f"citations of deleted text units: {len(hit)}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
