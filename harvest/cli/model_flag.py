"""The flags and parser shape shared by every command that starts a worker."""


def add_worker_parser(subparsers, name: str, help: str, description: str):
    """A subcommand parser that passes unknown flags on to the worker it starts, with --model-path.

    Abbreviations are off: an abbreviated flag would otherwise swallow the worker's own flags."""
    parser = subparsers.add_parser(name, help=help, description=description, allow_abbrev=False)
    parser.add_argument("--model-path", "--model", default=None,
                        help="local HF model directory (default: the embedded SmolLM2-135M-Instruct)")
    return parser
