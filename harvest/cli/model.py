"""`harvest model make`: a model of a named shape with random weights, for hosts that cannot download one.

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import json

from base.errors import HarvestError


def add_parser(subparsers) -> None:
    from harvest.models.model_shape import SHAPES
    from harvest.models.random_model import DTYPES, TOKENIZERS

    parser = subparsers.add_parser("model", help="make a model without downloading one")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    make = actions.add_parser(
        "make", help="write config + random weights of a named shape",
        description="Write an HF model directory (config.json, sharded safetensors) with the exact tensor "
        "shapes and dtype of a named model and random values. Without a tokenizer, serve it with "
        "`harvest serve --model-path DIR --skip-tokenizer-init` and send token ids.",
    )
    make.add_argument("--shape", required=True, choices=list(SHAPES), help="named model shape")
    make.add_argument("--random", action="store_true", required=True,
                      help="random weights (the only kind: nothing is downloaded)")
    make.add_argument("--out", required=True, help="new directory to write")
    make.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="serving dtype (default bf16)")
    make.add_argument("--device", default="auto",
                      help="where the random values are drawn: cpu, cuda, or auto (default: cuda where torch sees one)")
    make.add_argument("--tokenizer", default="none", choices=TOKENIZERS,
                      help="none (token ids only) or small (a 512-token BPE, for finetuning on text)")
    make.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harvest.models.model_shape import ModelShape
    from harvest.models.random_model import RandomModelSpec, make_random_model

    if args.action != "make":
        raise HarvestError(f"unknown action {args.action!r}")
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = RandomModelSpec(shape=ModelShape.from_name(args.shape), out_dir=args.out, dtype=args.dtype,
                           device=device, tokenizer=args.tokenizer, seed=args.seed)
    print(json.dumps(make_random_model(spec)))
    return 0
