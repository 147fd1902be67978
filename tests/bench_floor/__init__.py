"""The relay floor of the proxy benchmark (bench/relay_floor.py), run as processes."""
