"""write_report: report.html, report.md (+ report/*.png), trials.csv and trials.parquet."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa

from . import corrected as corrected_lib
from . import pareto, plots, quality, recommend, report_html, report_md, tables
from .best import study_objectives
from .fmt import header_items
from .load import Source, decision_columns, loss_curves, objective_names, open_study, study_info, trials_frame
from .staging import staged_into


def _parquet_ready(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns that Arrow cannot type (mixed str/int decisions) become text."""
    frame = frame.copy()
    for name in frame.columns:
        if frame[name].dtype == object:
            try:
                pa.array(frame[name], from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                frame[name] = frame[name].map(lambda v: None if v is None else str(v))
    return frame


def _file_stem(decision: str) -> str:
    return "effect_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", decision[2:])


def write_report(run_dir_or_storage: Source, out_dir: str | os.PathLike | None = None,
                 study_name: str | None = None, rtol: float = 0.0) -> dict[str, Path]:
    """Write the report of a study; returns {"html", "markdown", "csv", "parquet",
    "pareto_png", "effect_png:<decision>"...} -> path.

    out_dir defaults to the run folder; a study given by storage URL needs out_dir (paths come
    from the caller, never from what the storage says). Everything is written into a temporary
    folder beside the output and moved into place (analysis/staging.py): a failure leaves no
    half-written report. rtol is the relative tolerance of the Pareto front (see pareto).
    """
    opened = open_study(run_dir_or_storage, study_name)
    ref = run_reference(run_dir_or_storage, opened)
    out = Path(out_dir) if out_dir is not None else opened.run_dir
    if out is None:
        raise ValueError("a study read from a storage URL has no run folder here; pass out_dir (--out DIR)")
    with staged_into(out) as root:
        written = _write(opened, root, rtol, ref)
        return {key: out / path.relative_to(root) for key, path in written.items()}


def run_reference(source: Source, opened) -> str:
    """How the report's commands name the study: the run folder relative to here when it lies
    below, else as given; a storage URL (password masked) with --study."""
    if opened.run_dir is not None:
        folder = os.path.abspath(opened.run_dir)
        here = os.getcwd()
        inside = os.path.commonpath([folder, here]) == here
        return os.path.relpath(folder, here) if inside else str(opened.run_dir)
    return f"{opened.storage_display} --study {opened.study.study_name}"


def _write(opened, out: Path, rtol: float, ref: str) -> dict[str, Path]:
    """Every file of the report, written under `out` (the staging folder)."""
    figure_dir = out / "report"
    figure_dir.mkdir(parents=True, exist_ok=True)

    frame = trials_frame(opened.study)
    info = study_info(opened, frame=frame)
    predicted = info["predicted"]
    objectives = study_objectives(objective_names(opened.study), frame)
    on_front = (pareto.pareto_mask(frame, objectives, rtol) if objectives
                else pd.Series(False, index=frame.index))
    knee = pareto.knee(frame, objectives, rtol) if objectives else None
    best = pareto.best_per_objective(frame, objectives) if objectives else {}

    paths: dict[str, Path] = {}
    pareto_png = plots.png_bytes(plots.pareto_figure(frame, on_front, knee, predicted))
    paths["pareto_png"] = figure_dir / "pareto.png"
    paths["pareto_png"].write_bytes(pareto_png)
    effect_pngs: dict[str, bytes] = {}
    effect_objectives = [o for o in plots.EFFECT_OBJECTIVES if o in objectives] or objectives
    for decision in decision_columns(frame) if effect_objectives else []:
        png = plots.png_bytes(plots.effect_figure(frame, decision, effect_objectives,
                                                  predicted))
        effect_pngs[decision[2:]] = png
        paths[f"effect_png:{decision[2:]}"] = figure_dir / f"{_file_stem(decision)}.png"
        paths[f"effect_png:{decision[2:]}"].write_bytes(png)

    groups = plots.curve_groups(frame, loss_curves(opened.study))
    curves_png = plots.png_bytes(plots.loss_curves_figure(groups)) if groups else None
    curves = (curves_png, plots.curve_table(groups)) if groups else None
    if curves_png:
        paths["curves_png"] = figure_dir / "loss_curves.png"
        paths["curves_png"].write_bytes(curves_png)

    header = header_items(info, objectives, rtol)
    notes = [line for line in (opened.study.user_attrs.get("loss_objective"),  # e.g. the token budget of the loss
                               tables.time_to_train_line(frame, predicted)) if line]
    loss_line = "\n".join(notes) or None
    best_rows = tables.best_table(frame, best, knee)
    front_rows = tables.pareto_table(frame, on_front)
    steps = tables.step_breakdown(frame, on_front)
    comparison = tables.predicted_vs_measured(frame)
    corrected = corrected_lib.corrected_table(frame)
    failures = tables.failures_by_kind(frame)
    roles = tables.decision_roles(frame)
    rec = recommend.recommend(frame, objectives, knee, ref, predicted)
    headline = quality.quantization_headline(frame)  # int8 against bf16: speed gain beside loss cost
    quant = (headline, quality.quantization_table(frame)) if headline else None

    paths["html"] = out / "report.html"
    paths["html"].write_text(report_html.render(
        header, predicted, pareto_png, effect_pngs, best_rows, front_rows, comparison,
        tables.trial_table(frame, on_front), failures, loss_line, rec, roles, curves, corrected, steps, quant),
        encoding="utf-8")
    relative = {name: os.path.relpath(paths[f"effect_png:{name}"], out)
                for name in effect_pngs}
    paths["markdown"] = out / "report.md"
    paths["markdown"].write_text(report_md.render(
        header, predicted, os.path.relpath(paths["pareto_png"], out), relative, best_rows,
        front_rows, comparison, failures, loss_line, rec, roles,
        (os.path.relpath(paths["curves_png"], out), curves[1]) if curves else None, corrected, steps, quant),
        encoding="utf-8")

    exported = frame.assign(on_front=on_front, is_knee=frame["number"] == knee)
    paths["csv"] = out / "trials.csv"
    exported.to_csv(paths["csv"], index=False)
    paths["parquet"] = out / "trials.parquet"
    _parquet_ready(exported).to_parquet(paths["parquet"], index=False)
    return paths
