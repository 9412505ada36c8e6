"""Persistent answer cache: one SQLite file inside the project root.

SQLite in WAL mode gives atomic writes and safe sharing between threads, tasks and processes
(two `sensegraph` runs on one project share it) with nothing to install. Keys are sha256 hashes
of everything that changes an answer, so a repeated call is a lookup and costs no request.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any


MAX_REJECTED = 1000  # rejected answers kept (a few kB each)


def cache_key(kind: str, payload: dict[str, Any]) -> str:
    blob = json.dumps({"kind": kind, **payload}, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class Cache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=60, check_same_thread=False, isolation_level=None)
        self._wal(deadline=time.monotonic() + 60)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS rejected (at REAL, model TEXT, step TEXT, item TEXT, "
                         "reason TEXT, reply TEXT)")

    def _wal(self, deadline: float) -> None:
        # Switching a fresh file to WAL takes an exclusive lock, and SQLite answers "database is
        # locked" at once, without its busy handler, when another process is opening the same
        # new file (two runs started together on one project). Once one has switched, the mode
        # is stored in the file and the others read it; so wait and ask again.
        pause = 0.005
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM answers WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO answers (key, value) VALUES (?, ?)", (key, value))

    def get_json(self, key: str) -> Any | None:
        raw = self.get(key)
        return None if raw is None else json.loads(raw)

    def put_json(self, key: str, value: Any) -> None:
        self.put(key, json.dumps(value, ensure_ascii=False).encode("utf-8"))

    def reject(self, *, model: str, step: str, item: str, reason: str, reply: str) -> None:
        """Keep an answer the client could not use (not valid for its schema, cut off at
        max_tokens, empty), for `sensegraph doctor --rejected`: the only place a retried answer's
        text is seen. The newest MAX_REJECTED are kept."""
        with self._lock:
            self._db.execute("INSERT INTO rejected VALUES (?, ?, ?, ?, ?, ?)",
                             (time.time(), model, step, item, reason, reply))
            self._db.execute("DELETE FROM rejected WHERE rowid <= (SELECT MAX(rowid) FROM rejected) - ?",
                             (MAX_REJECTED,))

    def rejected(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest `limit` rejected answers, newest first."""
        with self._lock:
            rows = self._db.execute("SELECT at, model, step, item, reason, reply FROM rejected "
                                    "ORDER BY rowid DESC LIMIT ?", (limit,)).fetchall()
        return [dict(zip(("at", "model", "step", "item", "reason", "reply"), r)) for r in rows]

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
