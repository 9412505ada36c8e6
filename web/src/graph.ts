// The graph view: a community's entities and relationships as an interactive network, drawn by
// cytoscape with the fCoSE force-directed layout. Loaded as a separate chunk on first use.
import cytoscape from "cytoscape";
// @ts-ignore: cytoscape-fcose ships no type declarations
import fcose from "cytoscape-fcose";

cytoscape.use(fcose);

export interface GraphNode { ref: number; title: string; type: string; degree: number; description: string; group: number | null }
export interface GraphEdge { ref: number; source: number; target: number; weight: number | null; description: string }
export interface GraphData { nodes: GraphNode[]; edges: GraphEdge[] }

// Colour-blind friendly categorical palette (Okabe-Ito + Tableau), cycled for many groups.
export const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
  "#4E79A7", "#F28E2B", "#59A14F", "#B07AA1", "#76B7B2", "#EDC948", "#FF9DA7", "#9C755F", "#BAB0AC"];
const UNGROUPED = "#8a94a6";

export interface DrawOptions {
  container: HTMLElement;
  data: GraphData;
  groupColour: Map<number, string>;
  onNode(node: GraphNode): void;
  onEdge(edge: GraphEdge): void;
}

export interface DrawnGraph {
  search(text: string): number;
  focus(ref: number): void;
  destroy(): void;
  ready: Promise<void>;
}

export function draw(opts: DrawOptions): DrawnGraph {
  const { data } = opts;
  const maxDegree = Math.max(1, ...data.nodes.map((n) => n.degree || 0));
  const maxWeight = Math.max(1, ...data.edges.map((e) => e.weight || 0));
  const byRef = new Map(data.nodes.map((n) => [n.ref, n]));
  const edgeByRef = new Map(data.edges.map((e) => [e.ref, e]));
  const elements: cytoscape.ElementDefinition[] = [
    ...data.nodes.map((n) => ({
      group: "nodes" as const,
      data: {
        id: `n${n.ref}`, ref: n.ref, label: n.title,
        // sized by degree: area grows with degree, so the sqrt keeps hubs from swamping the view
        size: 14 + 46 * Math.sqrt((n.degree || 0) / maxDegree),
        // hubs get bigger labels, so zoomed out only their names are legible (min-zoomed-font-size)
        fontSize: 8 + 8 * Math.sqrt((n.degree || 0) / maxDegree),
        colour: n.group === null ? UNGROUPED : opts.groupColour.get(n.group) || UNGROUPED,
      },
    })),
    ...data.edges.map((e) => ({
      group: "edges" as const,
      data: { id: `e${e.ref}`, ref: e.ref, source: `n${e.source}`, target: `n${e.target}`,
              width: 1 + 4 * ((e.weight || 0) / maxWeight) },
    })),
  ];
  const big = data.nodes.length > 400;
  const cy = cytoscape({
    container: opts.container,
    elements,
    minZoom: 0.05,
    maxZoom: 4,
    wheelSensitivity: 0.3,
    textureOnViewport: big, // cheaper pan/zoom on big graphs
    hideEdgesOnViewport: big,
    style: [
      { selector: "node", style: {
        width: "data(size)", height: "data(size)", "background-color": "data(colour)", label: "data(label)",
        "font-size": "data(fontSize)", "min-zoomed-font-size": 9, "text-valign": "bottom", "text-margin-y": 3,
        color: "#1f2430", "text-outline-color": "#fff", "text-outline-width": 2, "border-width": 1, "border-color": "#fff",
      } },
      { selector: "edge", style: {
        width: "data(width)", "line-color": "#b9c0cc", "curve-style": "haystack", opacity: 0.7,
      } },
      { selector: ".faded", style: { opacity: 0.12 } },
      { selector: "node.match", style: { "border-width": 4, "border-color": "#111", "z-index": 10 } },
      { selector: "node:selected", style: { "border-width": 4, "border-color": "#d62728" } },
      { selector: "edge:selected", style: { "line-color": "#d62728", opacity: 1 } },
    ],
  });
  cy.on("tap", "node", (ev) => opts.onNode(byRef.get(ev.target.data("ref"))!));
  cy.on("tap", "edge", (ev) => opts.onEdge(edgeByRef.get(ev.target.data("ref"))!));

  const ready = new Promise<void>((resolve) => {
    const layout = cy.layout({
      name: "fcose",
      // draft quality (spectral placement only, then a short force pass) keeps big graphs quick
      quality: data.nodes.length > 300 ? "draft" : "default",
      randomize: true, animate: false, fit: true, padding: 30,
      nodeRepulsion: () => 6000, idealEdgeLength: () => 60, nodeSeparation: 40,
      packComponents: true,
    } as cytoscape.LayoutOptions);
    layout.one("layoutstop", () => {
      // resolve after the first frame painted with final positions
      requestAnimationFrame(() => requestAnimationFrame(() => resolve()));
    });
    layout.run();
  });

  return {
    ready,
    search(text: string): number {
      const q = text.trim().toLowerCase();
      cy.elements().removeClass("faded match");
      if (!q) return 0;
      const hits = cy.nodes().filter((n) => String(n.data("label")).toLowerCase().includes(q));
      cy.elements().not(hits).not(hits.connectedEdges()).addClass("faded");
      hits.addClass("match");
      return hits.length;
    },
    focus(ref: number): void {
      const n = cy.getElementById(`n${ref}`);
      if (n.empty()) return;
      cy.elements().unselect();
      n.select();
      cy.animate({ center: { eles: n }, zoom: Math.max(cy.zoom(), 1.2) }, { duration: 300 });
    },
    destroy: () => cy.destroy(),
  };
}
