// Calls to the server's JSON API, with the API key (if one was entered) on every request.
export class AuthError extends Error {}
export class NotFound extends Error {}

const KEY = "sg-key";
export const apiKey = {
  get: (): string => sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || "",
  set: (k: string): void => localStorage.setItem(KEY, k),
};

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const k = apiKey.get();
  return k ? { ...extra, "X-API-Key": k } : extra;
}

async function check(r: Response): Promise<Response> {
  if (r.status === 401) throw new AuthError("API key required");
  if (r.status === 404) throw new NotFound((await r.json().catch(() => ({}))).detail || "not found");
  if (!r.ok) throw new Error(`${r.status}: ${(await r.text()).slice(0, 300)}`);
  return r;
}

const cache = new Map<string, Promise<unknown>>();

// Records never change while the server runs, so each is fetched once per page.
export function get<T = any>(path: string): Promise<T> {
  let p = cache.get(path) as Promise<T> | undefined;
  if (!p) {
    p = fetch(path, { headers: headers() }).then(check).then((r) => r.json() as Promise<T>);
    p.catch(() => cache.delete(path));
    cache.set(path, p);
  }
  return p;
}

export interface StreamHandlers {
  token(text: string): void;
  result(result: any): void;
  error(message: string): void;
}

/** POST /api/query with stream=true, reading the server-sent events as they arrive. */
export async function askStream(body: Record<string, unknown>, on: StreamHandlers, signal?: AbortSignal): Promise<void> {
  const r = await check(await fetch("/api/query", {
    method: "POST", signal, headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify({ ...body, stream: true }),
  }));
  const reader = r.body!.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut: number;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (!data.length) continue; // a keep-alive comment
      const payload = JSON.parse(data.join("\n"));
      if (event === "token") on.token(payload.text);
      else if (event === "result") on.result(payload);
      else if (event === "error") on.error(payload.message);
    }
  }
}
