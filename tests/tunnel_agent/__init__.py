"""Tests of tunnel_agent that need no server: back-off, command-line settings."""
