// Reports and answers are markdown-ish text with citations such as
// "[Data: Reports (3, 17); Entities (5, +more)]". They are turned into DOM nodes directly (never
// innerHTML), and every cited id becomes a link to its record.
import { Child, h } from "./dom";

const KIND_ALIASES: Record<string, string> = {
  report: "Reports", reports: "Reports", community: "Reports", communities: "Reports", 报告: "Reports", 社区报告: "Reports",
  entity: "Entities", entities: "Entities", 实体: "Entities",
  relationship: "Relationships", relationships: "Relationships", relation: "Relationships", relations: "Relationships", 关系: "Relationships",
  claim: "Claims", claims: "Claims", 声明: "Claims", 主张: "Claims",
  source: "Sources", sources: "Sources", text: "Sources", texts: "Sources", 来源: "Sources", 原文: "Sources", 文本: "Sources",
};

export function recordHref(kind: string, ref: number | string): string {
  switch (kind) {
    case "Reports": return `#/community/${ref}`;
    case "Entities": return `#/entity/${ref}`;
    case "Relationships": return `#/relationship/${ref}`;
    case "Claims": return `#/claim/${ref}`;
    default: return `#/source/${ref}`;
  }
}

const GROUP = /\[\s*(?:Data|数据)\s*[:：]\s*([^\[\]]*)\]/gi;
const PART = /([A-Za-z\u4e00-\u9fff]+)\s*[（(]([^()（）]*)[)）]/g;

function citation(inner: string): HTMLElement {
  const span = h("span", { class: "cite" }, "[Data: ");
  let first = true;
  for (const m of inner.matchAll(PART)) {
    const kind = KIND_ALIASES[m[1].toLowerCase()];
    if (!kind) continue;
    if (!first) span.append("; ");
    first = false;
    span.append(`${kind} (`);
    const items = m[2].split(/[,，]/).map((s) => s.trim()).filter(Boolean);
    items.forEach((item, i) => {
      if (i) span.append(", ");
      if (/^\d+$/.test(item)) {
        span.append(h("a", { class: "citation", href: recordHref(kind, item), "data-kind": kind, "data-ref": item,
                             title: `${kind} ${item}` }, item));
      } else span.append(item);
    });
    span.append(")");
  }
  span.append("]");
  return span;
}

function inline(text: string): Child[] {
  const out: Child[] = [];
  let last = 0;
  for (const m of text.matchAll(GROUP)) {
    out.push(...bold(text.slice(last, m.index)));
    out.push(citation(m[1]));
    last = m.index! + m[0].length;
  }
  out.push(...bold(text.slice(last)));
  return out;
}

function bold(text: string): Child[] {
  const parts = text.split(/\*\*(.+?)\*\*/g);
  return parts.map((p, i) => (i % 2 ? h("strong", {}, p) : p)).filter((p) => p !== "");
}

/** Markdown subset: headings, bullet and numbered lists, paragraphs, **bold**, citations. */
export function richText(text: string): HTMLElement {
  const root = h("div", { class: "rich" });
  let list: HTMLElement | null = null;
  let para: string[] = [];
  const flush = () => {
    if (para.length) root.append(h("p", {}, inline(para.join(" "))));
    para = [];
  };
  for (const raw of (text || "").split(/\r?\n/)) {
    const line = raw.trim();
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    const item = /^(?:[-*•]|\d+[.)])\s+(.*)$/.exec(line);
    if (!line) { flush(); list = null; continue; }
    if (heading) {
      flush(); list = null;
      root.append(h(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
    } else if (item) {
      flush();
      if (!list) { list = h("ul"); root.append(list); }
      list.append(h("li", {}, inline(item[1])));
    } else {
      list = null;
      para.push(line);
    }
  }
  flush();
  return root;
}
