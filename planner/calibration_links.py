"""Link figures fitted on a calibration's measured collectives (`paraplan calibrate`): one
bandwidth and step latency for the cost model's collectives (`cost/comm.py`), and each
collective kind's own, in log error."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from .calibration import CollectivePoint, KindLink
from .cost.comm import AxisLink, CollectiveKind, Collectives
from .hardware import get_accelerator


def fit_links(points: Sequence[CollectivePoint]) -> tuple[float, float]:
    """(intra-node bandwidth in bytes/s, latency in s) for which the cost model's collectives
    (`cost/comm.py`, one node) best match the measured points, in log error.

    The model's time is linear in 1/bandwidth and latency (`a / bw + b * latency`, the
    coefficients read off the model itself). The two unknowns minimize the squared error of
    log(predicted / measured): symmetric, where a relative error would count a 4x
    under-prediction (-75%) as smaller than a 2x over-prediction (+100%) and drive the
    latency to zero when some collective kinds are much faster than others (gloo's
    send/recv against its all-reduce). A log grid, refined twice around its best point."""
    if not points:
        raise ValueError("no collective measurements to fit link figures on")
    rows = []
    for p in points:
        a = collective_model_s(p, bw=1.0, lat=0.0)
        b = collective_model_s(p, bw=1e30, lat=1.0)
        rows.append((a, b, math.log(p.seconds)))

    def loss(inv_bw: float, lat: float) -> float:
        return sum((math.log(a * inv_bw + b * lat + 1e-30) - y) ** 2 for a, b, y in rows)

    lo_bw, hi_bw, lo_lat, hi_lat = -14.0, -5.0, -9.0, -1.0  # log10 of 1/bw and of latency
    best = (1e-9, 0.0)
    for _ in range(3):
        steps = 40
        grid = [
            (10 ** (lo_bw + i * (hi_bw - lo_bw) / steps), lat)
            for i in range(steps + 1)
            for lat in [0.0]
            + [10 ** (lo_lat + j * (hi_lat - lo_lat) / steps) for j in range(steps + 1)]
        ]
        best = min(grid, key=lambda x: loss(*x))
        span_bw, span_lat = (hi_bw - lo_bw) / 8, (hi_lat - lo_lat) / 8
        c_bw = math.log10(best[0])
        c_lat = math.log10(best[1]) if best[1] > 0 else lo_lat
        lo_bw, hi_bw = c_bw - span_bw, c_bw + span_bw
        lo_lat, hi_lat = c_lat - span_lat, c_lat + span_lat
    inv_bw, lat = _gauss_newton(rows, *best)
    return 1.0 / max(inv_bw, 1e-14), max(lat, 1e-9)  # the grid's fastest link at most


def _gauss_newton(
    rows: Sequence[tuple[float, float, float]], inv_bw: float, lat: float
) -> tuple[float, float]:
    """Polish the grid's best point: Gauss-Newton steps on the log residuals (kept
    non-negative; a step that does not lower the loss ends it)."""

    def loss(x0: float, x1: float) -> float:
        return sum((math.log(a * x0 + b * x1 + 1e-30) - y) ** 2 for a, b, y in rows)

    current = loss(inv_bw, lat)
    for _ in range(50):
        jaa = jab = jbb = ga = gb = 0.0
        for a, b, y in rows:
            pred = a * inv_bw + b * lat + 1e-30
            r, da, db = math.log(pred) - y, a / pred, b / pred
            jaa, jab, jbb = jaa + da * da, jab + da * db, jbb + db * db
            ga, gb = ga + da * r, gb + db * r
        det = jaa * jbb - jab * jab
        if det <= 0:
            break
        x0 = max(inv_bw - (jbb * ga - jab * gb) / det, 0.0)
        x1 = max(lat - (jaa * gb - jab * ga) / det, 0.0)
        new = loss(x0, x1)
        if new >= current:
            break
        inv_bw, lat, current = x0, x1, new
    return inv_bw, lat


def fit_kind_links(points: Sequence[CollectivePoint], bw: float) -> tuple[KindLink, ...]:
    """Each collective kind's own link, fitted on its own points in log error (`fit_links`):
    bandwidth and latency where the kind has points at two sizes or more, else its latency on
    links of `bw` (the shared fit)."""
    out = []
    for kind in CollectiveKind:
        mine = [p for p in points if p.kind == kind]
        if len({p.nbytes for p in mine}) >= 2:
            kind_bw, lat = fit_links(mine)
            out.append(KindLink(kind=kind, bw_bytes_per_s=kind_bw, latency_s=lat))
        elif mine:
            out.append(KindLink(kind=kind, bw_bytes_per_s=bw, latency_s=_latency_on(mine, bw)))
    return tuple(out)


def _latency_on(points: Sequence[CollectivePoint], bw: float) -> float:
    """The step latency that best fits `points` on links of `bw`, in log error."""
    rows = []
    for p in points:
        a = collective_model_s(p, bw=bw, lat=0.0)
        b = collective_model_s(p, bw=1e30, lat=1.0)
        rows.append((a, b, math.log(p.seconds)))

    def loss(lat: float) -> float:
        return sum((math.log(a + b * lat + 1e-30) - y) ** 2 for a, b, y in rows)

    lo, hi, best = -9.0, -1.0, 0.0
    for _ in range(3):
        grid = [0.0] + [10 ** (lo + j * (hi - lo) / 40) for j in range(41)]
        best = min(grid, key=loss)
        center = math.log10(best) if best > 0 else lo
        lo, hi = center - (hi - lo) / 8, center + (hi - lo) / 8
    return best


_TINY_LAT = 1e-30


def collective_model_s(p: CollectivePoint, *, bw: float, lat: float) -> float:
    """Seconds the cost model (`cost/comm.py`, one node) gives the measured collective `p`
    on links of `bw` bytes/s and `lat` seconds per step."""
    base = get_accelerator("cpu")
    acc = dataclasses.replace(
        base, intra_node_bw_bytes_per_s=bw, intra_node_latency_s=max(lat, _TINY_LAT)
    )
    coll = Collectives(acc)
    link = AxisLink(p.ranks, p.ranks, 1)
    if p.kind == CollectiveKind.ALL_REDUCE:
        return coll.all_reduce(p.nbytes, link)
    if p.kind == CollectiveKind.ALL_GATHER:
        return coll.all_gather(p.nbytes, link)
    if p.kind == CollectiveKind.REDUCE_SCATTER:
        return coll.reduce_scatter(p.nbytes, link)
    if p.kind == CollectiveKind.ALL_TO_ALL:
        return coll.all_to_all(p.nbytes, link)
    return coll.p2p(p.nbytes, cross_node=False)
