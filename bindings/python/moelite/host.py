"""The machine this process runs on, as the library sees it (moelite_platform_*): memory,
cgroup limits, cores, backends. Needs no model. Not named platform.py, which would shadow the
standard library's platform module.
"""
from __future__ import annotations

import ctypes
import enum
import json
from typing import Any, Dict, Union

from ._lib import lib as _c
from .errors import Status, _check


class PlatformField(enum.IntEnum):
    """moelite_platform_field: the keys of platform_get()."""
    MEM_TOTAL_BYTES = 0
    MEM_AVAILABLE_BYTES = 1
    CGROUP_LIMIT_BYTES = 2
    CGROUP_USAGE_BYTES = 3
    IS_JETSON = 4
    UNIFIED_MEMORY = 5
    CPUS_ONLINE = 6
    CPUS_ALLOWED = 7
    BIG_CORES = 8
    DEFAULT_THREADS = 9
    AUTO_BACKEND = 10
    HAS_CUDA = 11
    HAS_VULKAN = 12


def platform_get(field: Union[PlatformField, int]) -> int:
    """moelite_platform_get: one PlatformField of the machine this process runs on (read afresh
    each call; 0 where the OS does not report it; -1 for an unknown field). Needs no model."""
    return int(_c.moelite_platform_get(int(field)))


def platform_memory_available() -> int:
    """Bytes this process may still allocate: min(MemAvailable, cgroup limit - usage)
    (moelite_platform_get(MOELITE_PLATFORM_MEM_AVAILABLE_BYTES))."""
    return platform_get(PlatformField.MEM_AVAILABLE_BYTES)


def platform_describe_json() -> str:
    """The platform as the library's JSON text (moelite_platform_describe_json). The text can
    differ between calls (memory figures change). Raises MoeliteError on failure."""
    needed = ctypes.c_size_t(0)
    st = _c.moelite_platform_describe_json(None, 0, ctypes.byref(needed))
    if st not in (Status.OK, Status.ERR_BUFFER_TOO_SMALL):
        _check(st)
    for _ in range(8):
        cap = needed.value + 4096  # slack: memory figures may grow between the two calls
        buf = ctypes.create_string_buffer(cap)
        st = _c.moelite_platform_describe_json(buf, cap, ctypes.byref(needed))
        if st != Status.ERR_BUFFER_TOO_SMALL:
            break
    _check(st)
    return buf.value.decode("utf-8")


def platform_info() -> Dict[str, Any]:
    """The machine as a dict (moelite_platform_describe_json): kind, model, cpu (big cores,
    capacities), memory (total, available, cgroup, room), backends built in, auto_backend."""
    return json.loads(platform_describe_json())
