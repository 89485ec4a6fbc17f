"""Stability regions in the complex ``z = η·λ`` plane, vectorised over grids.

The tools, vectorised over arbitrary arrays of z:

- :func:`stable_mask` — the Schur–Cohn test: exact classification "all roots strictly inside the unit
  disk", ``O(n²)`` array operations per grid for a degree-n characteristic polynomial (no eigenvalues).
- :func:`region_mask` — the boundary-locus method on a rectangular grid: by the argument principle
  the number of roots inside the circle ``|r| = ρ`` is ``N_in(B) + W(z)``, where ``W(z)`` is the winding
  number of the closed curve ``z_ρ(θ) = −A(ρe^{iθ})/B(ρe^{iθ})`` around z (because
  ``P(ρe^{iθ}; z) = B(ρe^{iθ})·(z − z_ρ(θ))``). ``W`` is rasterised for the whole grid at once by
  counting signed crossings of the curve with each grid row (a cumulative sum along the row), so the
  cost is that of sampling the curve plus one pass over the grid. Stable ⟺ ``W(z) = n − N_in(B)``.
- :func:`spectral_radius` — the largest root modulus, from batched eigenvalues of the stacked companion
  matrices (``numpy.linalg.eigvals`` on a ``(..., n, n)`` array; one LAPACK call loop in C).
- :func:`boundary_locus` — the curve ``z(θ) = −A(e^{iθ})/B(e^{iθ})`` on which some root has modulus 1.
  The region's boundary is part of it (the rest is where a root crosses while another is outside).
- :func:`region_area` — the area of a region, exactly, by Green's theorem on the boundary locus (each
  arc weighted by whether the region lies on its left or its right, decided by Schur–Cohn).

Schur–Cohn step (for ``p(r) = Σ_k p_k r^(n−k)``, ``p_0 = 1``): p is Schur stable iff ``|p_n| < 1`` and
the degree-(n−1) polynomial ``q(r) = (p(r) − p_n·p*(r))/r`` is Schur stable, where
``p*(r) = r^n·conj(p(1/conj r))`` has coefficients ``conj(p_n), …, conj(p_0)``. Coefficient-wise
``q_k = p_k − p_n·conj(p_{n−k})`` for ``k = 0..n−1``; ``q`` is renormalised to be monic
(``q_0 = 1 − |p_n|² > 0``). Reference: I. Schur (1917), A. Cohn (1922); E. I. Jury, "Theory and
Application of the z-Transform Method" (1964), the Schur–Cohn–Jury criterion.

Example:
    >>> from pipelab.stability import gd
    >>> z = complex_grid((0.1, 1.9), (-0.9, 0.9), (5, 5))
    >>> int(stable_mask(gd(), z).sum())      # points of the 5×5 grid inside |1 − z| < 1
    13
"""

from __future__ import annotations

from typing import SupportsInt, cast

import numpy as np

from .methods import LinearMethod, char_poly, companion

__all__ = ["complex_grid", "stable_mask", "region_mask", "region_area", "spectral_radius", "boundary_locus",
           "schur_stable"]


def complex_grid(re: tuple[float, float], im: tuple[float, float], shape: tuple[int, int]) -> np.ndarray:
    """A rectangular grid ``z = x + i·y``, shape ``(n_im, n_re)`` (rows are Im z, as ``imshow`` wants).

    Args:
        re: (min, max) of Re z.
        im: (min, max) of Im z.
        shape: (n_im, n_re) points.
    """
    if (len(shape) != 2 or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) for n in shape)
            or min(shape) < 1):
        raise ValueError(f"shape must be two positive ints (n_im, n_re), got {shape}")
    for name, rng in (("re", re), ("im", im)):
        if len(rng) != 2 or not np.all(np.isfinite(np.asarray(rng, dtype=float))):
            raise ValueError(f"{name} must be a (min, max) pair of finite numbers, got {rng}")
    x = np.linspace(re[0], re[1], shape[1])
    y = np.linspace(im[0], im[1], shape[0])
    return x[None, :] + 1j * y[:, None]


def schur_stable(coeffs: np.ndarray) -> np.ndarray:
    """Schur–Cohn test on polynomials given by coefficients (highest power first, last axis).

    Args:
        coeffs: array ``(..., n+1)``, complex or real; the leading coefficient must be non-zero.

    Returns:
        boolean array ``(...)``: all roots strictly inside the unit circle.

    Example:
        >>> schur_stable(np.array([[1.0, -0.5], [1.0, -1.5]])).tolist()    # roots 0.5 and 1.5
        [True, False]
    """
    c = np.asarray(coeffs)
    if c.ndim == 0 or c.shape[-1] < 1:
        raise ValueError("coeffs must have a last axis of length n+1 >= 1")
    if c.dtype.kind not in "biufc":
        raise TypeError(f"coeffs must be numeric (real or complex), got dtype {c.dtype}")
    if not np.all(np.isfinite(c)):
        raise ValueError("coeffs must be finite; got NaN or inf")
    if np.any(c[..., 0] == 0):
        raise ValueError("leading coefficient must be non-zero")
    shape = c.shape[:-1]
    flat = c.reshape(-1, c.shape[-1])
    lead = flat[:, 0].astype(np.complex128)
    # One contiguous array per coefficient (rows), normalised to a monic polynomial.
    p = [np.ascontiguousarray(flat[:, k] / lead, dtype=np.complex128) for k in range(flat.shape[1])]
    ok = np.ones(flat.shape[0], dtype=bool)
    while len(p) > 1:
        n = len(p) - 1
        last = p[n]
        mod2 = last.real * last.real + last.imag * last.imag
        ok &= mod2 < 1.0
        # Rows already rejected are zeroed (inv = 0) so they cannot overflow later steps.
        inv = np.where(ok, 1.0 / np.where(ok, 1.0 - mod2, 1.0), 0.0)
        q = []
        for k in range(n):
            qk = np.conj(p[n - k])
            qk *= last
            np.subtract(p[k], qk, out=qk)
            qk *= inv
            q.append(qk)
        p = q
    return ok.reshape(shape)


def stable_mask(method: LinearMethod, z: complex | np.ndarray, *, radius: float = 1.0) -> np.ndarray:
    """Where the method converges: all characteristic roots strictly inside the unit disk (Schur–Cohn).

    With ``radius = ρ``: all roots inside ``|r| < ρ`` (the test applied to ``P(ρ·s; z)``, whose
    coefficients are ``p_k·ρ^(n−k)``, made monic: ``p_k·ρ^(−k)``).

    Args:
        method: the linearised optimizer.
        z: ``η·λ``, complex scalar or array of any shape (finite).
        radius: ρ > 0.

    Returns:
        boolean array of the shape of ``z``.

    Example:
        >>> from pipelab.stability import delayed_gd
        >>> stable_mask(delayed_gd(1), np.array([0.5, 0.99, 1.01])).tolist()
        [True, True, False]
    """
    radius = _check_radius(radius)
    p = char_poly(method, z)
    if radius != 1.0:
        p = p * radius ** -np.arange(p.shape[-1], dtype=np.float64)
    return schur_stable(p)


def _check_radius(radius: float) -> float:
    if isinstance(radius, bool) or not isinstance(radius, (int, float, np.integer, np.floating)):
        raise TypeError(f"radius must be a real number > 0, got {radius!r}")
    radius = float(radius)
    if not (np.isfinite(radius) and radius > 0):
        raise ValueError(f"radius must be a finite real number > 0, got {radius}")
    return radius


def spectral_radius(method: LinearMethod, z: complex | np.ndarray, *, chunk: int = 1 << 16) -> np.ndarray:
    """Largest modulus of the characteristic roots (= spectral radius of :func:`companion`).

    Batched eigenvalues of the stacked companion matrices, in chunks of ``chunk`` points.

    Args:
        method: the linearised optimizer.
        z: ``η·λ``, complex scalar or array.
        chunk: grid points per ``eigvals`` call (bounds memory).

    Returns:
        float array of the shape of ``z``.

    Example:
        >>> from pipelab.stability import gd
        >>> float(spectral_radius(gd(), 0.25))
        0.75
    """
    zz = np.asarray(z, dtype=np.complex128)
    flat = zz.reshape(-1)
    out = np.empty(flat.shape, dtype=np.float64)
    if method.order == 1:
        return np.abs(-char_poly(method, zz)[..., 1]).reshape(zz.shape)
    for start in range(0, flat.size, chunk):
        part = flat[start:start + chunk]
        out[start:start + chunk] = np.abs(np.linalg.eigvals(companion(method, part))).max(axis=-1)
    return out.reshape(zz.shape)


def boundary_locus(method: LinearMethod, theta: np.ndarray | int = 2048) -> np.ndarray:
    """The boundary-locus curve ``z(θ) = −A(e^{iθ}) / B(e^{iθ})``: z with a root at ``r = e^{iθ}``.

    Since ``P(r; z) = A(r) + z·B(r)`` is linear in z, every z for which some root lies on the unit circle
    is on this curve; the stable region is bounded by (parts of) it.

    Args:
        method: the linearised optimizer.
        theta: angles (array) or a number of equally spaced angles in ``[0, 2π]``.

    Returns:
        complex array of the shape of ``theta`` (``inf`` where ``B(e^{iθ}) = 0``).
    """
    if np.isscalar(theta):
        th = np.linspace(0.0, 2.0 * np.pi, int(cast(SupportsInt, theta)))
    else:
        th = np.asarray(theta, dtype=float)
    r = np.exp(1j * th)
    A = np.polyval(np.asarray(method.a), r)
    B = np.polyval(np.asarray(method.b), r)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(B != 0, -A / np.where(B != 0, B, 1.0), np.inf)


def _winding_raster(curve: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Winding number of the closed polygon ``curve`` around every point of the grid ``x × y``.

    Rule (crossing number with signs): an edge from ``(x0, y0)`` to ``(x1, y1)`` crosses the row ``y_j`` iff
    ``min(y0, y1) ≤ y_j < max(y0, y1)`` (half-open in y), at ``x_c`` on the edge; it adds +1 (upward edge)
    or −1 (downward) to the winding number of every grid point of that row with ``x_k < x_c``. The half-open
    rule counts a vertex lying exactly on a row once when the polygon passes through the row there and zero
    (or +1 − 1) times when it only touches it; horizontal edges cross nothing.

    Rows and columns are selected by comparing with the grid coordinates themselves (``searchsorted`` on
    the sorted ``x`` and ``y``), never with ``(y − y_0)/Δy`` recomputed in floating point: a vertex on a row
    (e.g. the locus crossing the real axis on a symmetric grid with an odd number of rows) would otherwise
    be skipped by one edge and rejected by the other, flipping the winding number of a whole row segment.
    """
    nx, ny = len(x), len(y)
    # work on ascending coordinates; flip the result back if the grid runs downwards
    xf, yf = x[0] > x[-1], y[0] > y[-1]
    xs, ys = (x[::-1] if xf else x), (y[::-1] if yf else y)
    p0, p1 = curve[:-1], curve[1:]
    x0, y0, x1, y1 = p0.real, p0.imag, p1.real, p1.imag
    # rows j with ylo <= y_j < yhi: j in [searchsorted(ylo, 'left'), searchsorted(yhi, 'left'))
    j0 = np.searchsorted(ys, np.minimum(y0, y1), side="left")
    j1 = np.searchsorted(ys, np.maximum(y0, y1), side="left")
    counts = np.maximum(j1 - j0, 0)
    total = int(counts.sum())
    w = np.zeros((ny, nx), dtype=np.int64)
    if total == 0:
        return w
    edge = np.repeat(np.arange(len(p0)), counts)
    start = np.repeat(np.cumsum(counts) - counts, counts)
    row = j0[edge] + (np.arange(total) - start)
    t = (ys[row] - y0[edge]) / (y1[edge] - y0[edge])
    xc = x0[edge] + t * (x1[edge] - x0[edge])
    # the crossing is to the right of the columns k < col (x_k < x_c)
    col = np.searchsorted(xs, xc, side="left")
    sign = np.where(y1[edge] > y0[edge], 1, -1)
    acc = np.bincount(row * (nx + 1) + col, weights=sign, minlength=ny * (nx + 1)).reshape(ny, nx + 1)
    # W[:, k] = Σ_{col > k} acc[:, col]
    rev = np.cumsum(acc[:, ::-1], axis=1)[:, ::-1]
    w = np.rint(rev[:, 1:]).astype(np.int64)
    if xf:
        w = w[:, ::-1]
    if yf:
        w = w[::-1, :]
    return w


def region_mask(method: LinearMethod, re: tuple[float, float], im: tuple[float, float], shape: tuple[int, int],
                *, radius: float = 1.0, n_theta: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Where all roots have modulus < ``radius``, on a rectangular grid, by the boundary-locus method.

    When ``B(r)`` vanishes on (or so near that the locus cannot be resolved to one grid cell inside the
    window) the circle ``|r| = ρ`` — e.g. PipeMare without correction at its default ρ = 0.5, where
    ``B(r) ∝ r^(τf−τb) + 1`` — the locus passes through infinity and the winding number is not defined;
    the mask is then computed point by point with the exact Schur–Cohn test (:func:`stable_mask`),
    which gives the same classification at ``O(n²)`` array operations per point instead of one pass.

    Args:
        method: the linearised optimizer.
        re, im, shape: the grid, as in :func:`complex_grid` (``shape = (n_im, n_re)``).
        radius: ρ; ``1.0`` gives the stability region, ``ρ < 1`` the region converging at least as fast
            as ``ρ^t``.
        n_theta: samples of the locus; default: enough that no edge reaching into the grid is longer than
            one grid cell (so only points within a small fraction of a cell of the boundary — the chords'
            sagitta — can be misclassified).

    Returns:
        ``(z, mask)``: the grid and the boolean mask, both of shape ``shape``.

    Example:
        >>> from pipelab.stability import gd
        >>> z, mask = region_mask(gd(), (0.1, 1.9), (-0.9, 0.9), (5, 5))
        >>> int(mask.sum())
        13
    """
    radius = _check_radius(radius)
    if n_theta is not None and (isinstance(n_theta, bool) or not isinstance(n_theta, (int, np.integer))
                                or n_theta < 3):
        raise ValueError(f"n_theta must be an integer >= 3 or None, got {n_theta!r}")
    z = complex_grid(re, im, shape)
    x, y = z[0, :].real, z[:, 0].imag
    b = np.trim_zeros(np.asarray(method.b), "f")
    roots_b = np.roots(b) if len(b) > 1 else np.zeros(0)
    if np.any(np.abs(np.abs(roots_b) - radius) <= 1e-9 * radius):
        return z, stable_mask(method, z, radius=radius)      # B = 0 on the circle: no locus
    n_in_b = int(np.sum(np.abs(roots_b) < radius))
    cell = min(abs(x[-1] - x[0]) / max(len(x) - 1, 1), abs(y[-1] - y[0]) / max(len(y) - 1, 1)) or 1.0
    xlo, xhi = min(x[0], x[-1]) - cell, max(x[0], x[-1]) + cell
    ylo, yhi = min(y[0], y[-1]) - cell, max(y[0], y[-1]) + cell

    def locus(m: int) -> np.ndarray:
        r = radius * np.exp(1j * np.linspace(0.0, 2.0 * np.pi, m + 1))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            c = -np.polyval(np.asarray(method.a), r) / np.polyval(np.asarray(method.b), r)
        c[-1] = c[0]  # exactly closed
        return c

    def longest_in_window(c: np.ndarray) -> float:
        """Longest edge whose bounding box meets the window (grown by a cell); inf if one is not finite."""
        p0, p1 = c[:-1], c[1:]
        meets = ((np.minimum(p0.real, p1.real) <= xhi) & (np.maximum(p0.real, p1.real) >= xlo)
                 & (np.minimum(p0.imag, p1.imag) <= yhi) & (np.maximum(p0.imag, p1.imag) >= ylo))
        if not np.all(np.isfinite(c)):
            return np.inf
        return float(np.abs(p1 - p0)[meets].max()) if meets.any() else 0.0

    m = int(n_theta) if n_theta is not None else 4096
    curve = locus(m)
    longest = longest_in_window(curve)
    if n_theta is None and longest > cell:
        needed = m * np.ceil(longest / cell) if np.isfinite(longest) else np.inf
        # B nearly vanishes on the circle when the locus cannot be resolved to a cell with 2²¹ samples
        if needed > 1 << 21:
            return z, stable_mask(method, z, radius=radius)
        curve = locus(int(needed))
    elif not np.isfinite(longest):
        return z, stable_mask(method, z, radius=radius)
    w = _winding_raster(curve, x, y)
    return z, w == (method.order - n_in_b)


def _reduce_power(method: LinearMethod, radius: float) -> tuple[LinearMethod, float]:
    """If ``P(r; z) = Q(r^g; z)`` with g > 1, return the method of Q and the radius ``ρ^g``.

    The locus of P on ``|r| = ρ`` is that of Q traced g times; roots of P are inside ``|r| < ρ`` iff those
    of Q are inside ``|s| < ρ^g``, so Q has the same region, with a locus traced once.
    """
    a, b = np.asarray(method.a), np.asarray(method.b)
    n = method.order
    used = [n - k for k in range(n + 1) if a[k] != 0.0 or b[k] != 0.0]
    g = int(np.gcd.reduce(np.asarray(used, dtype=np.int64))) if used else 1
    if g <= 1:
        return method, radius
    return LinearMethod(method.name, tuple(a[::g]), tuple(b[::g]), method.params), radius ** g


def region_area(method: LinearMethod, *, radius: float = 1.0, n_theta: int = 1 << 14, levels: int = 4,
                refine: int = 64) -> float:
    """Area of the region ``{z : all characteristic roots inside |r| < ρ}`` in the complex z-plane.

    Rule (Green's theorem on the boundary locus): the region S is open and bounded (``deg B < n``: for
    large ``|z|`` some root goes to infinity) and its boundary lies on the locus ``z(θ) = −A(ρe^{iθ})/
    B(ρe^{iθ})``. Cut the locus into short arcs; an arc is part of ∂S, oriented with S on its left, when
    S lies on exactly one side of it, so

        area(S) = ∮_{∂S} x dy = Σ_arcs (s_left − s_right) · ∫_arc Re z(θ) · Im z'(θ) dθ,

    where ``s_left``, ``s_right`` ∈ {0, 1} say whether a point just left / right of the arc is in S (the
    exact Schur–Cohn test, :func:`stable_mask`) and the integral is 4-point Gauss–Legendre on the exact
    curve (``z'(θ) = −i·r·(A'B − AB')/B²``), not the chord. Arcs where the weight ``s_left − s_right``
    changes (self-intersections of the locus, where the boundary of S leaves it) are subdivided
    ``refine``-fold, ``levels`` times, so the switch is located to ``2π/(n_theta·refine^levels)`` in θ.
    Arcs through a pole of z(θ) (``B = 0`` on the circle) lie outside the bounded region on both sides
    and weigh 0. A locus traced g times because ``P(r) = Q(r^g)`` is reduced to Q first; other loci traced
    several times over (not produced by the builders of :mod:`.methods`) would count their arcs repeatedly.

    Accuracy: for the builders' regions the result agrees with closed forms to ~1e−9 relative or better
    (plain GD: π; delayed GD τ = 1: ``π − 3√3/2``; heavy-ball: ``π(1 − β²)``; tested).

    Args:
        method: the linearised optimizer.
        radius: ρ > 0 (``1.0``: the stability region).
        n_theta: initial number of arcs (uniform in θ), ≥ 16.
        levels: refinement rounds at weight changes (≥ 0).
        refine: subdivision factor per round (≥ 2).

    Returns:
        the area (0.0 when the region is empty).

    Example:
        >>> from pipelab.stability import gd, delayed_gd
        >>> round(region_area(gd()), 9)                # the disk |1 − z| < 1
        3.141592654
        >>> round(region_area(delayed_gd(1)), 9)       # π − 3√3/2
        0.543516442
    """
    radius = _check_radius(radius)
    for name, val, least in (("n_theta", n_theta, 16), ("levels", levels, 0), ("refine", refine, 2)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {val!r}")
    method, radius = _reduce_power(method, radius)
    a, b = np.asarray(method.a), np.asarray(method.b)
    da, db = np.polyder(a), np.polyder(b)
    nodes, weights = np.polynomial.legendre.leggauss(4)

    def curve(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = radius * np.exp(1j * theta)
        A, B = np.polyval(a, r), np.polyval(b, r)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            z = -A / B
            dz = -(np.polyval(da, r) * B - A * np.polyval(db, r)) / (B * B) * (1j * r)
        return z, dz

    theta = np.linspace(0.0, 2.0 * np.pi, int(n_theta) + 1)
    for level in range(int(levels) + 1):
        ta, tb = theta[:-1], theta[1:]
        h = tb - ta
        zq, dzq = curve(0.5 * (ta + tb)[:, None] + 0.5 * h[:, None] * nodes)
        with np.errstate(invalid="ignore", over="ignore"):
            term = 0.5 * h * np.sum(weights * zq.real * dzq.imag, axis=1)
        z_ends = curve(theta)[0]
        chord = z_ends[1:] - z_ends[:-1]
        mid = curve(0.5 * (ta + tb))[0]
        ok = np.isfinite(term) & np.isfinite(mid) & np.isfinite(chord) & (chord != 0)
        side = np.zeros(len(h), dtype=np.int64)
        if ok.any():
            off = 0.5j * chord[ok]     # half a chord to the left (+) and right (−) of the arc's midpoint
            side[ok] = (stable_mask(method, mid[ok] + off, radius=radius).astype(np.int64)
                        - stable_mask(method, mid[ok] - off, radius=radius).astype(np.int64))
        if level == levels:
            break
        change = side != np.roll(side, 1)          # the weight changes between arc i−1 and arc i
        mark = change | np.roll(change, -1)
        mark |= np.roll(mark, 1) | np.roll(mark, -1)
        if not mark.any():
            break
        sub = (ta[mark, None] + h[mark, None] * (np.arange(1, refine) / refine)).ravel()
        theta = np.sort(np.concatenate([theta, sub]))
    return float(np.sum(np.where(side != 0, side * np.where(ok, term, 0.0), 0.0)))
