"""``slo-loadtest``: run a sweep, re-judge saved results, compare sweeps, drive the load-test Job
in a cluster.

Exit codes of ``run``, ``job`` and ``analyze``: 0 the verdict passed, 1 it failed (the required
rate was not met; with no ``--require-rate``, some rate failed), 2 bad usage, 3 the sweep is
incomplete (server unreachable or died, guidellm failed) and the report is partial, or the
verdict is inconclusive (it hangs on a rate where the client fell behind). ``compare``:
0, or 2 on bad input. ``k8s``: 2 for no kubeconfig or a refused request, 3 for an unreachable
API server or results not there yet (slo_loadtest.exit_codes).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from slo_loadtest import __version__, validation
from slo_loadtest.config import Criteria, SweepConfig, env_var, field_default, field_help
from slo_loadtest.exit_codes import EXIT_FAIL, EXIT_INCOMPLETE, EXIT_PASS, EXIT_USAGE

# field -> flag (default: --field-name with a trailing _s dropped)
FLAG_NAMES = {
    "unique_media": "--unique-media/--reuse-media",
    "search_beyond": "--search-beyond/--no-search-beyond",
    "connection_per_request": "--connection-per-request/--keep-alive",
}


def _flag(name: str) -> str:
    if name in FLAG_NAMES:
        return FLAG_NAMES[name]
    base = name[:-2] if name.endswith("_s") else name
    return "--" + base.replace("_", "-")


def _bad(fn: Callable[[Any], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def cb(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return value
        try:
            return fn(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return cb


def _positive(what: str) -> Callable[[Any], Any]:
    return lambda v: validation.check_positive(v, what)


def _non_negative(what: str) -> Callable[[Any], Any]:
    def check(v: float) -> float:
        if v < 0 or v != v:
            raise ValueError(f"{what} must be >= 0, got {v:g}")
        return v

    return check


VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "target": validation.check_target,
    "extra_body": validation.parse_extra_body,
    "rates": validation.parse_rates,
    "workloads": validation.parse_workloads,
    "duration_s": _positive("the duration"),
    "warmup_s": _non_negative("the warm-up"),
    "step_timeout_s": _non_negative("the step timeout"),
    "request_timeout_s": _positive("the request timeout"),
    "slo_ms": validation.check_slo_ms,
    "min_achieved_ratio": lambda v: validation.check_ratio(v, "the achieved ratio"),
    "max_error_ratio": lambda v: validation.check_ratio(v, "the error ratio"),
    "max_dispatch_delay_ms": _positive("the dispatch-delay bound"),
    "require_rate": _non_negative("the required rate"),
    "search_max_rate": _positive("the search bound"),
    "search_step": _non_negative("the search step"),
    "search_resolution": _positive("the search resolution"),
    "prompt_tokens": _positive("prompt tokens"),
    "output_tokens": _positive("output tokens"),
    "media_prompt_tokens": _non_negative("media prompt tokens"),
    "video_frames": _positive("video frames"),
    "video_width": _positive("video width"),
    "video_height": _positive("video height"),
    "video_fps": _positive("video fps"),
    "video_codec": validation.check_video_codec,
    "image_width": _positive("image width"),
    "image_height": _positive("image height"),
    "images_per_request": _positive("images per request"),
    "max_workers": _positive("max workers"),
    "report_samples": _non_negative("report samples"),
}


def _display(v: Any) -> str:
    if isinstance(v, tuple):
        if v and all(isinstance(x, float) for x in v):
            if list(v) == [float(i) for i in range(int(v[0]), int(v[-1]) + 1)]:
                return f"{v[0]:g}..{v[-1]:g}"
            return ",".join(f"{x:g}" for x in v)
        return ",".join(str(x) for x in v)
    return str(v)


def config_options(
    names: list[str] | None = None, required_target: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """click options for SweepConfig fields: defaults and help from config.py, env vars
    SLO_LOADTEST_<FIELD>."""
    all_fields = [f for f in dataclasses.fields(SweepConfig)]
    chosen = [f for f in all_fields if names is None or f.name in names]

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(chosen):
            default = field_default(f.name)
            kw: dict[str, Any] = {
                "envvar": env_var(f.name),
                "show_envvar": True,
                "help": field_help(f.name),
            }
            if f.name in VALIDATORS:
                kw["callback"] = _bad(VALIDATORS[f.name])
            if isinstance(default, bool):
                kw.update(default=default, show_default=True)
                fn = click.option(_flag(f.name), f.name, **kw)(fn)
                continue
            if isinstance(default, tuple):
                kw.update(type=str, default=_display(default), show_default=True)
            elif isinstance(default, Path):
                kw.update(
                    type=click.Path(path_type=Path, file_okay=False),
                    default=str(default) if str(default) not in ("", ".") else None,
                    show_default=True,
                )
            elif isinstance(default, int):
                kw.update(type=int, default=default, show_default=True)
            elif isinstance(default, float):
                kw.update(type=float, default=default, show_default=True)
            else:
                kw.update(type=str, default=default or None, show_default=bool(default))
            if f.name == "target" and required_target:
                kw["required"] = True
            if f.name in ("api_key", "extra_body"):
                kw["show_default"] = False
            if f.name == "extra_body":
                kw["metavar"] = "JSON"
            fn = click.option(_flag(f.name), f.name, **kw)(fn)
        return fn

    return deco


def build_config(values: dict[str, Any]) -> SweepConfig:
    known = {f.name for f in dataclasses.fields(SweepConfig)}
    if not values.get("target"):
        # click 8.4 does not enforce `required` on an option with a callback
        raise click.BadParameter(
            "a target URL is required (or SLO_LOADTEST_TARGET)", param_hint="'--target'"
        )
    kwargs = {k: v for k, v in values.items() if k in known and v is not None}
    cfg = SweepConfig(**kwargs)
    if cfg.api_key and cfg.target_authorization:
        # both would be the Authorization header: one would silently replace the other
        raise click.BadParameter(
            "give the server's credentials once: user:password@ in the target URL (HTTP Basic) "
            "or --api-key (Bearer), not both",
            param_hint="'--api-key'",
        )
    if cfg.warmup_s >= cfg.duration_s:
        raise click.BadParameter(
            f"the warm-up ({cfg.warmup_s:g} s) must be shorter than the duration "
            f"({cfg.duration_s:g} s)",
            param_hint="'--warmup'",
        )
    if cfg.video_codec == "h264" and (cfg.video_width % 2 or cfg.video_height % 2):
        raise click.BadParameter(
            f"h264 (yuv420p) needs an even width and height, got "
            f"{cfg.video_width}x{cfg.video_height}",
            param_hint="'--video-codec'",
        )
    if cfg.tokenizer and not Path(cfg.tokenizer).is_dir():
        raise click.BadParameter(f"{cfg.tokenizer} is not a directory", param_hint="'--tokenizer'")
    return cfg


def in_kubernetes() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="slo-loadtest")
def cli() -> None:
    """SLO load tests for OpenAI-compatible (vLLM) servers, driven by guidellm."""


def _do_run(values: dict[str, Any], with_plots: bool, print_summary: bool | None) -> int:
    from slo_loadtest import guidellm_adapter as gl
    from slo_loadtest.outputs import summary_block
    from slo_loadtest.summary import build_summary, now_iso
    from slo_loadtest.sweep import Sweep, config_record

    cfg = build_config(values)
    started_at = now_iso()
    # SIGTERM (a Job's deadline, `kubectl delete`) ends the sweep like Ctrl-C: the running
    # guidellm is killed and the partial report is still written.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    outcome = Sweep(cfg, log=lambda s: click.echo(s, err=True)).run()
    summary = build_summary(
        outcome.results,
        cfg.criteria,
        workloads=cfg.workloads,
        target=cfg.target,
        model=outcome.model,
        guidellm_version=gl.guidellm_version(),
        config={
            **config_record(cfg, outcome.seed),
            "started_at": started_at,
            "tool_version": __version__,
            "timings": outcome.timings,
        },
        require_rate=cfg.require_rate or None,
        aborted=outcome.aborted,
        source="run",
    )
    return _finish(
        summary,
        cfg.out,
        with_plots,
        cfg.pushgateway,
        cfg.push_job,
        print_summary,
        summary_block,
        cfg.push_release,
    )


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _finish(
    summary: dict[str, Any],
    out: Path,
    with_plots: bool,
    pushgateway: str,
    push_job: str,
    print_summary: bool | None,
    block: Callable[[Any], str],
    push_release: str = "",
) -> int:
    from slo_loadtest.outputs import write_outputs

    paths = write_outputs(summary, out, with_plots=with_plots)
    for name, w in summary["workloads"].items():
        hp, inc = w["highest_passing_rate"], w.get("first_inconclusive_rate")
        click.echo(
            f"{name}: highest passing rate {'none' if hp is None else f'{hp:g} req/s'}"
            + ("" if inc is None else f" (inconclusive from {inc:g} req/s: client fell behind)"),
            err=True,
        )
    click.echo(f"verdict: {summary['verdict'].upper()}  ({paths['markdown']})", err=True)
    if pushgateway:
        _push(pushgateway, summary, push_job, push_release)
    if print_summary is None:
        print_summary = in_kubernetes()
    if print_summary:
        click.echo(block(summary), nl=False)
    return exit_code(summary)


def _push(pushgateway: str, summary: dict[str, Any], job: str, release: str = "") -> None:
    """A failed push is a warning: the verdict, not the dashboard, sets the exit code."""
    from slo_loadtest.pushgateway import push

    try:
        for url in push(pushgateway, summary, job=job, release=release):
            click.echo(f"pushed {url}", err=True)
    except RuntimeError as exc:
        click.echo(f"warning: {exc}", err=True)


def exit_code(summary: dict[str, Any]) -> int:
    # inconclusive (the client fell behind where the verdict depends on it) is not "the SLO
    # failed": like a partial sweep, it needs a rerun, not a fix to the server
    if not summary["complete"] or summary["verdict"] == "inconclusive":
        return EXIT_INCOMPLETE
    return EXIT_PASS if summary["verdict"] == "pass" else EXIT_FAIL


_plots_opt = click.option(
    "--plots/--no-plots", "with_plots", default=True, show_default=True, help="Draw the PNG plots."
)
_print_opt = click.option(
    "--print-summary/--no-print-summary",
    "print_summary",
    default=None,
    envvar=env_var("print_summary"),
    show_envvar=True,
    help="Print the summary JSON between markers on stdout (default: only inside Kubernetes, "
    "where `slo-loadtest k8s fetch` reads it from the pod log).",
)


@cli.command()
@config_options()
@_plots_opt
@_print_opt
def run(with_plots: bool, print_summary: bool | None, **values: Any) -> None:
    """Sweep constant request rates against --target and judge each against the SLO."""
    sys.exit(_do_run(values, with_plots, print_summary))


@cli.command()
@config_options(required_target=True)
@_plots_opt
def job(with_plots: bool, **values: Any) -> None:
    """Container entrypoint of the load-test Job: `run` configured entirely by SLO_LOADTEST_*
    environment variables, output in /results unless SLO_LOADTEST_OUT says otherwise; prints
    the summary between markers for `slo-loadtest k8s fetch`; writes OUT/exit_code and OUT/.done
    like the chart's Job script."""
    if not os.environ.get(env_var("out")) and values.get("out") == field_default("out"):
        values["out"] = Path("/results")
    rc = _do_run(values, with_plots, True)
    out = Path(values["out"])
    (out / "exit_code").write_text(f"{rc}\n")
    (out / ".done").touch()
    sys.exit(rc)


@cli.command()
@click.argument("reports", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--slo-ms",
    type=float,
    default=Criteria.slo_ms,
    show_default=True,
    envvar=env_var("slo_ms"),
    callback=_bad(VALIDATORS["slo_ms"]),
    help=field_help("slo_ms"),
)
@click.option(
    "--min-achieved-ratio",
    type=float,
    default=Criteria.min_achieved_ratio,
    show_default=True,
    callback=_bad(VALIDATORS["min_achieved_ratio"]),
    help=field_help("min_achieved_ratio"),
)
@click.option(
    "--max-error-ratio",
    type=float,
    default=Criteria.max_error_ratio,
    show_default=True,
    callback=_bad(VALIDATORS["max_error_ratio"]),
    help=field_help("max_error_ratio"),
)
@click.option(
    "--max-dispatch-delay-ms",
    type=float,
    default=Criteria.max_dispatch_delay_ms,
    show_default=True,
    callback=_bad(VALIDATORS["max_dispatch_delay_ms"]),
    help=field_help("max_dispatch_delay_ms"),
)
@click.option(
    "--require-rate",
    type=float,
    default=0.0,
    show_default=True,
    callback=_bad(VALIDATORS["require_rate"]),
    help=field_help("require_rate"),
)
@click.option(
    "--workload",
    default="",
    help="Name the workload of these reports (default: the "
    "'workload' label slo-loadtest puts in its reports, else the file name).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Write summary.json, results.csv, report.md and plots here "
    "(default: print the Markdown report only).",
)
@click.option("--pushgateway", default="", help=field_help("pushgateway"))
@_plots_opt
def analyze(
    reports: tuple[Path, ...],
    slo_ms: float,
    min_achieved_ratio: float,
    max_error_ratio: float,
    max_dispatch_delay_ms: float,
    require_rate: float,
    workload: str,
    out: Path | None,
    pushgateway: str,
    with_plots: bool,
) -> None:
    """Re-judge saved guidellm JSON reports, slo-loadtest summaries or run directories."""
    from slo_loadtest.analyze import load_inputs
    from slo_loadtest.report import to_markdown
    from slo_loadtest.summary import build_summary

    try:
        loaded = load_inputs(list(reports), workload)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'REPORTS'") from None
    criteria = Criteria(
        slo_ms=slo_ms,
        min_achieved_ratio=min_achieved_ratio,
        max_error_ratio=max_error_ratio,
        max_dispatch_delay_ms=max_dispatch_delay_ms,
    )
    summary = build_summary(
        loaded.results,
        criteria,
        workloads=loaded.workloads,
        target=loaded.target,
        model=loaded.model,
        guidellm_version=",".join(sorted(loaded.guidellm_versions)),
        config=loaded.config,
        require_rate=require_rate or None,
        aborted=loaded.aborted,
        source="analyze " + " ".join(str(p) for p in reports),
    )
    if out is None:
        click.echo(to_markdown(summary))
        if pushgateway:
            _push(pushgateway, summary, "slo_loadtest")
        sys.exit(exit_code(summary))
    from slo_loadtest.outputs import summary_block

    sys.exit(_finish(summary, out, with_plots, pushgateway, "slo_loadtest", False, summary_block))


class _InputError(click.ClickException):
    """Bad input found after parsing: one 'Error: ...' line, exit 2 like a usage error."""

    exit_code = EXIT_USAGE


@cli.command()
@click.argument("configs", nargs=-1, required=True, metavar="LABEL=PATH...")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Write compare.md and compare-<workload>.png here.",
)
@click.option(
    "--slo-ms",
    type=float,
    default=Criteria.slo_ms,
    show_default=True,
    callback=_bad(VALIDATORS["slo_ms"]),
    help="SLO (ms) shown and drawn for a config without summary.json; one with it uses its own.",
)
@click.option(
    "--workloads",
    default=None,
    help="Comma list of workloads to compare (default: every workload in the inputs).",
)
def compare(configs: tuple[str, ...], out: Path, slo_ms: float, workloads: str | None) -> None:
    """Put sweeps side by side ("did my change help?").

    One LABEL=PATH per sweep, PATH a run directory or its results.csv. Per workload, p95 total
    latency and pass/fail per rate and config, and each config's highest passing rate; pass/fail
    is as each run judged it. Exit 0, or 2 on bad input (nothing is written then)."""
    from slo_loadtest import compare as cmp
    from slo_loadtest.plots import plot_compare

    try:
        loaded = cmp.load_configs(list(configs), slo_ms)
        names = cmp.select_workloads(loaded, workloads)
    except cmp.CompareError as exc:
        raise _InputError(str(exc)) from None
    # everything is read and checked before the first write
    plots: list[str] = []
    for w in names:
        series = [
            (c.label, [(p.rate, p.latency_p95_ms, p.passed) for p in c.points.get(w, {}).values()])
            for c in loaded
        ]
        path = out / cmp.plot_name(w)
        plots.append(str(plot_compare(w, series, cmp.slo_lines(loaded, w), path)))
    md = out / cmp.MD_NAME
    md.write_text(cmp.to_markdown(loaded, names, plots))
    # runs with other settings (output tokens, duration, SLO, model, ...) are not like for like
    for line in cmp.config_warnings(loaded, names):
        click.echo(f"warning: {line}", err=True)
    click.echo("\n".join(cmp.tables(loaded, names)))
    click.echo(f"wrote {md} and {len(plots)} plot(s)", err=True)


def main() -> None:
    cli(prog_name="slo-loadtest")


def _add_k8s() -> None:
    from slo_loadtest.k8s_cli import k8s

    cli.add_command(k8s)


_add_k8s()


if __name__ == "__main__":
    main()
