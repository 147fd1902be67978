"""The two floors of the proxy benchmark (bench/relay_floor.py, bench/mux_floor.py)."""
