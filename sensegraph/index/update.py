"""The living index: `sensegraph update` brings an index in line with its input folder.

An update is the ordinary pipeline (pipeline.run_index) with four hooks, so every table is made
by the same deterministic step functions as a fresh index, and an updated index equals a fresh
index of the same corpus in entities, relationships, their text units, claims and community
membership (tests/test_update.py checks this after a sequence of updates):

- extraction: text units already in the index keep their stored element instances
  (output/_work); only new text units (and any whose extraction failed before) are extracted.
  Instances are put in text-unit order, exactly as a fresh extraction returns them, so merging
  (majority title and type, first seen on ties) gives the same result;
- summaries and community reports go through the answer cache: an entity, relationship or
  community whose inputs are unchanged gets its previous answer at no cost, and one whose
  instances, members, descriptions or sub-reports changed is asked again (bottom-up, because a
  parent's context holds its children's reports);
- human-readable ids stay stable: rows that existed keep their number, new rows get numbers
  after the largest ever used (numbers of deleted rows are not reused, so an old citation never
  points at a different record). The report context quotes these numbers, so this is what makes
  an unchanged community's context, and so its cached report, identical;
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
from ..store.tables import has_table, read_table, write_json_atomic
from . import extract as extract_step
from .extract import ExtractionResult
from .pipeline import STATE_FILE, WORK_DIR, IndexResult, extract_fingerprint, run_index

REMOVED_DIR = "removed"  # under output/_work: files taken out of input/ by `update --remove`
INSTANCE_TABLES = ("entity_instances", "relationship_instances", "claim_instances")
SAMPLE = 20  # names listed per category in stats.json (counts are always complete)


class UpdateError(RuntimeError):
    """The index cannot be updated (none yet, or a file to remove is not in input/)."""


# -- previous index -------------------------------------------------------------------------------

class Previous:
    """The tables of the index as it was before this update."""

    def __init__(self, out: Path):
        self.out = out
        self.tables = {n: read_table(out, n) for n in ("documents", "text_units", "entities", "relationships",
                                                       "covariates", "communities", "community_reports")
                       if has_table(out, n)}
        work = out / WORK_DIR
        paths = [work / f"{n}.parquet" for n in INSTANCE_TABLES]
        self.instances = (ExtractionResult(*(pd.read_parquet(p) for p in paths), failed=[])
                          if all(p.exists() for p in paths) else None)
        stats_path = out / "stats.json"
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        self.failed_units = set((stats.get("failures") or {}).get("extract", []))
        state_path = out / STATE_FILE
        self.state = json.loads(state_path.read_text()) if state_path.exists() else {}

    def numbers(self, table: str, key: str = "id", column: str = "human_readable_id") -> dict[str, int]:
        df = self.tables.get(table)
        if df is None or df.empty or column not in df:
            return {}
        return {str(k): int(v) for k, v in zip(df[key], df[column])}

    def df(self, table: str) -> pd.DataFrame:
        return self.tables.get(table, pd.DataFrame(columns=["id"]))


def stable_numbers(ids: list[str], previous: dict[str, int], floor: int = -1) -> list[int]:
    """Numbers for `ids` (in order): the previous number where there was one, else the next
    after the largest previous number (and `floor`)."""
    nxt = max([floor, *previous.values()]) + 1
    out = []
    for i in ids:
        if i in previous:
            out.append(previous[i])
        else:
            out.append(nxt)
            nxt += 1
    return out


# -- hooks called by the pipeline -----------------------------------------------------------------

class UpdateHooks:
    def __init__(self, prev: Previous, log: Callable[[str], None] = print):
        self.prev = prev
        self.log = log
        self.info: dict[str, Any] = {}
        self.floor = json.loads((prev.out / WORK_DIR / "numbers.json").read_text()) \
            if (prev.out / WORK_DIR / "numbers.json").exists() else {}

    async def extract(self, units: pd.DataFrame, llm, *, settings: Settings, language: str,
                      advance: Callable[[int], None] | None = None) -> ExtractionResult:
        prev = self.prev
        prev_units = prev.df("text_units")
        reusable = prev.instances is not None and not prev_units.empty and \
            prev.state.get("extract") == extract_fingerprint(settings, prev_units, language)
        known = set(map(str, prev_units["id"])) - prev.failed_units if reusable else set()
        ids = [str(i) for i in units["id"]]
        todo = units[[i not in known for i in ids]]
        self.info["text_units"] = {
            "kept": len(ids) - len(todo), "extracted": len(todo),
            "removed": len(set(map(str, prev_units["id"])) - set(ids)),
            "retried_failed": len(set(ids) & prev.failed_units),
            "reason": "new text units only" if reusable else
            "extraction settings, model or prompts changed (or the last extraction was incomplete): "
            "every text unit was extracted again (unchanged requests come from the cache)",
        }
        if advance and len(ids) > len(todo):
            advance(len(ids) - len(todo))
        new = await extract_step.extract_graph(todo, llm, settings=settings, language=language, advance=advance)
        if not reusable:
            return new
        position = {u: n for n, u in enumerate(ids)}
        frames = []
        for old, fresh in zip((prev.instances.entities, prev.instances.relationships, prev.instances.claims),
                              (new.entities, new.relationships, new.claims)):
            old = old[old["text_unit_id"].astype(str).isin(known & set(ids))]
            both = pd.concat([df for df in (old, fresh) if not df.empty] or [fresh], ignore_index=True)
            # A fresh extraction lists instances in text-unit order, then as the model gave them;
            # the merge takes the first seen on ties, so the order must be the same here.
            order = both["text_unit_id"].astype(str).map(position)
            both = both.iloc[order.argsort(kind="stable")].reset_index(drop=True)
            frames.append(both[fresh.columns])
        return ExtractionResult(*frames, failed=new.failed, self_loops=new.self_loops,
                                empty_names=new.empty_names, stats=new.stats)

    def _renumber(self, df: pd.DataFrame, table: str) -> pd.DataFrame:
        if df.empty or "human_readable_id" not in df:
            return df
        df = df.copy()
        df["human_readable_id"] = stable_numbers([str(i) for i in df["id"]], self.prev.numbers(table),
                                                 int(self.floor.get(table, -1)))
        return df

    def elements(self, entities: pd.DataFrame, relationships: pd.DataFrame,
                 covariates: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        return (self._renumber(entities, "entities"), self._renumber(relationships, "relationships"),
                self._renumber(covariates, "covariates"))

    def units(self, docs: pd.DataFrame, units: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self._renumber(docs, "documents"), self._renumber(units, "text_units")

    def communities(self, comms: pd.DataFrame) -> pd.DataFrame:
        """Keep the number of every community whose membership (level + entities) is unchanged."""
        if comms.empty:
            return comms
        old_of_id = self.prev.numbers("communities", "id", "community")
        numbers = stable_numbers([str(i) for i in comms["id"]], old_of_id, int(self.floor.get("communities", -1)))
        renum = {int(o): n for o, n in zip(comms["community"], numbers)}
        comms = comms.copy()
        comms["community"] = numbers
        comms["human_readable_id"] = numbers
        comms["parent"] = [renum.get(int(p), -1) for p in comms["parent"]]
        comms["children"] = [[renum[int(c)] for c in ch] for ch in comms["children"]]
        comms["title"] = [f"Community {n}" for n in numbers]
        return comms

    # -- what was recomputed and why --------------------------------------------------------------
    def report(self, tables: dict[str, pd.DataFrame], stats: dict[str, Any]) -> dict[str, Any]:
        prev = self.prev
        out: dict[str, Any] = {"documents": self.info.get("documents", {}),
                               "text_units": self.info.get("text_units", {"kept": len(tables["text_units"]),
                                                                         "extracted": 0, "removed": 0})}
        out["entities"] = _element_changes(prev.df("entities"), tables["entities"], "title")
        out["relationships"] = _element_changes(prev.df("relationships"), tables["relationships"],
                                                lambda r: f"{r['source']} -> {r['target']}")
        out["communities"], out["community_reports"] = _community_changes(prev, tables)
        for step in ("extract", "summarize", "community_reports", "embed"):
            entry = stats["steps"].get(step, {})
            out.setdefault("llm", {})[step] = {k: entry.get(k, 0) for k in ("calls", "cache_hits", "prompt_tokens",
                                                                            "completion_tokens")}
        # Remember the largest numbers ever given, so numbers of deleted rows are never reused.
        floor = dict(self.floor)
        for name in ("documents", "text_units", "entities", "relationships", "covariates", "communities"):
            df = tables.get(name)
            col = "community" if name == "communities" else "human_readable_id"
            if df is not None and not df.empty and col in df:
                floor[name] = max(int(floor.get(name, -1)), int(df[col].max()), *prev.numbers(
                    name, "id", col).values())
        write_json_atomic(prev.out / WORK_DIR / "numbers.json", floor)
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


def _community_changes(prev: Previous, tables: dict[str, pd.DataFrame]) -> tuple[dict[str, Any], dict[str, Any]]:
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
    reasons: dict[str, int] = {}
    regenerated: set[str] = set()
    samples: list[dict[str, Any]] = []
    # bottom-up, so a parent can point at its regenerated children
    for r in sorted(new_c.to_dict("records"), key=lambda r: -int(r["level"])):
        i = str(r["id"])
        if i in carried or i not in after:
            continue
        if before.get(i) == after[i]:
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
               "reused": written - len(regenerated), "carried_copies": len(carried & set(after)),
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
    prev = Previous(out)
    hooks = UpdateHooks(prev, log)
    docs = load_documents(settings, warn=lambda m: None)
    hooks.info["documents"] = {**diff_documents(prev.df("documents"), docs), "removed_by_option": removed}
    d = hooks.info["documents"]
    log(f"update: {len(d['new'])} new, {len(d['changed'])} changed, {len(d['deleted'])} deleted, "
        f"{d['unchanged']} unchanged documents")
    kwargs: dict[str, Any] = {"log": log, "cache": cache, "allow_partial": allow_partial, "hooks": hooks}
    if bar is not None:
        kwargs["bar"] = bar
    return await run_index(settings, **kwargs)
