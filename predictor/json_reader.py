"""Typed reads from parsed JSON that say where and what is wrong, for profile validation."""

import math
from typing import Any

from base.errors import HarvestError


class JsonReader:
    """A view of one JSON object at a dotted location (`latency_model.solo.partitions[2]`)."""

    __slots__ = ("obj", "where", "source")

    def __init__(self, obj: Any, where: str, source: str) -> None:
        if not isinstance(obj, dict):
            raise HarvestError(f"{source}: {where or 'top level'} must be a JSON object, got {_kind(obj)}")
        self.obj, self.where, self.source = obj, where, source

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str, message: str) -> HarvestError:
        return HarvestError(f"{self.source}: {self._name(key)} {message}")

    def raw(self, key: str) -> Any:
        if key not in self.obj:
            raise self.fail(key, "is missing")
        return self.obj[key]

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def child(self, key: str) -> "JsonReader":
        return JsonReader(self.raw(key), self._name(key), self.source)

    def children(self, key: str) -> list["JsonReader"]:
        return [JsonReader(item, f"{self._name(key)}[{n}]", self.source) for n, item in enumerate(self.array(key))]

    def array(self, key: str) -> list:
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list, got {_kind(value)}")
        return value

    def text(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"must be a non-empty string, got {_kind(value)}")
        return value

    def integer(self, key: str, minimum: int | None = None) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {_kind(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, key: str, minimum: float | None = None, strict: bool = False) -> float:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, f"must be a finite number, got {_kind(value)}")
        if minimum is not None and (value <= minimum if strict else value < minimum):
            raise self.fail(key, f"must be {'>' if strict else '>='} {minimum}, got {value}")
        return float(value)

    def optional_number(self, key: str, minimum: float | None = None) -> float | None:
        return self.number(key, minimum) if self.has(key) else None


def _kind(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return type(value).__name__
    return repr(value)
