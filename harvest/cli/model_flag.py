"""The `--model-path` flag, one spelling for every command that starts a worker."""


def add_model_path(parser) -> None:
    parser.add_argument("--model-path", "--model", default=None,
                        help="local HF model directory (default: the embedded SmolLM2-135M-Instruct)")
