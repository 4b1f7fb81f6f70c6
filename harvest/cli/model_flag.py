"""The flags and parser shape shared by every command that starts a worker."""


def add_worker_parser(subparsers, name: str, run, help: str, description: str):
    """A subcommand parser that runs `run` and passes unknown flags on to the worker it starts, with --model-path.

    Abbreviations are off: an abbreviated flag would otherwise swallow the worker's own flags."""
    parser = subparsers.add_parser(name, help=help, description=description, allow_abbrev=False)
    parser.set_defaults(func=run, accepts_passthrough=True)
    parser.add_argument("--model-path", "--model", default=None,
                        help="local HF model directory (default: the embedded SmolLM2-135M-Instruct)")
    return parser
