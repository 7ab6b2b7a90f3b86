"""What a KV cache saves: key projections counted, and time per generated token.

    python benchmarks/bench_kv.py

Prints the README's tables: measured key projections per layer for naive and cached greedy
generation against the closed forms, seconds per token naive against cached, and one
teacher-forced pass over k drafted positions against k sequential one-token steps. Times are
the best of three on this machine (the first call of each shape compiles and is not timed).
"""

from specsample.models import transformer as tr


def main():
    small = tr.Transformer.create(0, vocab=32, width=32, layers=2, heads=2, max_len=64)
    print("| T | k | naive measured | k T + k(k-1)/2 | cached measured | T + k - 1 | ratio |")
    print("|---|---|---|---|---|---|---|")
    for t, k in [(1, 8), (4, 8), (8, 4), (8, 16), (2, 32), (16, 32)]:
        ctx = [i % 32 for i in range(t)]
        a, b = tr.generate_naive(small, ctx, k), tr.generate_cached(small, ctx, k)
        assert a.tokens == b.tokens
        print(f"| {t} | {k} | {a.keys_per_layer} | {tr.n_naive(t, k)} | {b.keys_per_layer} | {tr.n_cached(t, k)} | "
              f"{a.keys_per_layer / b.keys_per_layer:.1f} |")
    model = tr.Transformer.create(0, vocab=32, width=64, layers=2, heads=4, max_len=320)
    print("\n| T | k | naive ms/token | cached ms/token | naive / cached |")
    print("|---|---|---|---|---|")
    for t, k in [(16, 16), (64, 16), (256, 16), (16, 64), (64, 64), (256, 64)]:
        r = tr.time_generation(model, t, k)
        print(f"| {t} | {k} | {r['naive_s_per_token'] * 1e3:.3f} | {r['cached_s_per_token'] * 1e3:.3f} | "
              f"{r['naive_s_per_token'] / r['cached_s_per_token']:.1f} |")
    print("\n| T | k | one pass over k positions (ms) | k one-token steps (ms) | steps / pass |")
    print("|---|---|---|---|---|")
    for k in (1, 4, 8, 16, 32):
        r = tr.time_verification(model, 64, k)
        print(f"| 64 | {k} | {r['one_pass_s'] * 1e3:.3f} | {r['sequential_s'] * 1e3:.3f} | "
              f"{r['sequential_s'] / r['one_pass_s']:.1f} |")


if __name__ == "__main__":
    main()
