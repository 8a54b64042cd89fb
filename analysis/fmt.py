"""Human-readable column titles and cell values, shared by the HTML and Markdown reports."""
from __future__ import annotations

import math
import os
from typing import Any

from ..store.units import format_bytes, format_duration

GIB = 2.0 ** 30

_TITLES = {
    "number": "trial",
    "state": "state",
    "loss": "loss",
    "eval_loss": "eval loss",
    "mfu": "MFU",
    "dropped_fraction": "dropped tokens",
    "load_balance_loss": "load-balance loss",
    "hfu": "HFU",
    "memory_bytes": "memory/device",
    "time_to_train": "time to train",
    "full_run_tokens": "full-run tokens",
    "measured_peak_bytes": "measured peak/device",
    "tokens_per_sec": "tokens/s",
    "step_time": "step time",
    "plan.peak_bytes": "compiled peak/device",
    "plan.predicted_step_time": "predicted step time",
    "plan.predicted_mfu": "predicted MFU",
    "corrected_mfu": "corrected MFU",
    "corrected_mfu_low": "corrected, low",
    "corrected_mfu_high": "corrected, high",
    "plan.compile_seconds": "compile time",
    "plan.pipeline_bubble": "pipeline bubble",
    "step.on_chip_s": "on chip",
    "step.exposed_ici_s": "exposed ICI",
    "step.exposed_dcn_s": "exposed DCN",
    "step.exposed_host_s": "exposed host",
    "step.largest_exposed": "exposed the longest",
    "env.device_kind": "device kind",
    "failure_kind": "failure",
    "outcome": "outcome",
    "memory_budget_bytes": "memory budget/device",
    "failure_message": "message",
    "on_front": "Pareto",
    "figures": "figures",
    "planned_with": "planned with",
}
# Scores that are predictions in a plan-only study.
PREDICTABLE = {"loss", "eval_loss", "mfu", "hfu", "memory_bytes", "tokens_per_sec",
               "step_time", "time_to_train"}


def title(column: str, predicted: bool = False) -> str:
    """Column title; "(predicted)" appended to score columns when figures are predictions."""
    if column.startswith("d."):
        return column[2:]
    if column.startswith("ratio "):
        return f"ratio {title(column[len('ratio '):])}"
    text = _TITLES.get(column, column)
    if predicted and column in PREDICTABLE:
        text += " (predicted)"
    return text


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN, pd.NA
    except (TypeError, ValueError):
        return False


def value(column: str, raw: Any) -> str:
    """One cell as text: bytes in the unit their size reaches (KiB, MiB, GiB: as the terminal
    prints them), utilisation in %, times in s, time to train in the unit it reaches (min, h, d)."""
    if _is_missing(raw):
        return ""
    if isinstance(raw, bool):
        return "yes" if raw else ""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        number = float(raw)
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        if column == "time_to_train":
            return format_duration(number)
        if column.startswith("ratio"):
            return f"{number:.3f}"
        if column.endswith("bytes"):
            return format_bytes(number)
        if column in ("mfu", "hfu", "plan.predicted_mfu", "corrected_mfu", "corrected_mfu_low", "corrected_mfu_high",
                      "plan.pipeline_bubble", "dropped_fraction"):
            return f"{100 * number:.2f}%"
        if column.endswith(("_time", "_s", "seconds")):
            return f"{number:.4g} s"
        if column in ("loss", "eval_loss"):
            return f"{number:.4f}"
        if number.is_integer() and abs(number) < 1e15:
            return str(int(number))
        return f"{number:.4g}"
    return str(raw)


def sort_key(raw: Any) -> str:
    """The value a table sorts by: numbers as numbers, the rest as text."""
    if _is_missing(raw):
        return ""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return repr(float(raw))
    return str(raw)


def _listing(raw: Any) -> str:
    if raw is None or raw == [] or raw == "":
        return "not recorded"
    if isinstance(raw, list):
        return "; ".join(str(v) for v in raw) + " (differs across trials)"
    return str(raw)


def _flops(raw: Any) -> str:
    values = raw if isinstance(raw, list) else [raw]
    try:
        return ", ".join(f"{float(v):.4g} FLOP/s" for v in values) if raw is not None \
            else "not recorded"
    except (TypeError, ValueError):
        return _listing(raw)


def relative(text: str | None) -> str | None:
    """An absolute path (or sqlite URL of one) below the current folder, relative to it; else as given."""
    if not text:
        return text
    prefix = "sqlite:///" if text.startswith("sqlite:////") else ""
    path = text[len(prefix):]
    here = os.getcwd()
    if os.path.isabs(path) and os.path.commonpath([path, here]) == here:
        return prefix + os.path.relpath(path, here)
    return text


def header_items(info: dict, pareto_objectives: list[str], rtol: float) -> list[tuple[str, str]]:
    """(label, text) pairs every report starts with: study, target, conventions, versions."""
    objectives = ", ".join(f"{o['name']} ({o['direction']})" for o in info["objectives"])
    # by outcome, not Optuna state: a predicted_oom trial is COMPLETE in Optuna but never "ok"
    counts = info.get("outcomes") or info["states"]
    states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (kv[0] != "ok", kv[0])))
    states = states or "none"
    if info.get("skipped"):
        states += f"; {info['skipped']} of them skipped after compiling as predicted dominated (--steer)"
    figures = ("PREDICTED: plan-only study, trials compiled but not run; every score is a "
               "prediction" if info["plan_only"] else
               "PREDICTED: every completed trial's figures are predictions"
               if info["predicted"] else "measured (short training runs)")
    versions = f"jax {_listing(info['jax'])}, jaxlib {_listing(info['jaxlib'])}"
    if info.get("libtpu"):
        versions += f", libtpu {_listing(info['libtpu'])}"
    return [
        ("study", str(info["study_name"])),
        ("storage", str(relative(info["storage"]))),
        ("target", _listing(info["target"])),
        ("figures", figures),
        ("objectives", objectives or "not recorded"),
        ("Pareto front over", ", ".join(pareto_objectives) + f" (relative tie tolerance {rtol:g})"
         if pareto_objectives else "no objective has scores"),
        ("trials", f"{info['n_trials']} ({states})"),
        ("MFU convention", _listing(info["mfu_convention"])),
        ("peak FLOP/s per device", _flops(info["peak_flops_per_device"])
         + f" (source: {_listing(info['peak_flops_source'])})"),
        ("device kind", _listing(info["device_kind"])
         + f", {_listing(info['num_devices'])} devices, platform {_listing(info['platform'])}"),
        ("versions", versions),
        *([("compiler", info["planned_with"])] if info.get("planned_with") else []),
        ("XLA flags", _listing(info["xla_flags"])),
        ("space file", _listing(relative(info["space_file"]) if isinstance(info["space_file"], str)
                                else info["space_file"])),
    ]
