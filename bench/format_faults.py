"""A whole index through a server that fails structured output with a 500, on the real embedded model.

Some OpenAI-compatible servers answer a `response_format: json_schema` request they cannot serve
with HTTP 500 instead of 400 (vLLM's guided decoding: vllm-project/vllm#8429, #13260), while
plain and JSON-mode requests work. This starts the embedded llama.cpp server, puts a small HTTP
proxy on 127.0.0.1 in front of it that answers every json_schema request with a 500 and forwards
the rest (adding the embedded default's repeat penalty, which `provider: openai` does not send),
and runs `sensegraph index` of the packaged demo corpus against the proxy in a child process.
Printed: wall time, exit code, what the proxy saw (500s given, requests forwarded by mode), what
the run logged about structured output, and the index's entities, relationships and reports.
`--passthrough` forwards json_schema requests too (the same run on a well-behaved server).

    python bench/format_faults.py                      # 0.5B: a few minutes on 2 cores
    python bench/format_faults.py --passthrough
    python bench/format_faults.py --code /tmp/before   # another checkout's code (before/after)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "sensegraph" / "demo"


def start_proxy(upstream: str, fail_schema: bool) -> tuple[ThreadingHTTPServer, Counter]:
    """A proxy to `upstream` (the server's root, no /v1) on a free port of 127.0.0.1."""
    seen: Counter = Counter()
    client = httpx.Client(timeout=600)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _reply(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            r = client.get(upstream + self.path)
            self._reply(r.status_code, r.content, r.headers.get("content-type", "application/json"))

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw or b"{}")
            mode = (body.get("response_format") or {}).get("type") or "none"
            if self.path.endswith("/chat/completions"):
                if fail_schema and mode == "json_schema":
                    seen["json_schema answered 500"] += 1
                    self._reply(500, json.dumps({"error": {"message": "Internal Server Error",
                                                           "type": "server_error"}}).encode())
                    return
                seen[f"{mode} forwarded"] += 1
                body.setdefault("repeat_penalty", 1.15)  # as `provider: local` sends it
                body.setdefault("repeat_last_n", 1024)
            r = client.post(upstream + self.path, json=body)
            self._reply(r.status_code, r.content, r.headers.get("content-type", "application/json"))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="0.5b", choices=("0.5b", "1.5b"))
    ap.add_argument("--passthrough", action="store_true", help="forward json_schema requests too")
    ap.add_argument("--code", help="run the index with the sensegraph of this checkout")
    ap.add_argument("--keep", help="make the project in this folder and keep it")
    args = ap.parse_args()

    from sensegraph.config import LocalModelSettings
    from sensegraph.llm.embedded import ensure_server

    base_url, alias = ensure_server(LocalModelSettings(size=args.size, parallel=2))
    proxy, seen = start_proxy(base_url.removesuffix("/v1"), fail_schema=not args.passthrough)
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="sg-format-faults-"))
    (folder / "input").mkdir(parents=True, exist_ok=True)
    for doc in sorted(DEMO.glob("*.txt")):
        shutil.copy(doc, folder / "input" / doc.name)
    (folder / "settings.yaml").write_text(
        f"chat:\n  provider: openai\n  base_url: http://127.0.0.1:{proxy.server_address[1]}/v1\n"
        f"  model: {alias}\n  api_key: none\n  concurrency: 2\nembedding:\n  provider: local\n", encoding="utf-8")
    env = dict(os.environ)
    if args.code:
        env["PYTHONPATH"] = args.code + os.pathsep + env.get("PYTHONPATH", "")
    log = folder / "index.log"
    t0 = time.perf_counter()
    with log.open("w") as out:
        # (run in the project folder: `python -c` puts its working directory first on sys.path,
        # and from this checkout that would import this checkout's code whatever --code says)
        rc = subprocess.call([sys.executable, "-c", "import sys; from sensegraph.cli import main; sys.exit(main())",
                              "index", "-r", str(folder)], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    wall = time.perf_counter() - t0
    proxy.shutdown()

    print(f"{args.size}, {'well-behaved server' if args.passthrough else '500 to every json_schema request'}"
          f"{', code of ' + args.code if args.code else ''}: exit code {rc}, {wall:.0f} s")
    for key, n in sorted(seen.items()):
        print(f"  proxy: {key}: {n}")
    text = log.read_text(encoding="utf-8", errors="replace")
    said = [line.strip() for line in text.splitlines()
            if any(w in line for w in ("structured output", "outage", "out;", "failed", "Error"))]
    for line in said[:8]:
        print(f"  log: {line[:160]}")
    out_dir = folder / "output"
    for table in ("entities", "relationships", "community_reports"):
        path = out_dir / f"{table}.parquet"
        print(f"  {table}: {len(pd.read_parquet(path)) if path.exists() else 'none'}")
    print(f"  project: {folder}")


if __name__ == "__main__":
    main()
