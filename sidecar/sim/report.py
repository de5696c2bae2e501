"""The lab report: markdown plus PNG plots, from a results document.

Per scenario two figures (matplotlib, Agg backend, no display needed):

* ``<scenario>-share.png``: one panel per policy, the share of attempts each
  provider received per time bucket (stacked), degradation windows shaded;
* ``<scenario>-p99.png``: one panel per workload class, the p99 of the class's
  SLO metric per time bucket for every policy, with the SLO budget as a line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from sidecar.core.config import ConfigError
from sidecar.ops.config_file import TooLarge, read_capped
from sidecar.sim import tables
from sidecar.sim.bounds import MAX_FILE_BYTES

_COLORS: Final = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
                  "#8C8C8C", "#CCB974", "#64B5CD", "#000000"]


def load_results(path: Path, schemas: tuple[int, ...], option: str = "--from-json"
                 ) -> dict[str, Any]:
    """The results document at ``path`` (``simulate --out``, ``report``'s results.json).

    Bounded as the lab's other inputs are (:data:`~sidecar.sim.bounds.MAX_FILE_BYTES`,
    refused before reading; a device such as /dev/zero is read only up to it), and
    every way it can be unusable -- unreadable, not UTF-8, not JSON, nested too deeply
    for the parser, not an object, an unknown ``schema_version`` -- is a
    :class:`ConfigError` naming ``option`` and the file, never a traceback.
    """
    where = f"{option} {path}"
    try:
        text = read_capped(path, MAX_FILE_BYTES).decode("utf-8")
        doc = json.loads(text)
    except TooLarge as exc:
        raise ConfigError(f"{where}: results document is larger than {exc}: refused (a "
                          "lab input's bound; render a smaller run, or let `report --suite "
                          "DIR` run the scenarios itself)") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read results document: "
                          f"{exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not a results document (the byte at offset {exc.start} is not "
                          "UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not a results document (invalid JSON at line "
                          f"{exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise ConfigError(f"{where}: not a results document (JSON nested too deeply to "
                          "read)") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: not a results document (a JSON "
                          f"{type(doc).__name__}, not an object)")
    if doc.get("schema_version") not in schemas:
        raise ConfigError(f"{where}: unsupported schema_version "
                          f"{doc.get('schema_version')!r} (expected "
                          f"{' or '.join(map(str, schemas))})")
    return doc


def write_report(doc: dict[str, Any], out: Path) -> Path:
    """Write ``report.md``, ``results.json`` and the plots into ``out``; returns the md path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n",
                                      encoding="utf-8")
    lines = [
        "# tailroute policy lab report",
        "",
        f"{len(doc['scenarios'])} scenario(s); raw numbers in `results.json` "
        f"(schema_version {doc['schema_version']}). Definitions: docs/policy-lab.md.",
        "",
        "## Summary",
        "",
        *[("  - " + x.strip()) if x.startswith("  ") else f"- {x}"
          for x in tables.suite_lines(doc["summary"])],
        "",
        *[f"- **skipped** {e['file']}: {e['error']}" for e in doc.get("errors", [])],
        "",
    ]
    if "families" in doc:
        from sidecar.sim.gen_run import family_lines

        lines += ["## Generated scenarios by family", "", "```", *family_lines(doc), "```", ""]
    lines += [
        "## SLO violation rate per scenario, class and policy",
        "",
        tables.markdown_suite_table(doc),
        "",
    ]
    for sc in doc["scenarios"]:
        lines += [
            f"## {sc['name']}",
            "",
            sc["description"].strip() or "(no description)",
            "",
            tables.markdown_table(sc),
            "",
            tables.summary_line(sc["summary"]),
            "",
        ]
        if all("series" in r for r in sc["policies"].values()):  # generated runs drop them
            share_png = _plot_share(sc, out)
            p99_png = _plot_p99(sc, out)
            lines += [f"![traffic share per provider]({share_png.name})", "",
                      f"![p99 over time]({p99_png.name})", ""]
    md = out / "report.md"
    md.write_text("\n".join(lines), encoding="utf-8")
    return md


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _shade(ax: Any, sc: dict[str, Any]) -> None:
    for ev in sc.get("events", []):
        for lo, hi in ev["windows"]:
            ax.axvspan(lo, hi, color="#d62728", alpha=0.08, lw=0)


def _plot_share(sc: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    pols = list(sc["policies"])
    ncols = 3 if len(pols) > 4 else len(pols)
    nrows = (len(pols) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 2.4 * nrows), squeeze=False,
                             sharex=True, sharey=True)
    for ax in axes.flat[len(pols):]:
        ax.set_visible(False)
    for ax, pol in zip(axes.flat, pols, strict=False):
        series = sc["policies"][pol]["series"]
        t = series["t"]
        clusters = list(series["share"])
        ax.stackplot(t, *[series["share"][c] for c in clusters], labels=clusters,
                     colors=_COLORS[: len(clusters)], alpha=0.85)
        _shade(ax, sc)
        ax.set_title(pol, fontsize=9)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"{sc['name']}: traffic share per provider (shaded: degradation)", fontsize=10)
    fig.supxlabel("simulated time (s)", fontsize=8)
    fig.tight_layout()
    path = out / f"{sc['name']}-share.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot_p99(sc: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    classes: list[str] = []
    for r in sc["policies"].values():
        for c in r["series"]["p99_ms"]:
            if c not in classes:
                classes.append(c)
    n = max(len(classes), 1)
    fig, axes = plt.subplots(1, n, figsize=(6.0 * n, 3.4), squeeze=False)
    for ax, c in zip(axes.flat, classes, strict=False):
        budget = None
        for i, (pol, r) in enumerate(sc["policies"].items()):
            row = r["series"]["p99_ms"].get(c)
            if row is None:
                continue
            t = r["series"]["t"]
            pts = [(x, y) for x, y in zip(t, row, strict=True) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=pol, lw=1.1,
                        color=_COLORS[i % len(_COLORS)],
                        ls="--" if pol == "oracle" else "-")
            cls = r["classes"].get(c)
            if cls is not None:
                budget = cls["slo"]["budget_ms"]
                metric = cls["slo"]["metric"]
                ax.set_ylabel(f"p99 {metric} (ms)", fontsize=8)
        if budget is not None:
            ax.axhline(budget, color="black", lw=0.8, ls=":", label="budget")
        _shade(ax, sc)
        ax.set_yscale("log")
        ax.set_title(c, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("simulated time (s)", fontsize=8)
    axes.flat[0].legend(fontsize=6, ncol=2)
    fig.suptitle(f"{sc['name']}: p99 of the class SLO metric per bucket", fontsize=10)
    fig.tight_layout()
    path = out / f"{sc['name']}-p99.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
