"""The living index: `sensegraph update` brings an index in line with its input folder.

An update is the ordinary pipeline (pipeline.run_index) with stable numbering, so every table is
made by the same deterministic step functions as a fresh index, and an updated index equals a
fresh index of the same corpus in entities, relationships, their text units, claims and community
membership (tests/test_update.py checks this after a sequence of updates):

- extraction: text units already in the index keep their stored element instances
  (output/_work) when the extraction settings, prompts and model are those of the last complete
  extraction (the step runner decides, steps.Steps.previous); only new text units are extracted.
  Instances are put in text-unit order, exactly as a fresh extraction returns them, so merging
  (majority title and type, first seen on ties) gives the same result;
- summaries and community reports go through the answer cache: an entity, relationship or
  community whose inputs are unchanged gets its previous answer at no cost, and one whose
  instances, members, descriptions or sub-reports changed is asked again (bottom-up, because a
  parent's context holds its children's reports);
- human-readable ids stay stable (numbering.py): rows that existed keep their number, new rows get
  numbers after the largest ever used. The report context quotes these numbers, so this is what
  makes an unchanged community's context, and so its cached report, identical;
- communities are re-clustered from scratch with the configured seed (no starting partition):
  seeding Leiden with the previous partition would make membership depend on the history of
  updates, and an updated index could then never equal a fresh one. A community whose
  membership is unchanged keeps its `id` (a hash of level and members) and its number.

Embeddings are recomputed through the embedding cache, so only changed rows cost anything.
stats.json gets an `update` section: which documents were new, changed or deleted, how many
text units were extracted, which entities and relationships appeared, disappeared or were
re-summarised, and which community reports were regenerated and why.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import Settings
from ..store.tables import has_table, write_json_atomic
from .numbering import WORK_DIR, Numbering, stable_numbers  # noqa: F401  (stable_numbers: public here too)
from .pipeline import IndexFailed, IndexResult, run_index

REMOVED_DIR = "removed"  # under output/_work: files taken out of input/ by `update --remove`
SAMPLE = 20  # names listed per category in stats.json (counts are always complete)


class UpdateError(RuntimeError):
    """The index cannot be updated (none yet, or a file to remove is not in input/)."""


# -- what was recomputed and why --------------------------------------------------------------------

def update_report(prev: Numbering, previous_stats: dict[str, Any], documents: dict[str, Any],
                  tables: dict[str, pd.DataFrame], stats: dict[str, Any]) -> dict[str, Any]:
    """stats.json's `update` section: the documents diff, what extraction kept and redid, and
    which entities, relationships, communities and reports changed (and why)."""
    ids = set(map(str, tables["text_units"]["id"]))
    prev_ids = set(map(str, prev.df("text_units")["id"]))
    failed_before = set((previous_stats.get("failures") or {}).get("extract", []))
    ex = stats["steps"].get("extract", {})
    reused = ex.get("skipped") or ex.get("reused")
    out: dict[str, Any] = {"documents": documents, "text_units": {
        "kept": len(ids) if ex.get("skipped") else ex.get("reused_units", 0),
        "extracted": 0 if ex.get("skipped") else ex.get("extracted_units", len(ids)),
        "removed": len(prev_ids - ids), "retried_failed": len(ids & failed_before),
        "reason": "new text units only" if reused else
        "extraction settings, model or prompts changed (or the last extraction was incomplete): "
        "every text unit was extracted again (unchanged requests come from the cache)"}}
    out["entities"] = _element_changes(prev.df("entities"), tables["entities"], "title")
    out["relationships"] = _element_changes(prev.df("relationships"), tables["relationships"],
                                            lambda r: f"{r['source']} -> {r['target']}")
    out["communities"], out["community_reports"] = _community_changes(prev, tables)
    for step in ("extract", "summarize", "community_reports", "embed"):
        entry = stats["steps"].get(step, {})
        out.setdefault("llm", {})[step] = {k: entry.get(k, 0) for k in ("calls", "cache_hits", "prompt_tokens",
                                                                        "completion_tokens")}
    return out


def _names(df: pd.DataFrame, ids: set[str], label) -> list[str]:
    rows = df[df["id"].astype(str).isin(ids)]
    names = [label(r) if callable(label) else str(r[label]) for _, r in rows.iterrows()]
    return sorted(names)[:SAMPLE]


def _element_changes(old: pd.DataFrame, new: pd.DataFrame, label) -> dict[str, Any]:
    old_desc = dict(zip(old["id"].astype(str), old["description"])) if "description" in old else {}
    old_units = dict(zip(old["id"].astype(str), (sorted(u) for u in old["text_unit_ids"]))) \
        if "text_unit_ids" in old else {}
    new_ids = set(new["id"].astype(str))
    added = new_ids - set(old_desc)
    removed = set(old_desc) - new_ids
    resummarised, support = set(), set()
    for i, d, u in zip(new["id"].astype(str), new["description"], new["text_unit_ids"]):
        if i in old_desc:
            if d != old_desc[i]:
                resummarised.add(i)
            elif sorted(u) != old_units.get(i):
                support.add(i)
    return {
        "added": len(added), "removed": len(removed), "resummarised": len(resummarised),
        "support_changed_only": len(support), "unchanged": len(new_ids) - len(added) - len(resummarised) - len(support),
        "added_sample": _names(new, added, label),
        "removed_sample": _names(old, removed, label),
        "removed_reason": "no supporting text unit left",
        "resummarised_sample": _names(new, resummarised, label),
        "resummarised_reason": "instances from added or removed text units changed the descriptions to summarise",
    }


def _community_changes(prev: Numbering, tables: dict[str, pd.DataFrame]) -> tuple[dict[str, Any], dict[str, Any]]:
    old_c, new_c = prev.df("communities"), tables["communities"]
    old_r, new_r = prev.df("community_reports"), tables["community_reports"]
    old_ids = set(old_c["id"].astype(str))
    new_ids = set(new_c["id"].astype(str))
    communities = {"before": len(old_ids), "after": len(new_ids), "unchanged_membership": len(old_ids & new_ids),
                   "new_membership": len(new_ids - old_ids), "gone": len(old_ids - new_ids),
                   "note": "re-clustered from scratch (deterministic, seed from settings); a community "
                           "whose membership is unchanged keeps its id and number"}
    # report content per community id, before and after
    def content(c: pd.DataFrame, r: pd.DataFrame) -> dict[str, str]:
        if c.empty or r.empty:
            return {}
        cid = dict(zip(c["community"].astype(int), c["id"].astype(str)))
        return {cid[int(n)]: str(j) for n, j in zip(r["community"], r["full_content_json"]) if int(n) in cid}
    before, after = content(old_c, old_r), content(new_c, new_r)
    old_desc = _descriptions(prev.df("entities"), prev.df("relationships"))
    new_desc = _descriptions(tables["entities"], tables["relationships"])
    id_of_number = {int(r["community"]): str(r["id"]) for r in new_c.to_dict("records")}
    carried = {str(r["id"]) for r in new_c.to_dict("records") if r.get("carried")}
    # A report written from its community's rows (one entity, a small or only co-named
    # community: community_reports.py) read no context and cost no call; its changes are counted
    # apart, so `regenerated` is what the model was asked again.
    from_rows = set()
    if not new_r.empty and "context_tokens" in new_r:
        from_rows = {id_of_number[int(n)] for n, t in zip(new_r["community"], new_r["context_tokens"])
                     if int(n) in id_of_number and not t}
    reasons: dict[str, int] = {}
    regenerated: set[str] = set()
    rewritten: set[str] = set()
    samples: list[dict[str, Any]] = []
    # bottom-up, so a parent can point at its regenerated children
    for r in sorted(new_c.to_dict("records"), key=lambda r: -int(r["level"])):
        i = str(r["id"])
        if i in carried or i not in after:
            continue
        if before.get(i) == after[i]:
            continue
        if i in from_rows:
            rewritten.add(i)
            continue
        regenerated.add(i)
        if i not in before:
            why = "membership changed (new community)"
        elif any(new_desc.get(e) != old_desc.get(e) for e in list(r["entity_ids"]) + list(r["relationship_ids"])):
            why = "member or relationship descriptions changed"
        elif any(id_of_number.get(int(ch)) in regenerated for ch in r["children"]):
            why = "a sub-community report changed"
        else:
            why = "context changed (degrees or claims of members)"
        reasons[why] = reasons.get(why, 0) + 1
        if len(samples) < SAMPLE:
            samples.append({"community": int(r["community"]), "level": int(r["level"]), "reason": why})
    written = len([i for i in after if i not in carried])
    reports = {"total": len(after), "written": written, "regenerated": len(regenerated),
               "rewritten_from_rows": len(rewritten),
               "reused": written - len(regenerated) - len(rewritten), "carried_copies": len(carried & set(after)),
               "regenerated_share": round(len(regenerated) / written, 4) if written else 0.0,
               "reasons": reasons, "regenerated_sample": samples}
    return communities, reports


def _descriptions(entities: pd.DataFrame, relationships: pd.DataFrame) -> dict[str, str]:
    out = {}
    for df in (entities, relationships):
        if "description" in df:
            out.update(zip(df["id"].astype(str), df["description"].astype(str)))
    return out


# -- documents --------------------------------------------------------------------------------------

def diff_documents(old: pd.DataFrame, new: pd.DataFrame) -> dict[str, Any]:
    """New, changed (same title, new content), deleted and unchanged documents, by title."""
    before = dict(zip(old["title"].astype(str), old["id"].astype(str))) if not old.empty else {}
    after = dict(zip(new["title"].astype(str), new["id"].astype(str)))
    added = sorted(t for t in after if t not in before)
    deleted = sorted(t for t in before if t not in after)
    changed = sorted(t for t in after if t in before and before[t] != after[t])
    return {"new": added, "changed": changed, "deleted": deleted,
            "unchanged": len(after) - len(added) - len(changed)}


def remove_inputs(settings: Settings, names: list[str], out: Path) -> list[str]:
    """Take files out of input/ (moved under output/_work/removed/, not destroyed)."""
    folder = settings.path(settings.input.dir)
    moved = []
    for name in names:
        src = (folder / name).resolve()
        if not src.is_file() or folder.resolve() not in src.parents:
            raise UpdateError(f"{name!r} is not a file in {folder} (give its path relative to that folder)")
        dest = out / WORK_DIR / REMOVED_DIR / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dest))
        moved.append(name)
    return moved


# -- entry point -------------------------------------------------------------------------------------

async def run_update(settings: Settings, *, remove: list[str] | tuple[str, ...] = (),
                     bar=None, log: Callable[[str], None] = print, cache: bool | None = None,
                     allow_partial: bool = False) -> IndexResult:
    """Update the index in output/ to the documents now in input/ (see the module docstring)."""
    from .documents import load_documents

    out = settings.path(settings.output_dir)
    if not has_table(out, "documents") or not has_table(out, "text_units"):
        raise UpdateError(f"no index in {out} to update; run `sensegraph index` first")
    removed = remove_inputs(settings, list(remove), out) if remove else []
    prev = Numbering(out)
    stats_path = out / "stats.json"
    previous_stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    docs = load_documents(settings, warn=lambda m: None)
    diff = {**diff_documents(prev.df("documents"), docs), "removed_by_option": removed}
    log(f"update: {len(diff['new'])} new, {len(diff['changed'])} changed, {len(diff['deleted'])} deleted, "
        f"{diff['unchanged']} unchanged documents")
    kwargs: dict[str, Any] = {"log": log, "cache": cache, "allow_partial": True, "keep_numbers": True,
                              "command": "sensegraph update"}
    if bar is not None:
        kwargs["bar"] = bar
    result = await run_index(settings, **kwargs)
    result.stats["update"] = update_report(prev, previous_stats, diff, result.tables, result.stats)
    write_json_atomic(stats_path, result.stats)
    if result.failures and not allow_partial:
        raise IndexFailed(result.failures, stats_path, "sensegraph update")
    return result
