"""Citations in answers: `[Data: Reports (3, 17); Entities (5, +more)]`.

Answers cite the human-readable ids of the records they were given. This module reads those
references back (tolerating what small models write: singular kinds, Chinese kind names, stray
spaces), keeps only ids that were really in the context — an id the model invented is removed
from the text and reported, never shown as evidence — and rewrites each reference in one form
with at most five ids plus `+more`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_IDS = 5

_GROUP = re.compile(r"\[\s*(?:Data|数据)\s*[:：]\s*([^\[\]]*)\]", re.IGNORECASE)
_PART = re.compile(r"([A-Za-z\u4e00-\u9fff]+)\s*[（(]([^()（）]*)[)）]")
_ALIASES = {
    "report": "Reports", "reports": "Reports", "community": "Reports", "communities": "Reports", "报告": "Reports",
    "社区报告": "Reports", "entity": "Entities", "entities": "Entities", "实体": "Entities",
    "relationship": "Relationships", "relationships": "Relationships", "relation": "Relationships",
    "relations": "Relationships", "关系": "Relationships", "claim": "Claims", "claims": "Claims",
    "声明": "Claims", "主张": "Claims", "source": "Sources", "sources": "Sources", "text": "Sources",
    "texts": "Sources", "来源": "Sources", "原文": "Sources", "文本": "Sources",
}
ORDER = ("Reports", "Entities", "Relationships", "Claims", "Sources")



def citation_text(refs: dict[str, list[int]], order: tuple[str, ...], more: set[str]) -> str:
    """One reference in the prompts' form, "[Data: Entities (5, 7); Relationships (23, +more)]":
    kinds in `order`, at most MAX_IDS ids each, "+more" when ids were cut or the source said
    more; "" when no id is left. Query answers and community reports both write it."""
    pieces = []
    for kind in order:
        ids = refs.get(kind)
        if not ids:
            continue
        shown = ", ".join(str(r) for r in ids[:MAX_IDS])
        if len(ids) > MAX_IDS or kind in more:
            shown += ", +more"
        pieces.append(f"{kind} ({shown})")
    return f"[Data: {'; '.join(pieces)}]" if pieces else ""

def kind_of(word: str) -> str | None:
    return _ALIASES.get(word.strip().lower())


@dataclass
class Citations:
    cited: dict[str, list[int]] = field(default_factory=dict)   # kind -> ids, in first-cited order
    invalid: dict[str, list[int]] = field(default_factory=dict)  # ids cited but not in the context

    def add(self, target: dict[str, list[int]], kind: str, ref: int) -> None:
        refs = target.setdefault(kind, [])
        if ref not in refs:
            refs.append(ref)


def parse(text: str) -> list[tuple[str, list[int], bool]]:
    """Every (kind, ids, had_more) reference in `text`, in order of appearance."""
    out = []
    for group in _GROUP.finditer(text):
        for part in _PART.finditer(group.group(1)):
            kind = kind_of(part.group(1))
            if kind:
                body = part.group(2)
                out.append((kind, [int(n) for n in re.findall(r"\d+", body)], "more" in body.lower()))
    return out


def normalise(text: str, valid: dict[str, set[int]]) -> tuple[str, Citations]:
    """Rewrite the references in `text` keeping only ids in `valid` (kind -> ids) and at most
    MAX_IDS per kind; return the new text and what was cited."""
    found = Citations()

    def rewrite(match: re.Match[str]) -> str:
        parts: dict[str, list[int]] = {}
        more: set[str] = set()
        for piece in _PART.finditer(match.group(1)):
            kind = kind_of(piece.group(1))
            if not kind:
                continue
            if "more" in piece.group(2).lower():
                more.add(kind)
            for ref in (int(n) for n in re.findall(r"\d+", piece.group(2))):
                if ref in valid.get(kind, ()):
                    found.add(found.cited, kind, ref)
                    if ref not in parts.setdefault(kind, []):
                        parts[kind].append(ref)
                else:
                    found.add(found.invalid, kind, ref)
        return citation_text(parts, ORDER, more)

    new = _GROUP.sub(rewrite, text)
    new = re.sub(r"(\[Data: [^\[\]]*\])\]+", r"\1", new)  # "[Data: Reports (2)]]" as small models write it
    # a removed reference can leave a space before punctuation behind
    new = re.sub(r"[ \t]+([.,;:!?。，；：])", r"\1", new)
    return new, found
