// The sensegraph explorer: drill down from root-level communities to entities and source text
// (breadcrumbs roll back up), see a community as a network, and ask questions whose citations
// link to the records they cite. Hash routes keep every view linkable and the back button working.
import { apiKey, askStream, AuthError, get, NotFound } from "./api";
import { clear, h, Child } from "./dom";
import { initialLang, lang, setLang, t } from "./i18n";
import { recordHref, richText } from "./text";

type Any = any;
const app = document.getElementById("app")!;
let info: Any = null;
let seq = 0; // the current render; an older render's late results are dropped
let cleanup: (() => void) | null = null;
// A lazy index (LazyGraphRAG) has concepts and co-occurrences instead of extracted entities and
// relationships, and no reports: its communities are shown by their most frequent concepts.
const lazy = (): boolean => info?.method === "lazy";

// -- small pieces --------------------------------------------------------------------------------
function fmtRating(r: number | null | undefined): string {
  return r === null || r === undefined ? "–" : (Math.round(r * 10) / 10).toString();
}

function ratingBadge(r: number | null | undefined): HTMLElement {
  const v = r ?? 0;
  const tone = v >= 7 ? "high" : v >= 4 ? "mid" : "low";
  return h("span", { class: `badge rating ${tone}`, title: t("rating") }, `★ ${fmtRating(r)}`);
}

function conceptChips(concepts: Any[]): HTMLElement {
  // spans, not links: a card is a link already
  return h("div", { class: "chips", "data-testid": "top-concepts" }, concepts.map((e: Any) =>
    h("span", { class: "chip", title: e.type || "" }, e.title, h("span", { class: "freq" }, ` ${e.frequency}`))));
}

function lazyCard(c: Any): HTMLElement {
  return h("a", { class: "card", href: `#/community/${c.community}`, "data-testid": "community-card",
                  "data-community": c.community },
    h("div", { class: "card-head" }, h("h3", {}, c.title)),
    h("div", { class: "meta" }, `${t("level")} ${c.level} · ${c.size} ${t("conceptsSize")} · ${c.text_units} ` +
      `${t("sources").toLowerCase()}` +
      (c.children.length ? ` · ${c.children.length} ${t("subCommunities").toLowerCase()}` : "")),
    conceptChips(c.top_concepts || []));
}

function card(c: Any): HTMLElement {
  if (lazy()) return lazyCard(c);
  return h("a", { class: "card", href: `#/community/${c.community}`, "data-testid": "community-card",
                  "data-community": c.community },
    h("div", { class: "card-head" }, h("h3", {}, c.title), ratingBadge(c.rating)),
    h("div", { class: "meta" }, `${t("level")} ${c.level} · ${c.size} ${t("size")}` +
      (c.children.length ? ` · ${c.children.length} ${t("subCommunities").toLowerCase()}` : "")),
    h("p", { class: "summary" }, c.summary));
}

function breadcrumbs(path: Any[], last?: string): HTMLElement {
  const nav = h("nav", { class: "crumbs", "aria-label": "breadcrumbs", "data-testid": "breadcrumbs" },
    h("a", { href: "#/" }, t("explore")));
  path.forEach((p, i) => {
    nav.append(h("span", { class: "sep" }, "›"));
    const label = `${p.title}`;
    nav.append(i === path.length - 1 && !last ? h("span", { class: "here" }, label)
      : h("a", { href: `#/community/${p.community}`, "data-community": p.community }, label));
  });
  if (last) nav.append(h("span", { class: "sep" }, "›"), h("span", { class: "here" }, last));
  return nav;
}

function section(title: string, count: number, body: Child, testid?: string): HTMLElement {
  return h("section", { class: "block", "data-testid": testid },
    h("h2", {}, title, h("span", { class: "count" }, String(count))), body);
}

// A long list shows its first rows and a button for the rest.
function listOf<T>(items: T[], row: (item: T) => HTMLElement, first = 40, total?: number): HTMLElement {
  const ul = h("ul", { class: "records" });
  items.slice(0, first).forEach((i) => ul.append(row(i)));
  const wrap = h("div", {}, ul);
  if (items.length > first) {
    const more = h("button", { class: "more", type: "button" }, `+ ${items.length - first}`);
    more.addEventListener("click", () => { items.slice(first).forEach((i) => ul.append(row(i))); more.remove(); });
    wrap.append(more);
  }
  if (total !== undefined && total > items.length) wrap.append(h("p", { class: "muted" }, `${t("showing")} ${items.length} ${t("of")} ${total}`));
  return wrap;
}

function entityRow(e: Any): HTMLElement {
  return h("li", {}, h("a", { href: `#/entity/${e.ref}`, "data-testid": "entity-link", "data-ref": e.ref }, e.title),
    h("span", { class: "tag" }, e.type || ""),
    lazy() ? h("span", { class: "muted small", "data-testid": "frequency" }, ` ${t("frequency")} ${e.frequency} ·`) : null,
    h("span", { class: "muted small" }, ` ${t("degree")} ${e.degree}`),
    e.description ? h("div", { class: "desc" }, e.description) : null);
}

function relationshipRow(r: Any): HTMLElement {
  const end = (title: string, ref: number | null) => ref === null || ref === undefined ? h("span", {}, title)
    : h("a", { href: `#/entity/${ref}` }, title);
  return h("li", {}, end(r.source, r.source_ref), h("span", { class: "arrow" }, " — "), end(r.target, r.target_ref),
    " ", h("a", { class: "small", href: `#/relationship/${r.ref}`, "data-testid": "relationship-link" }, `#${r.ref}`),
    r.weight !== null && r.weight !== undefined ? h("span", { class: "muted small" }, ` ${t("weight")} ${r.weight}`) : null,
    r.description ? h("div", { class: "desc" }, r.description) : null);
}

function unitRow(u: Any): HTMLElement {
  return h("li", {}, h("a", { href: `#/source/${u.ref}`, "data-testid": "source-link", "data-ref": u.ref },
    `${t("source")} ${u.ref}`), u.document ? h("span", { class: "muted small" }, ` · ${u.document}`) : null,
    h("div", { class: "desc" }, u.preview));
}

function claimRow(c: Any): HTMLElement {
  return h("li", {}, h("a", { href: `#/claim/${c.ref}` }, `${t("claim")} ${c.ref}`),
    h("span", { class: "tag" }, c.type || ""), h("span", { class: "muted small" }, ` ${c.status || ""}`),
    h("div", { class: "desc" }, c.description));
}

// -- views ---------------------------------------------------------------------------------------
async function home(my: number): Promise<void> {
  const tree = await get(`/api/communities?level=0`);
  if (my !== seq) return;
  const roots = tree.communities.filter((c: Any) => c.parent === null);
  clear(app,
    h("div", { class: "intro" }, h("h1", {}, t("rootThemes")), h("p", { class: "muted" }, t(lazy() ? "rootIntroLazy" : "rootIntro")),
      lazy() ? h("p", { class: "notice", "data-testid": "lazy-notice" }, t("lazyNotice"), " ",
        h("a", { href: "#/ask" }, t("lazyAnswers")(info.default_method))) : null,
      h("p", { class: "muted small" }, `${info.counts.communities} ${t("allCommunities")} · ` +
        `${info.counts.entities} ${t(lazy() ? "concepts" : "entities").toLowerCase()} · ${info.counts.relationships} ` +
        `${t(lazy() ? "cooccurrences" : "relationships").toLowerCase()} · ${info.counts.text_units} ${t("sources").toLowerCase()} · ` +
        `${info.levels} ${t("level").toLowerCase()}`)),
    h("div", { class: "cards", "data-testid": "root-cards" }, roots.map(card)));
  document.title = "sensegraph";
  performance.mark("sg:home-rendered");
}

async function community(my: number, n: number): Promise<void> {
  const d = await get(`/api/communities/${n}?limit=300`);
  if (my !== seq) return;
  const c = d.community, rep = d.report;
  document.title = `${c.title} · sensegraph`;
  clear(app,
    breadcrumbs(d.path),
    h("div", { class: "title-row" },
      h("h1", { "data-testid": "community-title", "data-community": n }, c.title), lazy() ? null : ratingBadge(c.rating),
      h("span", { class: "badge" }, `${t("level")} ${c.level}`),
      h("span", { class: "badge" }, `${c.size} ${t(lazy() ? "conceptsSize" : "size")}`),
      lazy() ? h("span", { class: "badge" }, `${c.text_units} ${t("sources").toLowerCase()}`) : null,
      h("a", { class: "button", href: `#/community/${n}/graph`, "data-testid": "graph-button" }, t("graphView"))),
    lazy() ? null : rep ? h("article", { class: "report", "data-testid": "report", "data-community": n },
      h("p", { class: "lead" }, rep.summary),
      rep.rating_explanation ? h("p", { class: "muted" }, `${t("rating")} ${fmtRating(rep.rating)}: ${rep.rating_explanation}`) : null,
      rep.findings.length ? h("div", {}, h("h2", {}, t("findings")),
        h("ol", { class: "findings" }, rep.findings.map((f: Any) => h("li", {}, h("strong", {}, f.summary), richText(f.explanation)))))
        : richText(rep.full_content || ""))
      : h("p", { class: "muted" }, t("noReport")),
    section(t("subCommunities"), d.children.length,
      d.children.length ? h("div", { class: "cards", "data-testid": "sub-cards" }, d.children.map(card)) : h("p", { class: "muted" }, t("noSub"))),
    h("div", { class: "columns" },
      section(t(lazy() ? "concepts" : "entities"), d.totals.entities, listOf(d.entities, entityRow, 40, d.totals.entities), "entities"),
      section(t(lazy() ? "cooccurrences" : "relationships"), d.totals.relationships,
        listOf(d.relationships, relationshipRow, 25, d.totals.relationships))),
    section(t("sources"), d.totals.text_units, listOf(d.text_units, unitRow, 15, d.totals.text_units), "sources"));
}

async function graphView(my: number, n: number): Promise<void> {
  performance.clearMarks("sg:graph-start");
  performance.mark("sg:graph-start");
  const [d, mod, detail0] = await Promise.all([get(`/api/communities/${n}/graph?max_nodes=500`), import("./graph"),
    get(`/api/communities/${n}?limit=1`)]);
  if (my !== seq) return;
  performance.mark("sg:graph-data");
  const c = d.community;
  document.title = `${c.title} · ${t("graphView")} · sensegraph`;
  const colour = new Map<number, string>();
  d.groups.forEach((g: Any, i: number) => colour.set(g.community, mod.PALETTE[i % mod.PALETTE.length]));
  const canvas = h("div", { class: "graph-canvas", "data-testid": "graph", "data-community": n });
  const detail = h("div", { class: "graph-detail", "data-testid": "graph-detail" });
  const search = h("input", { type: "search", placeholder: t("searchGraph"), "data-testid": "graph-search",
                              "aria-label": t("searchGraph") }) as HTMLInputElement;
  const found = h("span", { class: "muted small" });
  const legend = h("ul", { class: "legend" }, d.groups.map((g: Any) =>
    h("li", {}, h("span", { class: "swatch", style: `background:${colour.get(g.community)}` }),
      h("a", { href: `#/community/${g.community}/graph` }, g.title))));
  clear(app,
    breadcrumbs(detail0.path, t("graphView")),
    h("div", { class: "title-row" }, h("h1", {}, c.title), lazy() ? null : ratingBadge(c.rating),
      h("span", { class: "badge", "data-testid": "graph-counts" }, `${d.nodes.length} ${t("nodes")} · ${d.edges.length} ${t("edges")}`),
      d.truncated ? h("span", { class: "muted small" }, `${t("showing")} ${d.nodes.length} ${t("of")} ${d.total_nodes}: ${t("truncatedGraph")}`) : null,
      h("a", { class: "button", href: `#/community/${n}` }, t(lazy() ? "backToCommunity" : "backToReport"))),
    h("div", { class: "graph-layout" }, canvas,
      h("aside", { class: "graph-side" }, h("div", { class: "graph-search" }, search, found), detail,
        d.groups.length ? h("div", {}, h("h3", {}, t("legend")), legend) : null)));
  if (my !== seq) return;
  const showNode = (node: Any) => clear(detail, h("h3", {}, node.title), h("div", { class: "muted small" },
    `${node.type || ""} · ${t("degree")} ${node.degree}`), h("p", {}, node.description),
    h("a", { class: "button", href: `#/entity/${node.ref}`, "data-testid": "graph-open-entity" }, t("openEntity")));
  const drawn = mod.draw({
    container: canvas, data: d, groupColour: colour, onNode: showNode,
    onEdge: (e: Any) => clear(detail, h("p", {}, e.description),
      h("a", { class: "button", href: `#/relationship/${e.ref}` }, t("openRelationship"))),
  });
  cleanup = () => drawn.destroy();
  search.addEventListener("input", () => {
    const count = drawn.search(search.value);
    found.textContent = search.value ? `${count}` : "";
  });
  search.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    const q = search.value.trim().toLowerCase();
    const hit = d.nodes.find((x: Any) => String(x.title).toLowerCase().includes(q));
    if (hit) { drawn.focus(hit.ref); showNode(hit); }
  });
  await drawn.ready;
  if (my !== seq) return;
  canvas.dataset.nodes = String(d.nodes.length);
  canvas.dataset.edges = String(d.edges.length);
  canvas.dataset.ready = "true";
  performance.mark("sg:graph-rendered");
}

async function entity(my: number, n: number): Promise<void> {
  const e = await get(`/api/entities/${n}`);
  if (my !== seq) return;
  document.title = `${e.title} · sensegraph`;
  clear(app,
    breadcrumbs(e.path, e.title),
    h("article", { class: "record", "data-testid": "entity", "data-ref": n },
      h("div", { class: "title-row" }, h("h1", {}, e.title), h("span", { class: "tag" }, e.type || ""),
        h("span", { class: "badge" }, `${t(lazy() ? "concept" : "entity")} ${n}`),
        lazy() ? h("span", { class: "badge" }, `${t("frequency")} ${e.record.frequency ?? "–"}`) : null,
        h("span", { class: "badge" }, `${t("degree")} ${e.record.degree ?? "–"}`)),
      richText(e.description || "")),
    section(t("communities"), e.communities.length, h("ul", { class: "records" }, e.communities.map((c: Any) =>
      h("li", {}, h("span", { class: "badge" }, `${t("level")} ${c.level}`), " ",
        h("a", { href: `#/community/${c.community}` }, c.title), " ", lazy() ? null : ratingBadge(c.rating))))),
    section(t(lazy() ? "cooccurrences" : "relationships"), e.relationships.length, listOf(e.relationships, relationshipRow, 30)),
    e.claims.length ? section(t("claims"), e.claims.length, listOf(e.claims, claimRow)) : null,
    section(t("sources"), e.text_units.length, listOf(e.text_units, unitRow, 20), "sources"));
}

async function relationship(my: number, n: number): Promise<void> {
  const r = await get(`/api/relationships/${n}`);
  if (my !== seq) return;
  const end = (x: Any) => x.ref !== undefined ? h("a", { href: `#/entity/${x.ref}` }, x.title) : h("span", {}, x.title);
  document.title = `${r.source.title} — ${r.target.title} · sensegraph`;
  clear(app,
    breadcrumbs([], `${t("relationship")} ${n}`),
    h("article", { class: "record", "data-testid": "relationship", "data-ref": n },
      h("div", { class: "title-row" }, h("h1", {}, end(r.source), " — ", end(r.target)),
        h("span", { class: "badge" }, `${t("relationship")} ${n}`),
        h("span", { class: "badge" }, `${t("weight")} ${r.record.weight ?? "–"}`)),
      richText(r.description || "")),
    section(t("sources"), r.text_units.length, listOf(r.text_units, unitRow, 20), "sources"));
}

async function source(my: number, n: number): Promise<void> {
  const u = await get(`/api/text_units/${n}`);
  if (my !== seq) return;
  document.title = `${t("source")} ${n} · sensegraph`;
  clear(app,
    breadcrumbs([], `${t("source")} ${n}`),
    h("article", { class: "record", "data-testid": "source", "data-ref": n },
      h("div", { class: "title-row" }, h("h1", {}, `${t("source")} ${n}`),
        u.document.title ? h("span", { class: "badge" }, `${t("document")}: ${u.document.title}`) : null,
        h("span", { class: "badge" }, `${u.n_tokens} ${t("tokens")}`)),
      h("div", { class: "source-text" }, u.text)),
    section(t(lazy() ? "concepts" : "entities"), u.entities.length, h("div", { class: "chips" }, u.entities.map((e: Any) =>
      h("a", { class: "chip", href: `#/entity/${e.ref}` }, e.title)))),
    section(t(lazy() ? "cooccurrences" : "relationships"), u.relationships.length, listOf(u.relationships, relationshipRow, 20)),
    u.claims.length ? section(t("claims"), u.claims.length, listOf(u.claims, claimRow)) : null);
}

async function claim(my: number, n: number): Promise<void> {
  const c = await get(`/api/claims/${n}`);
  if (my !== seq) return;
  const end = (x: Any) => x.ref !== undefined ? h("a", { href: `#/entity/${x.ref}` }, x.title) : h("span", {}, x.title ?? "");
  clear(app,
    breadcrumbs([], `${t("claim")} ${n}`),
    h("article", { class: "record", "data-testid": "claim", "data-ref": n },
      h("div", { class: "title-row" }, h("h1", {}, end(c.subject), " → ", end(c.object)),
        h("span", { class: "tag" }, c.record.type || ""), h("span", { class: "badge" }, c.record.status || "")),
      richText(c.description || ""),
      c.text_unit ? h("ul", { class: "records" }, unitRow(c.text_unit)) : null));
}

// The ask view keeps its last question and answer, so a citation can be followed and the
// back button returns to the answer.
const askState: { question: string; method: string; level: number | null; dynamic: boolean; budget: string;
                  answer: string; result: Any; running: AbortController | null; status: string } =
  { question: "", method: "", level: null, dynamic: false, budget: "", answer: "", result: null, running: null, status: "" };
const BUDGETS = ["", "100", "500", "1500"]; // lazy search's presets; "" = the server's setting

function askView(my: number): void {
  document.title = `${t("ask")} · sensegraph`;
  const question = h("textarea", { rows: 3, "data-testid": "ask-input", placeholder: t("question"),
                                   "aria-label": t("question") }) as HTMLTextAreaElement;
  question.value = askState.question;
  const method = h("select", { "data-testid": "ask-method", "aria-label": t("method") },
    info.methods.map((m: string) => h("option", { value: m, title: t("methodHelp")[m] }, m))) as HTMLSelectElement;
  method.value = askState.method || info.default_method || "global";
  const level = h("select", { "data-testid": "ask-level", "aria-label": t("level") },
    Array.from({ length: info.levels }, (_, i) => h("option", { value: i }, `C${i}`))) as HTMLSelectElement;
  level.value = String(askState.level ?? info.default_level);
  const dynamic = h("input", { type: "checkbox", "data-testid": "ask-dynamic" }) as HTMLInputElement;
  dynamic.checked = askState.dynamic;
  const globalOnly = h("span", { class: "global-only" }, h("label", {}, `${t("level")} `, level),
    h("label", {}, dynamic, ` ${t("dynamic")}`));
  const budget = h("select", { "data-testid": "ask-budget", "aria-label": t("budget") },
    BUDGETS.map((b) => h("option", { value: b }, b || t("budgetDefault")))) as HTMLSelectElement;
  budget.value = askState.budget;
  const lazyOnly = h("span", { class: "global-only" }, h("label", { title: t("budgetHelp") }, `${t("budget")} `, budget));
  const help = h("p", { class: "muted small" });
  const submit = h("button", { type: "submit", class: "primary", "data-testid": "ask-submit" }, t("askButton")) as HTMLButtonElement;
  const status = h("div", { class: "muted small", "data-testid": "ask-status" }, askState.status);
  const answer = h("div", { class: "answer", "data-testid": "answer" });
  const cited = h("div", { class: "cited", "data-testid": "cited" });
  const sync = () => {
    globalOnly.hidden = method.value !== "global";
    lazyOnly.hidden = method.value !== "lazy";
    help.textContent = (t("methodHelp")[method.value] || "") +
      (lazy() && (method.value === "global" || method.value === "drift") ? ` (${t("noReportsToRead")})` : "");
  };
  method.addEventListener("change", sync);
  sync();

  const showResult = (r: Any) => {
    clear(answer, richText(r.answer));
    answer.dataset.done = "true";
    const groups = Object.entries(r.cited || {}) as [string, Any[]][];
    clear(cited, groups.length ? h("h3", {}, t("cited")) : null, groups.map(([kind, recs]) =>
      h("div", { class: "cited-kind" }, h("strong", {}, kind), h("ul", { class: "records" }, recs.map((rec: Any) =>
        h("li", {}, h("a", { href: recordHref(kind, rec.ref) }, `${rec.ref}`), " ",
          kind === "Relationships" ? `${rec.source} — ${rec.target}` :
          String(rec.title || rec.description || rec.text || "").slice(0, 140)))))));
    const u = r.usage || {};
    const s = r.stats || {};
    status.textContent = `${r.method}${s.level !== undefined ? ` · C${s.level}` : ""}` +
      (s.tests_used !== undefined ? ` · ${s.tests_used}/${s.budget} ${t("unitsTested")}, ${s.relevant_units} ${t("relevant")}` : "") + " · " +
      `${u.calls ?? 0} ${t("calls")} · ${(u.prompt_tokens ?? 0) + (u.completion_tokens ?? 0)} ${t("tokens")}`;
    askState.status = status.textContent;
  };
  if (askState.result) showResult(askState.result);
  else if (askState.answer) answer.textContent = askState.answer;

  const form = h("form", { class: "ask-form", "data-testid": "ask-form" }, question,
    h("div", { class: "ask-controls" }, h("label", {}, `${t("method")} `, method), globalOnly, lazyOnly, submit), help);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (!question.value.trim()) return;
    askState.running?.abort();
    const ctrl = new AbortController();
    Object.assign(askState, { question: question.value, method: method.value, dynamic: dynamic.checked, budget: budget.value,
      level: method.value === "global" ? Number(level.value) : null, answer: "", result: null, running: ctrl });
    clear(answer); clear(cited);
    delete answer.dataset.done;
    submit.disabled = true;
    const started = performance.now();
    const tick = setInterval(() => {
      status.textContent = `${t("asking")} ${Math.round((performance.now() - started) / 1000)} ${t("mapping")}`;
    }, 500);
    status.textContent = t("asking");
    try {
      await askStream({ question: askState.question, method: askState.method, level: askState.level,
                        dynamic: askState.method === "global" && askState.dynamic,
                        budget: askState.method === "lazy" && askState.budget ? Number(askState.budget) : null }, {
        token: (text) => { askState.answer += text; if (answer.isConnected) answer.textContent = askState.answer; },
        result: (r) => { askState.result = r; if (answer.isConnected) showResult(r); },
        error: (m) => { status.textContent = `${t("error")}: ${m}`; askState.status = status.textContent; },
      }, ctrl.signal);
    } catch (err) {
      if (err instanceof AuthError) { keyForm(); return; }
      if ((err as Error).name !== "AbortError") status.textContent = `${t("error")}: ${(err as Error).message}`;
    } finally {
      clearInterval(tick);
      submit.disabled = false;
      askState.running = null;
    }
  });
  clear(app, h("h1", {}, t("ask")),
    lazy() ? h("p", { class: "notice", "data-testid": "lazy-notice" }, t("lazyNotice"), " ", t("lazyAnswers")(info.default_method)) : null,
    form, status, answer, cited);
  question.focus();
  void my;
}

function keyForm(): void {
  const input = h("input", { type: "password", "aria-label": t("apiKey"), placeholder: t("apiKey"),
                             "data-testid": "api-key" }) as HTMLInputElement;
  const form = h("form", { class: "key-form" }, h("p", {}, t("keyNeeded")), input,
    h("button", { type: "submit", class: "primary" }, t("keySave")));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); apiKey.set(input.value.trim()); location.reload(); });
  clear(app, form);
}

// -- routing -------------------------------------------------------------------------------------
const ROUTES: [RegExp, (my: number, n: number) => Promise<void> | void][] = [
  [/^#?\/?$/, (my) => home(my)],
  [/^#\/community\/(\d+)\/graph$/, graphView],
  [/^#\/community\/(\d+)$/, community],
  [/^#\/report\/(\d+)$/, community],
  [/^#\/entity\/(\d+)$/, entity],
  [/^#\/relationship\/(\d+)$/, relationship],
  [/^#\/source\/(\d+)$/, source],
  [/^#\/claim\/(\d+)$/, claim],
  [/^#\/ask$/, (my) => askView(my)],
];

async function route(): Promise<void> {
  const my = ++seq;
  cleanup?.();
  cleanup = null;
  const hash = location.hash || "#/";
  document.querySelectorAll<HTMLElement>("[data-nav]").forEach((a) =>
    a.classList.toggle("active", (a.dataset.nav === "ask") === hash.startsWith("#/ask")));
  const found = ROUTES.find(([re]) => re.test(hash));
  try {
    if (!info) info = await get("/api/info");
    if (!found) throw new NotFound(hash);
    const m = found[0].exec(hash)!;
    await found[1](my, m[1] ? Number(m[1]) : 0);
    window.scrollTo(0, 0);
  } catch (err) {
    if (my !== seq) return;
    if (err instanceof AuthError) keyForm();
    else if (err instanceof NotFound) clear(app, breadcrumbs([]), h("h1", {}, t("notFound")), h("p", { class: "muted" }, err.message));
    else clear(app, h("h1", {}, t("error")), h("pre", {}, String((err as Error).message || err)));
  }
}

// -- entity search in the header -----------------------------------------------------------------
function initSearch(): void {
  const input = document.getElementById("entity-search") as HTMLInputElement;
  const list = document.getElementById("search-results") as HTMLUListElement;
  let timer = 0;
  let results: Any[] = [];
  const close = () => { list.hidden = true; };
  input.addEventListener("input", () => {
    clearTimeout(timer);
    const q = input.value.trim();
    if (!q) { close(); return; }
    timer = window.setTimeout(async () => {
      try {
        const r = await get(`/api/entities?q=${encodeURIComponent(q)}&limit=12`);
        if (input.value.trim() !== q) return;
        results = r.entities;
        clear(list, results.length ? results.map((e: Any) => h("li", {}, h("a", { href: `#/entity/${e.ref}`,
          "data-testid": "search-result", onclick: () => { close(); input.value = ""; } },
          e.title, h("span", { class: "tag" }, e.type || "")))) : h("li", { class: "muted" }, t("noResults")));
        list.hidden = false;
      } catch (err) { if (err instanceof AuthError) keyForm(); }
    }, 150);
  });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") close();
    if (ev.key === "Enter" && results.length && !list.hidden) { location.hash = `#/entity/${results[0].ref}`; close(); input.value = ""; }
  });
  document.addEventListener("click", (ev) => { if (!(ev.target as Node).parentElement?.closest(".search")) close(); });
}

async function start(): Promise<void> {
  let indexLanguage = "en";
  // The first view's data is requested beside /api/info rather than after it (one round trip less).
  if (!location.hash || location.hash === "#/") get(`/api/communities?level=0`).catch(() => undefined);
  try {
    info = await get("/api/info");
    indexLanguage = info.language;
  } catch (err) { /* route() shows the key form or the error */ }
  if (info?.method === "lazy") document.getElementById("entity-search")!.dataset.i18nPlaceholder = "searchConcepts";
  setLang(initialLang(indexLanguage));
  const button = document.getElementById("lang")!;
  button.textContent = lang === "zh" ? "EN" : "中文";
  button.addEventListener("click", () => {
    setLang(lang === "zh" ? "en" : "zh");
    button.textContent = lang === "zh" ? "EN" : "中文";
    void route();
  });
  initSearch();
  window.addEventListener("hashchange", () => void route());
  await route();
}

void start();
