"""The SGLang release every module of this package was written against, checked where SGLang is first used."""

import sglang

from base.errors import HarvestError

SGLANG_VERSION = "0.5.12"


def require_pinned_sglang() -> None:
    if sglang.__version__ != SGLANG_VERSION:
        raise HarvestError(f"harvest's SGLang adapter was written for sglang {SGLANG_VERSION}, "
                           f"found {sglang.__version__}")
