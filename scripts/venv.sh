# Sourced by scripts/demo and scripts/test: make ./.venv and install the project
# into it (editable, with the dev extras), only when pyproject.toml changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "==> creating virtual environment in $venv"
    "$python" -m venv "$venv"
fi
stamp="$venv/.installed-$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "==> installing the project and its dev tools into $venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e "$root[dev]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
