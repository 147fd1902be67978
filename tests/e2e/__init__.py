"""End-to-end tests: the installed commands run as subprocesses, as a user runs them."""
