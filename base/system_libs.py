"""Shared libraries the set-up unpacked for the PD transfer engine (mooncake needs libibverbs.so.1)."""

from base.native import NATIVE_BUILD_DIR

# scripts/syslibs.sh unpacks libibverbs1 and libnl-3 here when the system lacks them.
SYSTEM_LIBS_DIR = NATIVE_BUILD_DIR.parent / "syslibs" / "lib"


def library_path_with_system_libs(search_path: str) -> str:
    """`search_path` (an LD_LIBRARY_PATH) with the unpacked libraries' folder in front, when there is one."""
    if not SYSTEM_LIBS_DIR.is_dir() or str(SYSTEM_LIBS_DIR) in search_path.split(":"):
        return search_path
    return f"{SYSTEM_LIBS_DIR}:{search_path}" if search_path else str(SYSTEM_LIBS_DIR)
