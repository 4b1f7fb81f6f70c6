"""`harvest jobs submit|list|show|pause|resume|cancel --admin URL`: a running worker's finetune jobs, through its
admin API (/harvest/jobs)."""

import argparse
import json
import os
from pathlib import Path

import httpx

from base.errors import HarvestError

TOKEN_ENV = "HARVEST_ADMIN_TOKEN"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("jobs", help="submit, list, pause, resume or cancel a worker's finetune jobs",
                                   description="The finetune jobs of a running `harvest serve` worker (one started "
                                   "with --tpot-slo-ms), through its admin API.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--admin", default="http://127.0.0.1:30100", help="admin URL of the worker")
    common.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"the worker's --admin-token (default: ${TOKEN_ENV})")
    common.add_argument("--json", action="store_true", help="print the JSON the worker answered")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    submit = verbs.add_parser("submit", help="submit a LlamaFactory YAML as a job", parents=[common])
    submit.add_argument("yaml", metavar="CFG.yaml", help="the job's LlamaFactory training YAML")
    submit.add_argument("--name", required=True, help="the job's name ([a-z0-9_-], at most 63 characters)")
    submit.add_argument("--priority", type=int, default=0, help="higher runs first among equal slack (default 0)")
    submit.add_argument("--deadline", default=None,
                        help="when the job's tokens are due: UNIX seconds or an ISO 8601 time (no zone: UTC)")
    submit.add_argument("--deadline-tokens", type=float, default=None,
                        help="the tokens due by --deadline (default: the whole job)")
    submit.add_argument("--best-effort", action="store_true",
                        help="queue it even if the deadline cannot be met at the measured rate")
    submit.add_argument("--publish-name", default=None,
                        help="the adapter name to publish under (default: the YAML's publish_name, if any)")
    verbs.add_parser("list", help="every job, a line each", parents=[common])
    for verb in ("show", "pause", "resume", "cancel"):
        one = verbs.add_parser(verb, help=f"{verb} one job" + (" (checkpoint it, free its memory)"
                                                                if verb == "cancel" else ""), parents=[common])
        one.add_argument("name", help="the job's name")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    admin = args.admin.rstrip("/")
    headers = {} if args.token is None else {"Authorization": f"Bearer {args.token}"}
    if args.verb == "submit":
        path = Path(args.yaml)
        if not path.is_file():
            raise HarvestError(f"{args.yaml}: no such file")
        params = {"name": args.name, "priority": args.priority, "best_effort": args.best_effort}
        params |= {k: v for k, v in (("deadline", args.deadline), ("deadline_tokens", args.deadline_tokens),
                                     ("publish_name", args.publish_name)) if v is not None}
        answer = _call("POST", f"{admin}/harvest/jobs", headers, params=params, content=path.read_bytes(),
                       timeout=300.0)  # the worker checks the job with LlamaFactory's parse first
    elif args.verb == "list":
        answer = _call("GET", f"{admin}/harvest/jobs", headers)
    elif args.verb == "show":
        answer = _call("GET", f"{admin}/harvest/jobs/{args.name}", headers)
    elif args.verb == "cancel":
        answer = _call("DELETE", f"{admin}/harvest/jobs/{args.name}", headers, timeout=300.0)
    else:
        answer = _call("POST", f"{admin}/harvest/jobs/{args.name}/{args.verb}", headers)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        for job in answer["jobs"] if "jobs" in answer else [answer]:
            print(_line(job))
    return 0


def _call(method: str, url: str, headers: dict, timeout: float = 30.0, **kwargs) -> dict:
    try:
        response = httpx.request(method, url, headers={**headers, "content-type": "application/yaml"},
                                 timeout=timeout, **kwargs)
    except httpx.HTTPError as e:
        raise HarvestError(f"cannot reach the worker's admin API at {url}: {e}") from None
    if response.status_code >= 400:
        try:
            detail = response.json()["detail"]
        except (ValueError, KeyError, TypeError):
            detail = response.text[:300]
        raise HarvestError(f"the worker refused ({response.status_code}): {detail}")
    return response.json()


def _line(job: dict) -> str:
    """A job as one line: name, state, tokens trained of its total, deadline slack, adapter."""
    slack = "no deadline" if job["deadline_s"] is None else (
        "slack unknown" if job["slack_s"] is None else f"slack {job['slack_s']:.0f} s")
    step = job["finetune"].get("step")
    return (f"{job['name']:<24} {job['state']:<10} {job['tokens']:>10.0f} / {job['tokens'] + job['remaining_tokens']:.0f}"
            f" tokens  step {step if step is not None else '-'}  {slack}  adapter {job['adapter'] or '-'}")
