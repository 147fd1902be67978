# Sourced by scripts/test: make sure a browser is there for the console's tests.
#
# The console's browser tests (tests/console/browser/) drive Debian's Chromium with
# Playwright for Python (a dev dependency, installed by scripts/venv.sh). Playwright
# cannot download its own browser build here, so the tests launch the system's
# Chromium by its path: TUNNEL_TEST_CHROMIUM, default /usr/bin/chromium. When it is
# missing, this installs Debian's chromium package (as root), or says how to.
set -euo pipefail

: "${TUNNEL_TEST_CHROMIUM:=/usr/bin/chromium}"
export TUNNEL_TEST_CHROMIUM

if [ ! -x "$TUNNEL_TEST_CHROMIUM" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "no Chromium at $TUNNEL_TEST_CHROMIUM and not root to install it:" \
            "apt-get install chromium, or set TUNNEL_TEST_CHROMIUM" >&2
        return 1
    fi
    echo "==> installing Chromium (Debian's chromium package) for the console's browser tests"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core >/dev/null
fi
echo "==> Chromium for the console's browser tests: $("$TUNNEL_TEST_CHROMIUM" --version 2>/dev/null || echo "$TUNNEL_TEST_CHROMIUM")"
