"""The printed comparison of a results.json: one row per policy."""

from rich.console import Console
from rich.table import Table


def _fmt(value, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_comparison(results: dict, console: Console) -> None:
    target = results["config"]["tpot_slo_ms"]
    notes = []
    if results["mode"] == "simulated":
        p = results["profile"]
        source = (
            "[bold red]SYNTHETIC profile (made-up numbers, not measured)[/bold red]: "
            if p["is_synthetic"]
            else "profile: "
        ) + f"{p['device']}, created {p['created_utc']}"
    else:
        source = f"live: {results['target']}"
    table = Table(
        title=f"{results['trace']['name']} ({results['trace']['num_requests']} requests), TPOT target {target:g} ms",
        caption=source,
    )
    for column in (
        "policy",
        "steps in target",
        "step p99 ms",
        "TPOT p50 ms",
        "TPOT p90 ms",
        "TPOT p99 ms",
        "queue p99 s",
        "finetune tok/s",
        "samples/s",
        "on decode dev tok/s",
        "vs separate",
        "vs static",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, entry in results["policies"].items():
        if entry.get("status") != "ok":
            table.add_row(name, "[dim]n/a[/dim]", *[""] * 10)
            notes.append(f"{name} not applicable: {entry.get('reason', '')}")
            continue
        d, f = entry["decode"], entry["finetune"]
        attainment = d["step_slo_attainment"]
        table.add_row(
            name,
            _fmt(None if attainment is None else 100 * attainment, ".2f", "%"),
            _fmt(d["step_latency_ms_p99"]),
            _fmt(d["tpot_ms_p50"]),
            _fmt(d["tpot_ms_p90"]),
            _fmt(d["tpot_ms_p99"]),
            _fmt(d["queue_delay_s_p99"], ".2f"),
            _fmt(f.get("tokens_per_s"), ".0f"),
            _fmt(f.get("samples_per_s"), ".2f"),
            _fmt(f.get("decode_device_tokens_per_s"), ".0f"),
            _fmt(f.get("ratio_to_separate"), ".2f", "x"),
            _fmt(f.get("ratio_to_static"), ".2f", "x"),
        )
    console.print(table)
    if "jobs" in results:
        print_jobs(results["jobs"], console)
    if "fleet" in results:
        print_fleet(results["fleet"], console)
    for note in [*notes, *results.get("notes", [])]:
        console.print(f"[dim]note: {note}[/dim]")


def print_jobs(jobs: dict, console: Console) -> None:
    """The job-arrival trace under each job policy, all on the harvest policy's device."""
    table = Table(
        title=f"jobs {jobs['spec']} ({jobs['num_jobs']} jobs, load {jobs['load']:.2f} of the harvest "
        f"{jobs['harvest_tokens_per_s']:.0f} tok/s), harvest policy",
        caption=f"switch {jobs['switch_s']:g} s, one-at-a-time restart {jobs['restart_s']:g} s; tokens trained "
        "while serving the requests; deadlines judged after the jobs drain on the idle device",
    )
    for column in ("job policy", "deadlines met", "attainment", "tokens trained", "steps in target",
                   "measured tok/s", "mean completion s", "makespan s", "switches"):
        table.add_column(column, justify="left" if column == "job policy" else "right")
    for name, row in jobs["policies"].items():
        attainment = row["step_slo_attainment"]
        table.add_row(
            name,
            f"{row['num_deadlines_met']}/{row['num_with_deadline']}",
            _fmt(row["deadline_attainment"], ".2f"),
            str(row["tokens_trained"]),
            _fmt(None if attainment is None else 100 * attainment, ".2f", "%"),
            _fmt(row["measured_harvest_tokens_per_s"], ".0f"),
            _fmt(row["mean_completion_s"]),
            _fmt(row["makespan_s"]),
            str(row["num_switches"]),
        )
    console.print(table)


def print_fleet(fleet: dict, console: Console) -> None:
    """One row per fleet size, every worker running the harvest policy on its own load."""
    policy, cost = fleet["round_policy"], fleet["sync_cost"]
    every = " or ".join(x for x in (policy["every_tokens"] and f"{policy['every_tokens']} tokens",
                                    policy["every_s"] and f"{policy['every_s']:g} s") if x)
    table = Table(
        title=f"fleet of harvest workers ({fleet['load']} load), a round every {every}",
        caption=f"sync: {cost['round_latency_ms']:g} ms + ring all-reduce of {cost['adapter_bytes'] / 1e6:.1f} MB at "
        f"{cost['link_gbps']:g} Gbit/s, charged to finetune time; wasted tokens 0 by design (fleet_sync.py keeps "
        "what is trained while a round is in flight)",
    )
    for column in ("workers", "rounds/h", "tokens/round", "fleet tok/s", "vs one worker", "steps in target (min)",
                   "sync ms/round", "sync share", "sync lost tok", "wait s/round", "wasted tok"):
        table.add_column(column, justify="right")
    for row in fleet["rows"]:
        attainment = row["steps_in_target_min"]
        table.add_row(
            str(row["num_workers"]),
            _fmt(row["rounds_per_hour"], ".1f"),
            _fmt(row["tokens_per_round"], ".0f"),
            _fmt(row["fleet_tokens_per_s"], ".0f"),
            _fmt(row["ratio_to_one_worker"], ".2f", "x"),
            _fmt(None if attainment is None else 100 * attainment, ".2f", "%"),
            _fmt(row["sync_ms_per_round"], ".1f"),
            _fmt(None if row["sync_share"] is None else 100 * row["sync_share"], ".3f", "%"),
            _fmt(row["sync_lost_tokens"], ".0f"),
            _fmt(row["round_wait_s_mean"], ".2f"),
            str(row["wasted_tokens"]),
        )
    console.print(table)
