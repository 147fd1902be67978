"""The console's templates and scripts keep to what the Content-Security-Policy allows: no
inline script, no inline style, no event-handler attributes, nothing from another origin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tunnel_server.console.render import STATIC_DIR, TEMPLATE_DIR, make_templates

TEMPLATES = sorted(TEMPLATE_DIR.glob("*.html"))


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda path: path.name)
def test_a_template_has_no_inline_script_or_style(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", text), "inline script"
    assert "<style" not in text
    assert not re.search(r"\sstyle=", text)
    assert not re.search(r"\son[a-z]+=", text), "event-handler attribute"
    assert not re.search(r"(src|href)=\"(https?:)?//", text), "another origin"


def test_every_template_compiles_with_autoescaping() -> None:
    templates = make_templates()
    assert templates.autoescape is True
    for path in TEMPLATES:
        templates.get_template(path.name)


def test_scripts_never_write_html() -> None:
    for path in STATIC_DIR.glob("*.js"):
        text = path.read_text()
        assert "innerHTML" not in text, path.name
        assert "insertAdjacentHTML" not in text, path.name
        assert "eval(" not in text, path.name
