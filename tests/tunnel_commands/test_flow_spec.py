"""``type: flow`` specs and outputRef (tunnel_commands.flow, tunnel_commands.values)."""

from __future__ import annotations

from typing import Any

import pytest

from tunnel_commands import (
    FlowSpec,
    HelmSpec,
    KubernetesBackend,
    ManifestsSpec,
    OutputRef,
    TofuSpec,
    parse_command,
)
from tunnel_commands.flow import MAX_STEPS

from .helpers import command, refused, round_trips

TOFU = {"name": "infra", "type": "tofu", "git": {"url": "https://g.example.com/i.git", "ref": "m"}}
HELM = {
    "name": "app",
    "type": "helm",
    "namespace": "web",
    "chart": {"oci": "oci://r.example.com/charts/web"},
    "values": {"db": {"host": {"outputRef": {"step": "infra", "output": "db_host"}}}},
}
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}}


def test_steps_are_read_in_order_with_their_own_fields() -> None:
    manifests = {
        "name": "extra",
        "type": "manifests",
        "objects": [CONFIGMAP],
        "continueOnError": True,
    }
    parsed = parse_command(command("flow", {"steps": [TOFU, HELM, manifests]}))
    spec = parsed.spec
    assert isinstance(spec, FlowSpec)
    assert [(s.name, s.type, s.continue_on_error) for s in spec.steps] == [
        ("infra", "tofu", False),
        ("app", "helm", False),
        ("extra", "manifests", True),
    ]
    helm = spec.steps[1].spec
    assert isinstance(helm, HelmSpec)
    assert helm.values == {"db": {"host": OutputRef("infra", "db_host")}}
    round_trips(parsed)


def test_derived_names_default_to_command_and_step() -> None:
    parsed = parse_command(
        command(
            "flow",
            {"steps": [TOFU, HELM, {"name": "extra", "type": "manifests", "objects": [CONFIGMAP]}]},
        )
    )
    assert isinstance(parsed.spec, FlowSpec)
    tofu, helm, manifests = (step.spec for step in parsed.spec.steps)
    assert isinstance(tofu, TofuSpec)
    assert tofu.backend == KubernetesBackend("web-app-infra")
    assert isinstance(helm, HelmSpec)
    assert helm.release == "web-app-app"
    assert isinstance(manifests, ManifestsSpec)
    assert manifests.apply_set == "web-app-extra"


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([], "spec.steps: must have at least one step"),
        ("x", "spec.steps: must be a list"),
        ([{"type": "tofu"}], "spec.steps[0].name: required"),
        ([TOFU | {"name": "Infra"}], "spec.steps[0].name: 'Infra' is not a step name"),
        ([TOFU, TOFU], "spec.steps[1].name: 'infra' names an earlier step"),
        ([{"name": "a"}], "spec.steps[0].type: required"),
        ([TOFU | {"type": "flow"}], "spec.steps[0].type: 'flow' is not a step type"),
        ([TOFU | {"type": "shell"}], "spec.steps[0].type: 'shell' is not a step type"),
        (
            [TOFU, {"name": "q", "type": "helm", "namespace": "web"}],
            "spec.steps[1].chart: required",
        ),
        ([TOFU, HELM | {"wait": "yes"}], "spec.steps[1].wait: must be true or false"),
        ([TOFU, HELM | {"continueOnError": 1}], "spec.steps[1].continueOnError: must be true"),
        ([TOFU | {"chart": {}}], "spec.steps[0].chart: unknown field"),
        (
            [HELM, TOFU],
            "spec.steps[0].values.db.host.outputRef.step: names no earlier step: 'infra'",
        ),
        (
            [HELM | {"name": "infra", "values": {}}, HELM],
            "spec.steps[1].values.db.host.outputRef.step: step 'infra' is a helm step, "
            "which has no outputs",
        ),
        (
            [TOFU, HELM | {"values": {"x": {"outputRef": {"step": "infra"}}}}],
            "spec.steps[1].values.x.outputRef.output: required",
        ),
        (
            [TOFU, HELM | {"values": {"x": {"outputRef": {"step": "infra", "output": "a b"}}}}],
            "spec.steps[1].values.x.outputRef.output: 'a b' is not an output name",
        ),
    ],
)
def test_flow_errors_name_the_step_and_field(steps: Any, message: str) -> None:
    assert str(refused(command("flow", {"steps": steps}))).startswith(message)


def test_more_steps_than_the_limit_are_refused() -> None:
    steps = [TOFU | {"name": f"s{i}"} for i in range(MAX_STEPS + 1)]
    error = refused(command("flow", {"steps": steps}))
    assert str(error) == f"spec.steps: must have at most {MAX_STEPS} items"
