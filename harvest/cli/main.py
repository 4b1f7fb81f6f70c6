"""`harvest` command line: one subcommand per module in SUBCOMMAND_MODULES.

Each module defines `add_parser(subparsers)` (which sets `func=run` on its parser) and `run(args) -> int`.
Modules are imported lazily by name so `harvest --help` does not pay for torch or SGLang.
"""

import argparse
import importlib
import sys

from base.errors import HarvestError

SUBCOMMAND_MODULES = {
    "serve": "harvest.cli.serve",
    "deploy": "harvest.cli.deploy",
    "status": "harvest.cli.status",
    "jobs": "harvest.cli.jobs",
    "demo": "harvest.cli.demo",
    "profile": "harvest.cli.profile",
    "predictor": "harvest.cli.predictor",
    "finetune": "harvest.cli.finetune",
    "replay": "harvest.cli.replay",
    "bench": "harvest.cli.bench",
    "model": "harvest.cli.model",
    "bundle": "harvest.cli.bundle",
    "doctor": "harvest.cli.doctor",
}


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags get one line naming the problem; the usage is one `--help` away."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="harvest", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Only the chosen subcommand's module is imported; the rest register a stub for --help.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if chosen not in SUBCOMMAND_MODULES:
        chosen = None
    for name, module_name in SUBCOMMAND_MODULES.items():
        if chosen in (None, name):
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                if e.name != module_name:
                    raise
                continue
            module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "accepts_passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.passthrough = unknown
    try:
        return int(args.func(args) or 0)
    except HarvestError as e:
        print(f"harvest {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
