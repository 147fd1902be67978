# Sourced by scripts/demo and scripts/test: make ./.venv and install the project
# into it (editable, with the dev extras), only when pyproject.toml or setup.py
# changed; then compile the request path in place when its sources changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "==> creating virtual environment in $venv"
    "$python" -m venv "$venv"
fi
stamp="$venv/.installed-$(cat "$root/pyproject.toml" "$root/setup.py" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "==> installing the project and its dev tools into $venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # The compiled modules are built in place below, not by pip.
    TUNNEL_PURE_PYTHON=1 "$venv/bin/python" -m pip install --quiet -e "$root[dev]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
"$venv/bin/python" "$root/scripts/compiled.py"
cd "$root"
