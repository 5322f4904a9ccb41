"""A dashboard panel of one's own, with two series on one chart, a summary line and a sparkline."""

from __future__ import annotations

from typing import Any

from jdist.metrics.panels import LineDef, SeriesDef, Spark, mean_band


def parameters(run: Any) -> LineDef:
    weight = SeriesDef("weight_norm", "#9467bd", "weight_norm", mean_band, band=True)
    bias = SeriesDef("bias_abs", "#8c564b", "bias_abs", mean_band)
    return LineDef("parameters", "weight norm and |bias|", (weight, bias), summary=summary,
                   spark=Spark("weight norm", weight))


def summary(run: Any) -> list[str]:
    """Its line of the run's summary (made when a summary is asked for, not on every live update)."""
    steps, mean, _, _ = run.aggregate("weight_norm")
    return [f"weight norm: {mean[-1]:.4g} at step {steps[-1]}"] if steps else []
