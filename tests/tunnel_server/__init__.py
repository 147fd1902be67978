"""Tests of the tunnel server."""
