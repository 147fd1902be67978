"""Masking secret values out of text before it leaves the cluster."""

from __future__ import annotations

import base64
import json
import re

__all__ = ["MASK", "Masker"]

MASK = "***"


class Masker:
    """Replaces every registered secret value in a text by ``***``.

    Each value is registered with the forms it commonly takes in output: as
    is, each of its lines (a key printed line by line), its base64 encoding (a
    Secret's data) and its JSON-escaped form. Values of white space alone are
    ignored; any other value is masked, however short, since a log line that
    shows too little is better than one that shows a secret.
    """

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    @property
    def values(self) -> frozenset[str]:
        """Every form of every value registered (to mask the same elsewhere)."""
        return frozenset(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def add(self, value: str) -> None:
        """Mask ``value`` (and its common forms) from now on."""
        if not value.strip():
            return
        forms = {value, base64.b64encode(value.encode()).decode(), json.dumps(value)[1:-1]}
        if "\n" in value:
            forms.update(line.strip() for line in value.splitlines())
        added = {form for form in forms if form.strip()} - self._values
        if added:
            self._values |= added
            self._pattern = None

    def mask(self, text: str) -> str:
        """``text`` with every registered value replaced by ``***``."""
        if not self._values:
            return text
        if self._pattern is None:
            # Longest first, so that a value containing another is masked whole.
            ordered = sorted(self._values, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(value) for value in ordered))
        return self._pattern.sub(MASK, text)
