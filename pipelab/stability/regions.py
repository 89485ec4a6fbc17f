"""Stability regions in the complex ``z = η·λ`` plane, vectorised over grids.

Three tools, all vectorised over arbitrary arrays of z:

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

import numpy as np

from .methods import LinearMethod, char_poly, companion

__all__ = ["complex_grid", "stable_mask", "region_mask", "spectral_radius", "boundary_locus", "schur_stable"]


def complex_grid(re: tuple[float, float], im: tuple[float, float], shape: tuple[int, int]) -> np.ndarray:
    """A rectangular grid ``z = x + i·y``, shape ``(n_im, n_re)`` (rows are Im z, as ``imshow`` wants).

    Args:
        re: (min, max) of Re z.
        im: (min, max) of Im z.
        shape: (n_im, n_re) points.
    """
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be two positive ints (n_im, n_re), got {shape}")
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


def stable_mask(method: LinearMethod, z: complex | np.ndarray) -> np.ndarray:
    """Where the method converges: all characteristic roots strictly inside the unit disk (Schur–Cohn).

    Args:
        method: the linearised optimizer.
        z: ``η·λ``, complex scalar or array of any shape.

    Returns:
        boolean array of the shape of ``z``.

    Example:
        >>> from pipelab.stability import delayed_gd
        >>> stable_mask(delayed_gd(1), np.array([0.5, 0.99, 1.01])).tolist()
        [True, True, False]
    """
    return schur_stable(char_poly(method, z))


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
    th = np.linspace(0.0, 2.0 * np.pi, int(theta)) if np.isscalar(theta) else np.asarray(theta, dtype=float)
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

    Args:
        method: the linearised optimizer.
        re, im, shape: the grid, as in :func:`complex_grid` (``shape = (n_im, n_re)``).
        radius: ρ; ``1.0`` gives the stability region, ``ρ < 1`` the region converging at least as fast
            as ``ρ^t``.
        n_theta: samples of the locus; default: enough that no edge inside the grid is longer than one
            grid cell (so only points within about a cell of the boundary can be misclassified).

    Returns:
        ``(z, mask)``: the grid and the boolean mask, both of shape ``shape``.

    Example:
        >>> from pipelab.stability import gd
        >>> z, mask = region_mask(gd(), (0.1, 1.9), (-0.9, 0.9), (5, 5))
        >>> int(mask.sum())
        13
    """
    if radius <= 0:
        raise ValueError(f"radius must be > 0, got {radius}")
    z = complex_grid(re, im, shape)
    x, y = z[0, :].real, z[:, 0].imag
    b = np.trim_zeros(np.asarray(method.b), "f")
    n_in_b = int(np.sum(np.abs(np.roots(b)) < radius)) if len(b) > 1 else 0
    cell = min(abs(x[-1] - x[0]) / max(len(x) - 1, 1), abs(y[-1] - y[0]) / max(len(y) - 1, 1)) or 1.0

    def locus(m: int) -> np.ndarray:
        r = radius * np.exp(1j * np.linspace(0.0, 2.0 * np.pi, m + 1))
        A = np.polyval(np.asarray(method.a), r)
        B = np.polyval(np.asarray(method.b), r)
        if np.min(np.abs(B)) < 1e-12 * max(1.0, np.max(np.abs(B))):
            raise ValueError(f"{method.name}: B(r) vanishes on |r| = {radius}; use stable_mask (Schur–Cohn)")
        c = -A / B
        c[-1] = c[0]  # exactly closed
        return c

    m = int(n_theta) if n_theta is not None else 4096
    curve = locus(m)
    if n_theta is None:
        seg = np.abs(np.diff(curve))
        mid = 0.5 * (curve[1:] + curve[:-1])
        inside = ((mid.real >= x[0] - cell) & (mid.real <= x[-1] + cell)
                  & (mid.imag >= y[0] - cell) & (mid.imag <= y[-1] + cell))
        longest = float(seg[inside].max()) if inside.any() else 0.0
        if longest > cell:
            curve = locus(int(min(m * np.ceil(longest / cell), 1 << 21)))
    w = _winding_raster(curve, x, y)
    return z, w == (method.order - n_in_b)
