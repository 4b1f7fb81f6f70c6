"""Check `harvest ...` command lines (one per line on stdin, shell-quoted) against the real parsers: harvest's
own (`harvest.cli.main.build_parser`) and, for the flags `harvest serve` passes on, SGLang's. Used by
`scripts/gpu_first_light.sh --dry-run`; prints one line per command, exit 1 if any is refused."""

import argparse
import contextlib
import io
import shlex
import sys


class _Refused(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def check(argv: list[str]) -> str | None:
    """None if the command parses as it would run, else why not."""
    from harvest.cli.main import build_parser

    if not argv or argv[0] != "harvest":
        return "not a harvest command"
    argv = argv[1:]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args, unknown = build_parser(argv).parse_known_args(argv)
    except SystemExit:
        return err.getvalue().strip() or "refused by harvest's parser"
    if unknown and not getattr(args, "accepts_passthrough", False):
        return f"unrecognized arguments: {' '.join(unknown)}"
    if unknown and args.command == "serve":
        return _check_sglang(unknown)
    return None


def _check_sglang(passthrough: list[str]) -> str | None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from sglang.srt.server_args import ServerArgs

        parser = _RaisingParser(add_help=False, allow_abbrev=False)
        ServerArgs.add_cli_args(parser)
        try:
            parser.parse_args(["--model-path", "M", *passthrough])
        except _Refused as e:
            return f"SGLang: {e}"
    return None


def main() -> int:
    num_refused = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        problem = check(shlex.split(line))
        num_refused += problem is not None
        print(f"{'ok     ' if problem is None else 'REFUSED'} {line.strip()}" + (f"\n        {problem}" if problem else ""))
    return 1 if num_refused else 0


if __name__ == "__main__":
    sys.exit(main())
