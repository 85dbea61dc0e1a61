"""The figures of the outage benchmark (``outage.py``): from what one run recorded to the table
and the plot. Pure: no process, no Redis, no network (``outage.py --from-json`` redraws with it).

Every time is in seconds from the start of the run's producer. Reports are bucketed by the second
they finished (throughput) or were published (latency); an order counts as charged at its first
charge in the gateway's log.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

MODES = {
    "hang": "the gateway hangs (accepts connections, never answers; client timeout 2 s)",
    "refuse": "the gateway refuses connections",
    "503": "the gateway answers 503",
}
LABELS = {
    "plain": "(1) plain Celery",
    "pybreaker": "(2) pybreaker+Redis",
    "resilient": "(3) ResilientTask",
}
WARMUP = 5.0  # seconds of the run before the baseline window starts
LATE = 1.0  # a report slower than this (seconds, publish -> finish) is late


@dataclass
class Run:
    """What one variant went through in one outage mode: times in seconds from the start."""

    mode: str
    variant: str
    seconds: float
    outage: tuple[float, float] = (0.0, 0.0)  # when the gateway went down and came back
    ended: float = 0.0  # when the wait after the producer ended
    reports: list[float] = field(default_factory=list)  # publish time of report n
    charges: list[float] = field(default_factory=list)  # publish time of order n
    finished: list[tuple[int, float]] = field(default_factory=list)  # report n, finish time
    calls: list[tuple[int, float, float, str]] = field(default_factory=list)  # client's calls
    failed: list[tuple[int, float]] = field(default_factory=list)  # order, its FAILURE
    gateway: list[tuple[float, int, str]] = field(default_factory=list)  # what it received
    parked: list[int] = field(default_factory=list)  # orders in the back-out store at the end
    note: str = ""


# -- the figures --------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Figures:
    """One run's figures: the outage window against the pre-outage window of the same run."""

    base_rate: float
    rate: float  # reports finished per second during the outage
    min_rate: int  # the outage's slowest second
    base_p50: float
    base_p99: float
    p50: float  # latency of the reports published during the outage
    p99: float
    worst: float
    late: float  # the share of them that took more than LATE seconds
    p99_after: float  # p99 latency of the reports published after the recovery
    gateway_calls: int  # requests the gateway received during the outage
    client_calls: int  # calls the workers started during the outage
    once: int
    twice: int
    failed: int
    parked: int
    unfinished: int
    #: Seconds from the recovery until every order published before it was charged.
    all_charged: float | None
    per_second: list[int]  # reports finished in each second
    p99_per_second: list[float]  # p99 latency of the reports published in each second
    charged: list[int]  # orders charged by the end of each second


def figures(run: Run) -> Figures:
    start, end = run.outage
    base = (min(WARMUP, start / 2), start)
    seconds = math.ceil(max(run.ended, run.seconds))
    done = dict(run.finished)
    latency = [
        done.get(n, run.ended) - published for n, published in enumerate(run.reports)
    ]  # a report that never ran counts with the time it waited

    def published_in(a: float, b: float) -> list[float]:
        return [lat for lat, p in zip(latency, run.reports, strict=True) if a <= p < b]

    def finished_in(a: float, b: float) -> int:
        return sum(a <= t < b for t in done.values())

    per_second = [finished_in(s, s + 1) for s in range(seconds)]
    times = Counter(n for _, n, outcome in run.gateway if outcome == "charged")
    first: dict[int, float] = {}
    for t, n, outcome in run.gateway:
        if outcome == "charged":
            first.setdefault(n, t)
    failed = {n for n, _ in run.failed}
    parked = set(run.parked) - set(times)
    orders = range(len(run.charges))
    once = sum(times[n] == 1 for n in orders)
    twice = sum(times[n] >= 2 for n in orders)
    lost = sum(n in failed and n not in times for n in orders)
    backlog = [first.get(n) for n, published in enumerate(run.charges) if published < end]
    return Figures(
        base_rate=finished_in(*base) / (base[1] - base[0]),
        rate=finished_in(start, end) / (end - start),
        min_rate=min(per_second[math.ceil(start) : math.floor(end)] or [0]),
        base_p50=percentile(published_in(*base), 0.5),
        base_p99=percentile(published_in(*base), 0.99),
        p50=percentile(published_in(start, end), 0.5),
        p99=percentile(published_in(start, end), 0.99),
        worst=max(published_in(start, end) or [math.nan]),
        late=sum(lat > LATE for lat in published_in(start, end))
        / max(1, len(published_in(start, end))),
        p99_after=percentile(published_in(end, run.seconds), 0.99),
        gateway_calls=sum(start <= t < end for t, _, _ in run.gateway),
        client_calls=sum(start <= a < end for _, a, _, _ in run.calls),
        once=once,
        twice=twice,
        failed=lost,
        parked=len(parked),
        unfinished=len(run.charges) - once - twice - lost - len(parked),
        all_charged=None if None in backlog else max(t for t in backlog if t is not None) - end,
        per_second=per_second,
        p99_per_second=[percentile(published_in(s, s + 1), 0.99) for s in range(seconds)],
        charged=[sum(t < s + 1 for t in first.values()) for s in range(seconds)],
    )


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def _ratio(a: float, b: float) -> str:
    return "-" if not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}"


def report(runs: list[Run]) -> None:
    start = runs[0].outage[0]
    print(
        "\nReports: rep/s, finished per second during the outage, and its ratio to the same "
        f"run's pre-outage window ({min(WARMUP, start / 2):.0f}-{start:.0f} s); min/s, the "
        "outage's slowest second; p50, p99 (ms): publish -> finish of the reports published "
        f"during the outage; >{LATE:.0f}s: the share of them that took longer; p99 after: of "
        "those published after the recovery. gw calls: requests the gateway received during the "
        "outage (refuse: connections the workers attempted; none reach it). Orders: charged "
        "once, twice or more (the gateway's log), failed (Celery FAILURE, retries spent: lost), "
        "parked (back-out store), unfinished (still retrying when the wait ended); all charged: "
        "seconds from the gateway's recovery until every order published before it was charged."
    )
    header = (
        f"{'variant':<21}{'rep/s':>6}{'xbase':>6}{'min/s':>6}{'p50':>7}{'p99':>7}"
        f"{'>' + format(LATE, '.0f') + 's':>5}{'p99 after':>10}{'gw calls':>9}{'once':>6}"
        f"{'2x+':>5}{'failed':>7}{'parked':>7}{'unfin':>6}{'all charged':>12}"
    )
    for mode in dict.fromkeys(r.mode for r in runs):
        mode_runs = [r for r in runs if r.mode == mode]
        start, end = mode_runs[0].outage
        print(f"\n{mode}: {MODES[mode]}, {start:.0f}-{end:.0f} s of {mode_runs[0].seconds:.0f} s")
        print(header)
        for run in mode_runs:
            f = figures(run)
            calls = f.client_calls if mode == "refuse" else f.gateway_calls
            recovered = "never" if f.all_charged is None else f"{f.all_charged:.1f} s"
            print(
                f"{LABELS[run.variant]:<21}{f.rate:>6.1f}{_ratio(f.rate, f.base_rate):>6}"
                f"{f.min_rate:>6}{ms(f.p50):>7}{ms(f.p99):>7}{f.late:>5.0%}"
                f"{ms(f.p99_after):>10}{calls:>9}{f.once:>6}{f.twice:>5}{f.failed:>7}"
                f"{f.parked:>7}{f.unfinished:>6}{recovered:>12}"
            )
        for run in mode_runs:
            f = figures(run)
            start, end = run.outage
            outcomes = Counter(o for _, a, _, o in run.calls if start <= a < end)
            print(
                f"  {LABELS[run.variant]}: baseline {f.base_rate:.1f} reports/s, p50 "
                f"{ms(f.base_p50)} ms, p99 {ms(f.base_p99)} ms; slowest report published in the "
                f"outage {ms(f.worst)} ms; client calls during the outage {f.client_calls} ("
                + ", ".join(f"{k} {v}" for k, v in outcomes.most_common())
                + f"), {len(run.calls)} in all; waited until {run.ended:.0f} s"
                + (f"; {run.note}" if run.note else "")
            )


# -- the plot -----------------------------------------------------------------------------------
COLORS = {"plain": "#d62728", "pybreaker": "#ff7f0e", "resilient": "#1f77b4"}
TITLES = {
    "hang": "gateway hangs",
    "refuse": "gateway refuses connections",
    "503": "gateway answers 503",
}


def plot(runs: list[Run], path: Path, caption: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    modes = list(dict.fromkeys(r.mode for r in runs))
    fig, axes = plt.subplots(
        3, len(modes), figsize=(4.6 * len(modes), 8.6), sharex=True, squeeze=False
    )
    for col, mode in enumerate(modes):
        mode_runs = [r for r in runs if r.mode == mode]
        start, end = mode_runs[0].outage
        for run in mode_runs:
            f = figures(run)
            xs = [s + 0.5 for s in range(len(f.per_second))]
            style = {"color": COLORS[run.variant], "linewidth": 1.4, "label": LABELS[run.variant]}
            axes[0][col].plot(xs, f.per_second, **style)
            axes[1][col].plot(xs, f.p99_per_second, **style)
            axes[2][col].plot([s + 1 for s in range(len(f.charged))], f.charged, **style)
        published = [sum(t < s + 1 for t in mode_runs[0].charges) for s in range(len(xs))]
        axes[2][col].plot(
            [s + 1 for s in range(len(published))],
            published,
            color="grey",
            linestyle="--",
            linewidth=1,
            label="charges published",
        )
        axes[0][col].set_title(TITLES[mode])
        for ax in axes[:, col]:
            ax.axvspan(start, end, color="#d62728", alpha=0.08, linewidth=0)
            ax.grid(alpha=0.3)
        axes[1][col].set_yscale("log")
        axes[2][col].set_xlabel("seconds")
    axes[0][0].set_ylabel("reports finished / s")
    axes[1][0].set_ylabel("report p99 latency (s)\nby second published")
    axes[2][0].set_ylabel("orders charged")
    handles, labels = axes[2][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False)
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=8, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    # A few dozen colours are all the figure has: a palette PNG is a third of the size.
    drawn = io.BytesIO()
    fig.savefig(drawn, format="png", dpi=100)
    plt.close(fig)
    Image.open(drawn).convert("RGB").quantize(colors=64).save(path, optimize=True)
