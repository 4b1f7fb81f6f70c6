"""Reading flags out of an argv list (SGLang's, passed through by harvest's commands) without parsing it whole."""

from base.errors import HarvestError


def has_flag(argv: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def port_flag(argv: list[str], flag: str, default: int) -> int:
    value = flag_value(argv, flag)
    if value is None:
        return default
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise HarvestError(f"{flag} {value!r} is not a TCP port (1-65535)")
    return int(value)
