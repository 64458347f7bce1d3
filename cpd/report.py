"""Per-layer round-off reports of an emulated low-precision gradient allreduce.

A :class:`RoundoffReport` holds one :class:`LayerReport` per layer: the scale exponent used, the
APS paper's Eq. 5 average relative error, the maximum relative error, the relative L2 (norm)
error, the underflow fraction and the overflow count. The reference ("high precision") sum is the
float64 sum of the original float32 gradients. ``print(report)`` shows an aligned table,
``report.to_dict()`` plain data, ``report.plot(path)`` per-layer exponent histograms against the
format's representable range (needs matplotlib).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .formats import FloatFormat

__all__ = ["LayerReport", "RoundoffReport", "ScalingComparison", "layer_stats"]


@dataclasses.dataclass
class LayerReport:
    """Round-off statistics of one layer's allreduce."""

    #: Layer name (the key of the ``layers`` dict).
    name: str
    #: ``"lowp"`` (scaled, cast, reduced in fmt), ``"fp32"`` (kept in float32), ``"zero"`` (all-zero
    #: layer, left zero), ``"nonfinite"`` (inf/NaN in the gradients: float32 sum, flagged),
    #: ``"skipped"`` (``None`` gradients).
    status: str
    #: Power-of-two exponent s: gradients were multiplied by 2**s before the cast and divided after
    #: (None when no scaling applies).
    scale_exp: int | None = None
    #: Block formats: (smallest, largest) block exponent over the nonzero blocks (None otherwise).
    block_scale_exps: tuple | None = None
    #: Elements per worker.
    numel: int = 0
    #: Number of workers.
    workers: int = 0
    #: Eq. 5: mean over elements of |(h - l) / h|, h the float64 exact sum, l the low-precision result;
    #: elements whose exact sum is 0 are excluded (and counted in ``zero_sum_count``); an element whose
    #: result is inf/NaN counts as an infinite error. NaN if no element remains.
    mean_rel_error: float = math.nan
    #: Largest |(h - l) / h| over the same elements.
    max_rel_error: float = math.nan
    #: Elements excluded from the relative errors because their exact sum is 0.
    zero_sum_count: int = 0
    #: ||h - l||_2 / ||h||_2 over elements with a finite exact sum (0 if both are 0, inf if only h is 0
    #: or if a result is inf/NaN).
    rel_l2_error: float = math.nan
    #: Fraction of the nonzero finite input elements (all workers) that became 0 after scaling + cast.
    underflow_frac: float = 0.0
    #: Finite input elements whose scaled value exceeded fmt.max (cast to ±inf/NaN, or clamped with
    #: saturate), plus result elements that are not finite although the exact sum is.
    overflow_count: int = 0
    #: Input elements (all workers) that are inf or NaN.
    nonfinite_inputs: int = 0
    #: Result elements that are inf or NaN.
    nonfinite_outputs: int = 0
    #: Histogram of floor(log2|g|) of the nonzero finite inputs before scaling: {exponent: count}.
    exp_hist: dict = dataclasses.field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: frexp exponents of finite nonzero float64 values lie in [-1073, 1024]: shifted by this, in bin 1
#: and up of the exponent histogram's bincount (bin 0 takes zeros, inf and NaN).
_EXP_SHIFT = 1075


def _exp_hist(x: torch.Tensor, finite: torch.Tensor) -> dict:
    """{floor(log2|v|): count} over the finite nonzero entries of ``x`` (``finite``: its isfinite
    mask): frexp's exponent minus one, exact for every value, subnormals included, counted by one
    bincount (no sort, no compaction: a sort of millions of exponents was most of a round-off
    report's time)."""
    e = torch.frexp(x)[1].to(torch.int64)  # |v| = m 2^E with 0.5 <= m < 1: floor(log2|v|) = E - 1
    counts = torch.bincount(torch.where(finite & (x != 0), e + _EXP_SHIFT, 0).reshape(-1))
    nz = torch.nonzero(counts[1:]).flatten() + 1
    return {int(i) - _EXP_SHIFT - 1: int(c) for i, c in zip(nz.tolist(), counts[nz].tolist())}


def layer_stats(name: str, status: str, x: torch.Tensor, result: torch.Tensor, fmt: FloatFormat | None,
                scale_exp: int | None = None, scaled: torch.Tensor | None = None,
                cast_scaled: torch.Tensor | None = None) -> LayerReport:
    """Statistics of one layer: ``x`` (W, n) original gradients, ``result`` (n,) what workers got,
    ``scaled``/``cast_scaled`` (W, n) the scaled gradients before and after the cast (None when the
    layer was not cast)."""
    w, n = x.shape
    exact = x.double().sum(0)
    res = result.reshape(-1).double()
    fin = torch.isfinite(x)
    rep = LayerReport(name=name, status=status, scale_exp=scale_exp, numel=n, workers=w,
                      nonfinite_inputs=x.numel() - int(fin.sum()), exp_hist=_exp_hist(x, fin))
    ok = torch.isfinite(exact)
    nz = ok & (exact != 0)
    rep.zero_sum_count = int((ok & (exact == 0)).sum())
    if nz.any():
        rel = ((exact[nz] - res[nz]) / exact[nz]).abs().nan_to_num(nan=math.inf, posinf=math.inf)  # inf/NaN result: inf
        rep.mean_rel_error = float(rel.mean())
        rep.max_rel_error = float(rel.max())
    if ok.any():
        diff = torch.linalg.vector_norm((exact[ok] - res[ok]).nan_to_num(nan=math.inf, posinf=math.inf))
        ref = torch.linalg.vector_norm(exact[ok])
        rep.rel_l2_error = float(diff / ref) if ref > 0 else (0.0 if diff == 0 else math.inf)
    rep.overflow_count = int((ok & ~torch.isfinite(res)).sum())
    rep.nonfinite_outputs = int((~torch.isfinite(res)).sum())
    if scaled is not None and cast_scaled is not None and fmt is not None:
        nonzero = fin & (x != 0)
        n_nz = int(nonzero.sum())
        rep.underflow_frac = float((nonzero & (cast_scaled == 0)).sum()) / n_nz if n_nz else 0.0
        rep.overflow_count += int((fin & (scaled.abs() > fmt.max)).sum())
    return rep


class RoundoffReport:
    """Per-layer round-off report of an emulated allreduce (``print`` it, ``to_dict()``, ``plot()``)."""

    COLUMNS = (("layer", "name", "s"), ("status", "status", "s"), ("scale_exp", "scale_exp", "d"),
               ("numel", "numel", "d"), ("eq5_mean_rel", "mean_rel_error", "%"), ("max_rel", "max_rel_error", "g"),
               ("rel_l2", "rel_l2_error", "g"), ("underflow", "underflow_frac", "%"),
               ("overflow", "overflow_count", "d"), ("zero_sums", "zero_sum_count", "d"),
               ("nonfinite_in", "nonfinite_inputs", "d"))

    def __init__(self, layers: dict, fmt: FloatFormat, algorithm: str, workers: int, method: str = "aps",
                 group_size: int | None = None):
        #: {name: LayerReport}
        self.layers: dict[str, LayerReport] = dict(layers)
        self.fmt, self.algorithm, self.workers = fmt, algorithm, workers
        self.method, self.group_size = method, group_size

    def __getitem__(self, name: str) -> LayerReport:
        return self.layers[name]

    def __iter__(self):
        return iter(self.layers.values())

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def found_inf(self) -> bool:
        """Whether any layer had inf/NaN gradients or an inf/NaN result (an overflow)."""
        return any(r.nonfinite_inputs > 0 or r.nonfinite_outputs > 0 for r in self)

    def to_dict(self) -> dict:
        """Plain data: the settings and one dict per layer."""
        return {"fmt": self.fmt.name, "algorithm": self.algorithm, "group_size": self.group_size,
                "workers": self.workers, "method": self.method,
                "layers": {k: v.to_dict() for k, v in self.layers.items()}}

    @staticmethod
    def _fmt_cell(v, kind: str) -> str:
        if v is None:
            return "-"
        if kind == "s":
            return str(v)
        if kind == "d":
            return str(int(v))
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        if kind == "%":
            return f"{100 * v:.2f}%"
        return f"{v:.3g}"

    def __str__(self) -> str:
        head = [c[0] for c in self.COLUMNS]
        rows = [[self._fmt_cell(getattr(r, attr), kind) for _, attr, kind in self.COLUMNS] for r in self]
        widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
        left = {0, 1}

        def line(cells):
            return "  ".join(c.ljust(wd) if i in left else c.rjust(wd) for i, (c, wd) in enumerate(zip(cells, widths)))

        gs = f", group_size={self.group_size}" if self.group_size else ""
        title = f"{self.method} allreduce of {self.workers} workers in {self.fmt.name} ({self.algorithm}{gs})"
        out = [title, line(head), line(["-" * wd for wd in widths])] + [line(r) for r in rows]
        return "\n".join(out)

    __repr__ = __str__

    def plot(self, path=None, *, max_layers: int = 12):
        """Per-layer histograms of the gradients' binary exponents, before and after scaling,
        against the format's representable range [log2(smallest subnormal), emax]. Saves to
        ``path`` if given; returns the matplotlib Figure. Needs matplotlib (uses the Agg backend
        when no backend is configured)."""
        try:
            import matplotlib

            if path is not None and matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps"):
                matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - optional dependency
            raise ImportError("RoundoffReport.plot needs matplotlib: pip install matplotlib") from exc
        rows = [r for r in self if r.exp_hist][:max_layers]
        ncols = min(3, max(1, len(rows)))
        nrows = max(1, math.ceil(len(rows) / ncols))
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.5 * ncols, 3.0 * nrows), squeeze=False)
        lo, hi = math.log2(self.fmt.smallest_subnormal), self.fmt.emax
        for ax, r in zip(axes.flat, rows):
            e = sorted(r.exp_hist)
            ax.bar(e, [r.exp_hist[k] for k in e], width=0.9, color="tab:gray", alpha=0.6, label="gradients")
            if r.scale_exp:
                lab = f"scaled by 2^{r.scale_exp}"
                if r.block_scale_exps and r.block_scale_exps[0] != r.block_scale_exps[1]:
                    lab = f"scaled by 2^{r.scale_exp} (blocks: 2^{r.block_scale_exps[0]}..2^{r.block_scale_exps[1]})"
                ax.bar([k + r.scale_exp for k in e], [r.exp_hist[k] for k in e], width=0.9, color="tab:blue",
                       alpha=0.6, label=lab)
            ax.axvspan(lo, hi + 1, color="tab:green", alpha=0.12, label=f"{self.fmt.name} range")
            ax.axvline(lo, color="k", lw=1)
            ax.axvline(hi + 1, color="k", lw=1)
            ax.set_title(f"{r.name} ({r.status})", fontsize=9)
            ax.set_xlabel("floor(log2 |g|)")
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(rows):]:
            ax.axis("off")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=90)
            plt.close(fig)
        return fig


class ScalingComparison:
    """Round-off of the same gradients under several scalings (:func:`cpd.compare_scalings`):
    one :class:`RoundoffReport` per method. ``print`` it (one row per layer and method),
    ``to_dict()``, ``plot(path)`` (relative L2 error and underflow per layer, one bar per method)."""

    COLUMNS = (("layer", "name", "s"), ("method", None, "s"), ("scale_exp", "scale_exp", "d"),
               ("eq5_mean_rel", "mean_rel_error", "%"), ("rel_l2", "rel_l2_error", "g"),
               ("underflow", "underflow_frac", "%"), ("overflow", "overflow_count", "d"))

    def __init__(self, reports: dict, title: str = ""):
        #: {method label: RoundoffReport}, all over the same layers.
        self.reports: dict[str, RoundoffReport] = dict(reports)
        self.title = title

    def __getitem__(self, method: str) -> RoundoffReport:
        return self.reports[method]

    @property
    def methods(self) -> list:
        return list(self.reports)

    @property
    def layer_names(self) -> list:
        return list(next(iter(self.reports.values())).layers) if self.reports else []

    def to_dict(self) -> dict:
        return {"title": self.title, "reports": {m: r.to_dict() for m, r in self.reports.items()}}

    def __str__(self) -> str:
        head = [c[0] for c in self.COLUMNS]
        rows = []
        for name in self.layer_names:
            for m, rep in self.reports.items():
                r = rep[name]
                rows.append([m if attr is None else RoundoffReport._fmt_cell(getattr(r, attr), kind)
                             for _, attr, kind in self.COLUMNS])
        widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]

        def line(cells):
            return "  ".join(c.ljust(wd) if i < 2 else c.rjust(wd) for i, (c, wd) in enumerate(zip(cells, widths)))

        return "\n".join([self.title, line(head), line(["-" * wd for wd in widths])] + [line(r) for r in rows])

    __repr__ = __str__

    def plot(self, path=None):
        """Two panels, one group of bars per layer and one bar per method: the relative L2 error
        (log scale) and the underflow fraction. Saves to ``path`` if given; returns the Figure."""
        try:
            import matplotlib

            if path is not None and matplotlib.get_backend().lower() not in ("agg", "pdf", "svg", "ps"):
                matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - optional dependency
            raise ImportError("ScalingComparison.plot needs matplotlib: pip install matplotlib") from exc
        names, methods = self.layer_names, self.methods
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(6.0, 1.2 * len(names) + 3), 3.4))
        width = 0.8 / max(1, len(methods))
        for k, m in enumerate(methods):
            xs = [i + (k - (len(methods) - 1) / 2) * width for i in range(len(names))]
            l2 = [self.reports[m][n].rel_l2_error for n in names]
            ax1.bar(xs, [v if math.isfinite(v) and v > 0 else float("nan") for v in l2], width, label=m)
            ax2.bar(xs, [100 * self.reports[m][n].underflow_frac for n in names], width, label=m)
        for ax, lab in ((ax1, "relative L2 error"), (ax2, "underflow (% of nonzero inputs)")):
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(lab)
        ax1.set_yscale("log")
        ax1.legend(fontsize=7)
        fig.suptitle(self.title, fontsize=9)
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=90)
            plt.close(fig)
        return fig
