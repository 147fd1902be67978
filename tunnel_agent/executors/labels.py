"""The labels that mark what the executors manage."""

from __future__ import annotations

__all__ = ["APPLY_SET", "APPLY_SET_RECORD", "MANAGED_BY", "MANAGED_BY_VALUE"]

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "k8s-reverse-tunnel"
#: On every applied object: the apply set (the command's name) it belongs to.
APPLY_SET = "tunnel.k8s.io/apply-set"
#: On an apply set's record ConfigMap, which must not carry APPLY_SET itself
#: (a prune listing ConfigMaps by APPLY_SET would otherwise find and delete it).
APPLY_SET_RECORD = "tunnel.k8s.io/apply-set-record"
