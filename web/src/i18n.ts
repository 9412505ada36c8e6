// Interface strings in English and Chinese. The index's language picks the default; the
// header button switches, and the choice is remembered.
const en = {
  explore: "Explore", ask: "Ask", searchEntities: "Search entities", loading: "Loading…",
  rootThemes: "Root-level themes", rootIntro: "The broadest communities of the graph. Open one to read its report and drill down.",
  rating: "Rating", size: "entities", subCommunities: "Sub-communities", noSub: "No sub-communities: this is a leaf.",
  report: "Report", findings: "Findings", entities: "Entities", relationships: "Relationships",
  sources: "Source text units", claims: "Claims", graphView: "Graph view", backToReport: "Report view",
  level: "Level", community: "Community", noReport: "This community has no report.",
  entity: "Entity", relationship: "Relationship", source: "Source text", claim: "Claim",
  communities: "Communities", allCommunities: "communities", document: "Document", weight: "weight", degree: "degree", type: "type",
  showing: "showing", of: "of", question: "Question", method: "Method", askButton: "Ask", asking: "Answering…",
  dynamic: "dynamic community selection", answer: "Answer", cited: "Cited records", usage: "Usage",
  calls: "LLM calls", tokens: "tokens", searchGraph: "Find a node", nodes: "nodes", edges: "edges",
  openEntity: "Open entity", openRelationship: "Open relationship", legend: "Sub-communities",
  notFound: "Not found", error: "Error", keyNeeded: "This server needs an API key.", keySave: "Use key",
  apiKey: "API key", noResults: "No matching entities", waiting: "Reading the index…", mapping: "seconds",
  methodHelp: {
    global: "global: map-reduce over community reports (themes of the whole corpus)",
    local: "local: an entity's neighbourhood (specific people, places, things)",
    drift: "drift: reports first, then local follow-up questions",
    basic: "basic: vector search over source text (baseline)",
    text: "text: map-reduce over all source text (baseline)",
    lazy: "lazy: the chat model rates source text for relevance, spending the budget best communities first (LazyGraphRAG)",
  } as Record<string, string>,
  truncatedGraph: "the best connected nodes are shown",
  rootIntroLazy: "The broadest communities of the concept graph, each named by its most frequent concepts. Open one to see its concepts and source text and drill down.",
  lazyNotice: "This is a lazy index: its concepts and their co-occurrences were found without an LLM, and its communities have no reports.",
  lazyAnswers: (method: string): string => `Questions are answered by ${method} search, which reads the source text when asked.`,
  concepts: "Concepts", concept: "Concept", conceptsSize: "concepts", cooccurrences: "Co-occurrences",
  frequency: "frequency", backToCommunity: "Community view", searchConcepts: "Search concepts",
  noReportsToRead: "this lazy index has no community reports for it to read",
  budget: "Budget", budgetDefault: "default", budgetHelp: "relevance tests of source text by the chat model, all spent: more tests read more of the corpus and of the passages linked to what was found, at more calls and seconds (with a small model a passage that closely matches the question counts too; with lazy.tester: embedding tests are free and the budget buys nothing)",
  unitsTested: "units tested", relevant: "relevant",
};
type Strings = typeof en;
const zh: Strings = {
  explore: "浏览", ask: "提问", searchEntities: "搜索实体", loading: "加载中…",
  rootThemes: "顶层主题", rootIntro: "图谱中范围最广的社区。打开一个社区阅读报告并逐层深入。",
  rating: "评分", size: "个实体", subCommunities: "子社区", noSub: "没有子社区：这是叶子社区。",
  report: "报告", findings: "发现", entities: "实体", relationships: "关系",
  sources: "原文片段", claims: "声明", graphView: "图谱视图", backToReport: "报告视图",
  level: "层级", community: "社区", noReport: "这个社区没有报告。",
  entity: "实体", relationship: "关系", source: "原文", claim: "声明",
  communities: "所属社区", allCommunities: "个社区", document: "文档", weight: "权重", degree: "度", type: "类型",
  showing: "显示", of: "/", question: "问题", method: "方法", askButton: "提问", asking: "正在回答…",
  dynamic: "动态社区选择", answer: "回答", cited: "引用的记录", usage: "用量",
  calls: "次模型调用", tokens: "个词元", searchGraph: "查找节点", nodes: "个节点", edges: "条边",
  openEntity: "打开实体", openRelationship: "打开关系", legend: "子社区",
  notFound: "未找到", error: "错误", keyNeeded: "此服务器需要 API 密钥。", keySave: "使用密钥",
  apiKey: "API 密钥", noResults: "没有匹配的实体", waiting: "正在阅读索引…", mapping: "秒",
  methodHelp: {
    global: "global（全局）：对社区报告做 map-reduce（整个语料的主题）",
    local: "local（局部）：实体的邻域（具体的人、地点、事物）",
    drift: "drift：先看报告，再做局部追问",
    basic: "basic：对原文的向量检索（基线）",
    text: "text：对全部原文做 map-reduce（基线）",
    lazy: "lazy（惰性）：由模型给原文片段的相关性打分，从最相关的社区开始用完预算（LazyGraphRAG）",
  },
  truncatedGraph: "仅显示连接最多的节点",
  rootIntroLazy: "概念图谱中范围最广的社区，以其中出现最多的概念命名。打开一个社区查看它的概念和原文并逐层深入。",
  lazyNotice: "这是一个惰性索引：概念及其共现关系由自然语言处理得到，没有调用大模型，社区没有报告。",
  lazyAnswers: (method: string): string => `问题由 ${method} 检索回答，提问时才阅读原文。`,
  concepts: "概念", concept: "概念", conceptsSize: "个概念", cooccurrences: "共现关系",
  frequency: "频次", backToCommunity: "社区视图", searchConcepts: "搜索概念",
  noReportsToRead: "这个惰性索引没有可供它阅读的社区报告",
  budget: "预算", budgetDefault: "默认", budgetHelp: "由对话模型做的原文片段相关性检验次数，全部用完：次数越多，读到的语料及与已找到内容相关联的片段越多，调用和耗时也越多（小模型时，与问题高度匹配的片段也算相关；lazy.tester: embedding 时检验不调用模型，预算不起作用）",
  unitsTested: "个片段已检验", relevant: "个相关",
};

let current: Strings = en;
export let lang: "en" | "zh" = "en";

export function setLang(l: "en" | "zh"): void {
  lang = l;
  current = l === "zh" ? zh : en;
  document.documentElement.lang = l === "zh" ? "zh-CN" : "en";
  localStorage.setItem("sg-lang", l);
  document.querySelectorAll<HTMLElement>("[data-i18n]").forEach((el) => {
    el.textContent = String(current[el.dataset.i18n as keyof Strings]);
  });
  document.querySelectorAll<HTMLInputElement>("[data-i18n-placeholder]").forEach((el) => {
    el.placeholder = String(current[el.dataset.i18nPlaceholder as keyof Strings]);
  });
}

export function initialLang(indexLanguage: string): "en" | "zh" {
  const saved = localStorage.getItem("sg-lang");
  if (saved === "en" || saved === "zh") return saved;
  if (indexLanguage === "zh") return "zh";
  return navigator.language.toLowerCase().startsWith("zh") ? "zh" : "en";
}

export function t<K extends keyof Strings>(key: K): Strings[K] {
  return current[key];
}
