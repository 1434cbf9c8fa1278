"""Integer arithmetic the search needs: divisors of GPU counts, batches and expert counts."""

from __future__ import annotations


def prime_factors(n: int) -> dict[int, int]:
    """The prime factorization of `n >= 1` as {prime: exponent}, by trial division up to
    sqrt(n) (at most ~1e6 divisions for n up to 1e12)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive integer to factorize")
    factors: dict[int, int] = {}
    d = 2
    while d * d <= n:
        while n % d == 0:
            factors[d] = factors.get(d, 0) + 1
            n //= d
        d += 1 if d == 2 else 2  # 2, then odd candidates only
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """Every positive divisor of `n >= 1`, ascending, built from its prime factorization."""
    out = [1]
    for prime, exponent in prime_factors(n).items():
        out = [d * prime**k for d in out for k in range(exponent + 1)]
    return sorted(out)
