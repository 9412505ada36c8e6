// Builds the explorer into ../sensegraph/server/static (committed, so `pip install` needs no npm).
// The graph view (cytoscape + fcose) is a separate chunk, loaded only when a graph is opened,
// so the first page load carries only the small app code.
import { build } from "esbuild";
import { cpSync, mkdirSync, rmSync, readdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "sensegraph", "server", "static");
rmSync(out, { recursive: true, force: true });
mkdirSync(join(out, "assets"), { recursive: true });

await build({
  entryPoints: [join(here, "src", "main.ts")],
  outdir: join(out, "assets"),
  bundle: true,
  splitting: true,
  format: "esm",
  minify: true,
  target: ["es2020"],
  entryNames: "[name]",
  chunkNames: "chunk-[hash]",
  legalComments: "linked",
  logLevel: "warning",
});
cpSync(join(here, "src", "index.html"), join(out, "index.html"));
cpSync(join(here, "src", "style.css"), join(out, "assets", "style.css"));

let total = 0;
for (const f of readdirSync(join(out, "assets"))) total += statSync(join(out, "assets", f)).size;
console.log(`built ${out} (${(total / 1024).toFixed(0)} KiB of assets)`);
