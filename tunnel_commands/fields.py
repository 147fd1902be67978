"""Reading one mapping of a spec, field by field, with the path of each field at hand.

:class:`Fields` takes the fields a spec defines and, in :meth:`Fields.finish`,
refuses any other (a misspelt field is an error, not a silent default). Every
error names the field's path.
"""

from __future__ import annotations

import re
from typing import Any

from .durations import parse_duration
from .errors import CommandSpecError, join_path

__all__ = [
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "NAME",
    "Fields",
    "check_pattern",
    "describe",
]

#: A command or step name: a lower-case RFC 1123 label, at most 53 characters
#: (Helm's limit for a release name).
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?$")
#: A namespace: a lower-case RFC 1123 label.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: An object name such as a Secret's: a lower-case RFC 1123 subdomain.
DNS_SUBDOMAIN = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_SHORT = 40


def describe(value: object) -> str:
    """A short quotation of ``value``, for values that are names, never secrets."""
    text = repr(value)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def check_pattern(value: str, path: str, pattern: re.Pattern[str], rule: str) -> str:
    if not pattern.fullmatch(value):
        raise CommandSpecError(path, f"{describe(value)} is not {rule}")
    return value


_MISSING: Any = object()


class Fields:
    """The fields of the mapping at ``path``; each accessor consumes one."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, dict):
            raise CommandSpecError(path, "must be a mapping")
        self.raw: dict[str, Any] = raw
        self.path = path
        self._seen: set[str] = set()

    def path_of(self, name: str) -> str:
        return join_path(self.path, name)

    def has(self, name: str) -> bool:
        return name in self.raw

    def take(self, name: str, *, required: bool = False) -> Any:
        """The raw value of ``name``, or ``_MISSING``; marks it known."""
        self._seen.add(name)
        value = self.raw.get(name, _MISSING)
        if value is None:
            value = _MISSING  # null reads as absent, as in Kubernetes
        if value is _MISSING and required:
            raise CommandSpecError(self.path_of(name), "required")
        return value

    @staticmethod
    def missing(value: object) -> bool:
        return value is _MISSING

    def string(
        self,
        name: str,
        *,
        pattern: re.Pattern[str] | None = None,
        rule: str = "",
        max_length: int = 4096,
    ) -> str:
        """A required, non-empty string."""
        result = self.optional_string(name, pattern=pattern, rule=rule, max_length=max_length)
        if result is None:
            raise CommandSpecError(self.path_of(name), "required")
        return result

    def optional_string(
        self,
        name: str,
        *,
        pattern: re.Pattern[str] | None = None,
        rule: str = "",
        max_length: int = 4096,
    ) -> str | None:
        value = self.take(name)
        if value is _MISSING:
            return None
        path = self.path_of(name)
        if not isinstance(value, str):
            raise CommandSpecError(path, "must be a string")
        if not value:
            raise CommandSpecError(path, "must not be empty")
        if len(value) > max_length:
            raise CommandSpecError(path, f"must be at most {max_length} characters")
        if pattern is not None:
            check_pattern(value, path, pattern, rule)
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.take(name)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise CommandSpecError(self.path_of(name), "must be true or false")
        return value

    def integer(self, name: str, default: int | None, *, minimum: int, maximum: int) -> int | None:
        value = self.take(name)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise CommandSpecError(self.path_of(name), "must be an integer")
        if not minimum <= value <= maximum:
            raise CommandSpecError(self.path_of(name), f"must be between {minimum} and {maximum}")
        return value

    def duration(self, name: str, default: int | None, *, maximum: int) -> int | None:
        value = self.take(name)
        if value is _MISSING:
            return default
        return parse_duration(value, self.path_of(name), minimum=1, maximum=maximum)

    def mapping(self, name: str, *, required: bool = False) -> Fields | None:
        value = self.take(name, required=required)
        return None if value is _MISSING else Fields(value, self.path_of(name))

    def items(self, name: str, *, required: bool = False, max_items: int) -> list[Any] | None:
        value = self.take(name, required=required)
        if value is _MISSING:
            return None
        if not isinstance(value, list):
            raise CommandSpecError(self.path_of(name), "must be a list")
        if len(value) > max_items:
            raise CommandSpecError(self.path_of(name), f"must have at most {max_items} items")
        return value

    def finish(self) -> None:
        """Refuse the fields no accessor took."""
        unknown = sorted(set(self.raw) - self._seen)
        if unknown:
            raise CommandSpecError(self.path_of(unknown[0][:_SHORT]), "unknown field")

    def one_of(self, names: tuple[str, ...]) -> str:
        """The one of ``names`` present in the mapping (exactly one must be)."""
        present = [name for name in names if self.raw.get(name) is not None]
        if len(present) != 1:
            listed = ", ".join(names)
            problem = "needs" if not present else "must have only"
            raise CommandSpecError(self.path or "spec", f"{problem} one of {listed}")
        return present[0]
