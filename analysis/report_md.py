"""report.md: the Pareto table, best per objective, failures by kind; figures as PNG links."""
from __future__ import annotations

import pandas as pd

from . import fmt
from .recommend import Recommendation
from .tables import ROLES_NOTE, STEP_NOTE


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(frame: pd.DataFrame, predicted: bool) -> str:
    if frame.empty:
        return "none\n"
    lines = ["| " + " | ".join(_cell(fmt.title(c, predicted)) for c in frame.columns) + " |",
             "|" + "---|" * len(frame.columns)]
    for record in frame.to_dict("records"):
        lines.append("| " + " | ".join(_cell(fmt.value(c, v)) for c, v in record.items())
                     + " |")
    return "\n".join(lines) + "\n"


def recommendation(rec: Recommendation | None, predicted: bool) -> str:
    if rec is None:
        return "## Recommendation\n\nNo trial has finite scores yet: nothing to recommend.\n"
    kind = " (predicted)" if predicted else ""
    lines = [f"## Recommendation{kind}\n", f"**Use trial {rec.number}**, {rec.choice}.\n",
             "- decisions: " + ", ".join(f"`{k}={v}`" for k, v in rec.decisions.items()),
             "- scores: " + ", ".join(f"{k} {v}" for k, v in rec.scores.items())]
    lines += [f"- {_cell(reason)}" for reason in rec.reasons]
    lines += ["", "Run it:", "", *[f"    {command}" for command in rec.commands], ""]
    return "\n".join(lines)


def render(header: list[tuple[str, str]], predicted: bool, pareto_png: str,
           effect_pngs: dict[str, str], best: pd.DataFrame, front: pd.DataFrame,
           comparison: pd.DataFrame, failures: dict[str, pd.DataFrame], loss_line: str | None = None,
           rec: Recommendation | None = None, roles: pd.DataFrame | None = None,
           curves: tuple[str, pd.DataFrame] | None = None,
           corrected: tuple[pd.DataFrame, str | None] | None = None,
           steps: pd.DataFrame | None = None, quant: tuple[str, pd.DataFrame] | None = None) -> str:
    """Markdown text; quant: int8 against bf16 (analysis/quality.py: the rule and the fastest
    quantized trial, then the table); figure arguments are paths relative to the Markdown file. loss_line:
    what the objectives loss and time to train are, one line each (the study's "loss_objective",
    e.g. its token budget; the full run's tokens)."""
    kind = "predicted" if predicted else "measured"
    parts = [f"# paxsearch report: {dict(header)['study']}\n"]
    if predicted:
        parts.append("> **Predicted figures.** Trials were compiled, not run: every score "
                     "below is a prediction.\n")
    parts.append(recommendation(rec, predicted))
    parts.append("\n".join(f"- **{label}**: {_cell(text)}" for label, text in header) + "\n")
    parts += [f"{_cell(line)}\n" for line in (loss_line or "").splitlines()]
    parts += [f"## Pareto front ({kind})\n", f"![Pareto front ({kind})]({pareto_png})\n",
              table(front, predicted),
              f"## Best per objective and knee ({kind})\n", table(best, predicted)]
    if quant is not None:
        parts += ["## Quantization: speed gain against loss cost (measured)\n",
                  *[f"{_cell(line)}\n" for line in quant[0].splitlines()], table(quant[1], False)]
    if steps is not None and not steps.empty:
        parts += ["## Where the predicted step goes\n", f"{_cell(STEP_NOTE)}\n", table(steps, False)]
    if not comparison.empty:
        parts += ["## Predicted vs measured\n", "Ratios are measured / predicted.\n",
                  table(comparison, False)]
    if corrected is not None and not corrected[0].empty:
        parts += ["## Predicted, corrected and measured MFU\n", f"{_cell(corrected[1] or '')}\n",
                  table(corrected[0], False)]
    parts.append("## Failures by kind\n")
    if not failures:
        parts.append("No trial failed.\n")
    for failure_kind, group in failures.items():
        parts += [f"### {failure_kind} ({len(group)})\n", table(group, predicted)]
    parts.append(f"## Effect of each decision ({kind})\n")
    if roles is not None and not roles.empty:
        parts += [f"{ROLES_NOTE}\n", table(roles, False)]
    parts += [f"![effect of {name}]({path})\n" for name, path in effect_pngs.items()]
    if curves:
        parts += ["## Loss curves per math group (measured)\n",
                  "One line per math group (trials that train the same model on the same batches), the mean "
                  "training loss of its trials at each logged step.\n",
                  f"![loss curves per math group]({curves[0]})\n", table(curves[1], False)]
    return "\n".join(parts)
