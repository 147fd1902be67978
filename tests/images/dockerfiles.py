"""Reading the Dockerfiles: instructions by stage, ARG defaults, exec-form lists."""

from __future__ import annotations

import io
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "images" / "agent" / "Dockerfile"
SERVER = REPO / "images" / "server" / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    name: str
    value: str


@dataclass
class Stage:
    """One FROM and what follows it; ``name`` is its AS name ("" for the last, unnamed one)."""

    base: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, name: str) -> list[str]:
        return [item.value for item in self.instructions if item.name == name]


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        [found] = [stage for stage in self.stages if stage.name == name]
        return found

    def args(self, stage: Stage) -> dict[str, str]:
        """ARG defaults visible in ``stage`` (its own, and the global ones)."""
        found = dict(self.global_args)
        for value in stage.all("ARG"):
            key, _, default = value.partition("=")
            found[key] = default
        return found


def parse(path: Path) -> Dockerfile:
    parser = DockerfileParser(fileobj=io.StringIO(path.read_text()))
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for item in parser.structure:
        name, value = item["instruction"], item["value"]
        if name == "COMMENT":
            continue
        if name == "FROM":
            words = value.split()
            stage_name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(words[0], stage_name))
        elif not stages and name == "ARG":
            key, _, default = value.partition("=")
            global_args[key] = default
        else:
            assert stages, f"{path}: {name} before the first FROM"
            stages[-1].instructions.append(Instruction(name, value))
    return Dockerfile(path, global_args, stages)


def exec_form(value: str) -> list[str]:
    """An instruction's JSON (exec form) argument list; fails for the shell form."""
    parsed = json.loads(value)
    assert isinstance(parsed, list), value
    assert all(isinstance(word, str) for word in parsed)
    return parsed


def flags(value: str) -> tuple[dict[str, str], list[str]]:
    """An instruction's leading --flag=value options, and the rest of its words."""
    words = shlex.split(value)
    options = {}
    while words and words[0].startswith("--"):
        key, _, option = words.pop(0)[2:].partition("=")
        options[key] = option
    return options, words


def labels(value: str) -> dict[str, str]:
    """A LABEL instruction's key=value pairs."""
    return dict(word.split("=", 1) for word in shlex.split(value))
