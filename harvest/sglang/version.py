"""The stack every module of this package was written against: SGLang's release, checked where SGLang is first
used, and what it was tested with (`harvest doctor` checks a host against it, `harvest bundle` carries it)."""

from base.errors import HarvestError

PINNED_STACK = {"torch": "2.11.0", "sglang": "0.5.12", "sglang-kernel": "0.4.2.post2", "transformers": "5.6.0",
                "llamafactory": "0.9.5"}
SGLANG_VERSION = PINNED_STACK["sglang"]


def require_pinned_sglang() -> None:
    import sglang  # deferred: doctor and bundle read the pins on hosts without a working SGLang

    if sglang.__version__ != SGLANG_VERSION:
        raise HarvestError(f"harvest's SGLang adapter was written for sglang {SGLANG_VERSION}, "
                           f"found {sglang.__version__}")
