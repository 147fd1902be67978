"""Tests of the stand-in Kubernetes API server (tests.kubestub), mostly with the real kubectl."""
