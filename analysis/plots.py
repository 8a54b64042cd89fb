"""Report figures as PNG bytes (matplotlib's object API; pyplot and its global state unused)."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from . import pareto, tables

EFFECT_OBJECTIVES = ["loss", "time_to_train", "mfu", "memory"]
TIME_UNITS = (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0), ("seconds", 1.0))
MEMORY_UNITS = (("GiB", float(2**30)), ("MiB", float(2**20)), ("KiB", float(2**10)), ("bytes", 1.0))
MAX_GROUPS = 12  # numeric decisions with more distinct values are drawn as a scatter


def png_bytes(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def _time_unit(frame: pd.DataFrame) -> tuple[str, float]:
    """The unit of the time to train axis: the largest its median finite value reaches."""
    values = pd.to_numeric(frame.get("time_to_train", pd.Series(dtype=float)), errors="coerce")
    values = values[np.isfinite(values)]
    middle = float(values.median()) if len(values) else 0.0
    return next(((name, size) for name, size in TIME_UNITS if middle >= size), TIME_UNITS[-1])


def _memory_unit(frame: pd.DataFrame) -> tuple[str, float]:
    """The unit of a memory axis: the largest its median finite value reaches (a tiny model's
    MiB-sized figures read as MiB, not as 0.004 GiB)."""
    values = pd.to_numeric(frame.get(pareto.column("memory"), pd.Series(dtype=float)), errors="coerce")
    values = values[np.isfinite(values)]
    middle = float(values.median()) if len(values) else float(2**30)
    return next(((name, size) for name, size in MEMORY_UNITS if middle >= size), MEMORY_UNITS[-1])


def _axis_label(objective: str, predicted: bool, frame: pd.DataFrame | None = None) -> str:
    frame = frame if frame is not None else pd.DataFrame()
    if objective == "time_to_train":
        text = f"time to train ({_time_unit(frame)[0]})"
    elif objective == "memory":
        text = f"memory per device ({_memory_unit(frame)[0]})"
    else:
        text = {"loss": "loss", "mfu": "MFU (%)"}[objective]
    return f"{text}, predicted" if predicted else text


def _plot_values(frame: pd.DataFrame, objective: str) -> np.ndarray:
    """Objective values in plot units (MFU in %, memory and time to train in the unit their
    median reaches)."""
    values = pd.to_numeric(frame[pareto.column(objective)], errors="coerce").to_numpy(float)
    if objective == "mfu":
        return 100 * values
    if objective == "time_to_train":
        return values / _time_unit(frame)[1]
    if objective == "memory":
        return values / _memory_unit(frame)[1]
    return values


def _failed_memory(failed: pd.DataFrame, unit: float) -> np.ndarray:
    """Memory of failed trials in `unit` bytes: their memory figure, else the compiled
    (predicted) peak."""
    memory = pd.to_numeric(failed["memory_bytes"], errors="coerce")
    if "plan.peak_bytes" in failed:
        memory = memory.fillna(pd.to_numeric(failed["plan.peak_bytes"], errors="coerce"))
    return memory.to_numpy(float) / unit


def pareto_figure(frame: pd.DataFrame, on_front: pd.Series, knee: int | None,
                  predicted: bool) -> Figure:
    """MFU against memory per device, coloured by loss; dominated faded, failures as x."""
    figure = Figure(figsize=(9, 6))
    axes = figure.add_subplot()
    points = frame[pareto.feasible_mask(frame, ["mfu", "memory"])]
    front = on_front.reindex(points.index, fill_value=False).to_numpy(bool)
    x, y = _plot_values(points, "memory"), _plot_values(points, "mfu")
    loss = pd.to_numeric(points["loss"], errors="coerce").to_numpy(float)
    coloured = np.isfinite(loss).any()
    style = dict(c=loss, cmap="viridis") if coloured else dict(color="tab:blue")
    if coloured:
        style.update(vmin=np.nanmin(loss), vmax=np.nanmax(loss))
    axes.scatter(x[~front], y[~front], s=30, alpha=0.25, label="dominated",
                 **{k: (v[~front] if k == "c" else v) for k, v in style.items()})
    drawn = axes.scatter(x[front], y[front], s=80, edgecolors="black", linewidths=1.2,
                         label="Pareto front", zorder=3,
                         **{k: (v[front] if k == "c" else v) for k, v in style.items()})
    for number, xi, yi in zip(points["number"].to_numpy()[front], x[front], y[front], strict=True):
        axes.annotate(str(number), (xi, yi), textcoords="offset points", xytext=(6, 4),
                      fontsize=8)
    if knee is not None and (points["number"] == knee).any():
        at = (points["number"] == knee).to_numpy()
        axes.scatter(x[at], y[at], s=320, facecolors="none", edgecolors="red",
                     linewidths=2, label=f"knee (trial {knee})", zorder=4)
    guessed = points["predicted"].to_numpy(bool)
    if guessed.any() and not predicted:  # a mixed study: mark the predicted points
        axes.scatter(x[guessed], y[guessed], s=160, marker="s", facecolors="none",
                     edgecolors="tab:orange", linewidths=1.5, label="predicted figures",
                     zorder=4)
    failed = frame[frame["state"] == "FAIL"]
    failed_x = _failed_memory(failed, _memory_unit(points)[1]) if len(failed) else np.array([])
    if np.isfinite(failed_x).any():
        axes.scatter(failed_x, np.zeros_like(failed_x), marker="x", color="red", s=50,
                     label="failed (at compiled memory, MFU 0)", zorder=2)
    if coloured:
        figure.colorbar(drawn, ax=axes, label=_axis_label("loss", predicted))
    axes.set_xlabel(_axis_label("memory", predicted, points))
    axes.set_ylabel(_axis_label("mfu", predicted))
    kind = "predicted" if predicted else \
        "measured; squares: predicted" if guessed.any() else "measured"
    axes.set_title(f"Trials: MFU against memory per device ({kind})")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4, fontsize=8)
    return figure


def _ordered_values(values: pd.Series) -> list:
    unique = values.dropna().unique().tolist()
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in unique)
    return sorted(unique) if numeric else sorted(unique, key=str)


def _is_continuous(values: pd.Series) -> bool:
    unique = values.dropna().unique()
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    return numeric and len(unique) > MAX_GROUPS


def effect_figure(frame: pd.DataFrame, decision: str, objectives: list[str],
                  predicted: bool) -> Figure:
    """Each objective against one decision: every completed trial a dot, medians as bars.

    Group labels carry the count of completed and failed trials with that value.
    """
    figure = Figure(figsize=(4.2 * len(objectives), 3.8))
    name = decision[2:] if decision.startswith("d.") else decision
    kind = "predicted" if predicted else "measured"
    figure.suptitle(f"Effect of {name} ({kind})")
    rng = np.random.default_rng(0)
    continuous = _is_continuous(frame[decision])
    groups = _ordered_values(frame[decision])
    for index, objective in enumerate(objectives):
        axes = figure.add_subplot(1, len(objectives), index + 1)
        ok = frame[pareto.feasible_mask(frame, [objective])]
        values = _plot_values(ok, objective)
        if continuous:
            axes.scatter(pd.to_numeric(ok[decision]), values, s=18, alpha=0.7)
            axes.set_xlabel(name)
        else:
            labels = []
            for position, group in enumerate(groups):
                in_group = (ok[decision] == group).to_numpy()
                n_failed = int(((frame[decision] == group) & (frame["state"] == "FAIL")).sum())
                labels.append(f"{group}\n{in_group.sum()} ok, {n_failed} failed")
                if in_group.any():
                    jitter = rng.uniform(-0.15, 0.15, in_group.sum())
                    axes.scatter(position + jitter, values[in_group], s=18, alpha=0.7)
                    axes.hlines(np.median(values[in_group]), position - 0.3, position + 0.3,
                                color="black", linewidth=2)
            axes.set_xticks(range(len(groups)), labels, fontsize=7)
            axes.set_xlim(-0.6, len(groups) - 0.4)
        axes.set_ylabel(_axis_label(objective, predicted, ok))
        axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def curve_groups(frame: pd.DataFrame, curves: dict[int, list]) -> dict[str, tuple[list[int], pd.Series]]:
    """label -> (trial numbers, mean training loss by step) of each math group with trained
    trials: trials that ended ok and stored a loss curve, grouped by math_key, labelled by what
    sets the groups apart (tables.math_group_labels); empty without math keys or curves."""
    if "math_key" not in frame or not curves:
        return {}
    ok = frame[(frame["outcome"] == "ok") & frame["math_key"].notna() & frame["number"].isin(list(curves))]
    labels = tables.math_group_labels(ok)
    out = {}
    for key, group in ok.groupby("math_key", sort=False):
        numbers = [int(n) for n in group["number"]]
        points = pd.DataFrame([point for n in numbers for point in curves[n]], columns=["step", "loss"])
        out[labels[key]] = (numbers, points.groupby("step")["loss"].mean())
    return out


def curve_table(groups: dict[str, tuple[list[int], pd.Series]]) -> pd.DataFrame:
    """The legend of the loss curves as a table: each group's trials and last mean loss."""
    return pd.DataFrame([{"math group": label, "trials": ", ".join(map(str, numbers)),
                          "last step": int(mean.index[-1]), "loss": float(mean.iloc[-1])}
                         for label, (numbers, mean) in groups.items()])


def loss_curves_figure(groups: dict[str, tuple[list[int], pd.Series]]) -> Figure:
    """One line per math group: the mean training loss of its trials at each logged step."""
    figure = Figure(figsize=(9, 5))
    axes = figure.add_subplot()
    for label, (_, mean) in groups.items():
        axes.plot(mean.index.to_numpy(), mean.to_numpy(), marker="o", markersize=3, label=label)
    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    axes.set_ylabel("training loss (mean of the group's trials)")
    axes.set_title("Loss curves per math group (measured)")
    axes.grid(alpha=0.3)
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=max(1, min(2, len(groups))), fontsize=8)
    return figure
