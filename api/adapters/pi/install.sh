#!/bin/sh
# Installs the pi coding agent (@PI_PACKAGE@@@PI_VERSION@) with the harness of Reef scenario
# '@SCENARIO@' from @REEF_URL@, and the reef-pi wrapper. It carries no secret: when Reef needs a
# token, pi and reef-pi read it from REEF_API_KEY in your environment.
#
#   curl -fsS '@REEF_URL@/reef/harness/install?adapter=pi&scenario=@SCENARIO@' | sh
#   REEF_PI_ROOT=/somewhere/else sh install.sh      # install root (default: ~/.reef-pi)
#
# Rerunning it installs a newer harness release if there is one and otherwise changes nothing.
set -eu

REEF_URL='@REEF_URL@'
SCENARIO='@SCENARIO@'
MODEL='@MODEL@'
CONTEXT_WINDOW='@CONTEXT_WINDOW@'
MAX_TOKENS='@MAX_TOKENS@'
PI_PACKAGE='@PI_PACKAGE@'
PI_VERSION='@PI_VERSION@'
ROOT="${REEF_PI_ROOT:-$HOME/.reef-pi}"

say() { printf 'reef-pi: %s\n' "$*"; }
die() { printf 'reef-pi: %s\n' "$*" >&2; exit 1; }

command -v node >/dev/null 2>&1 || die "Node.js >= 20.6 is needed (https://nodejs.org)"
command -v npm >/dev/null 2>&1 || die "npm is needed"
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 6) ? 0 : 1)' \
    || die "Node.js >= 20.6 is needed (found $(node --version))"

mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd -P)
# Never inside the project the agent works on: pi edits files there.
if top=$(git rev-parse --show-toplevel 2>/dev/null); then
    case "$ROOT/" in
        "$top"/*) die "install root $ROOT is inside the git project $top: set REEF_PI_ROOT elsewhere" ;;
    esac
fi

PI="$ROOT/pi/node_modules/.bin/pi"
if [ ! -x "$PI" ] || [ "$("$PI" --version 2>&1)" != "$PI_VERSION" ]; then
    say "installing $PI_PACKAGE@$PI_VERSION into $ROOT/pi"
    npm install --loglevel=error --no-audit --no-fund --prefix "$ROOT/pi" "$PI_PACKAGE@$PI_VERSION" >/dev/null \
        || die "npm could not install $PI_PACKAGE@$PI_VERSION"
fi

# put FILE: write stdin to FILE only when it differs (a rerun with nothing new changes nothing)
put() {
    tmp="$1.new.$$"
    cat >"$tmp"
    if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

mkdir -p "$ROOT/bin"
put "$ROOT/config.json" <<CONFIG_END
{"url": "$REEF_URL", "scenario": "$SCENARIO", "model": "$MODEL", "context_window": $CONTEXT_WINDOW, "max_tokens": $MAX_TOKENS}
CONFIG_END
put "$ROOT/reef-pi.mjs" <<'REEF_PI_MJS_END'
@REEF_PI_MJS@
REEF_PI_MJS_END
put "$ROOT/bin/reef-pi" <<WRAPPER_END
#!/bin/sh
exec node "$ROOT/reef-pi.mjs" "\$@"
WRAPPER_END
# pi through Reef: each run is one Reef session (x-reef-session-id), which reef-pi report quotes.
put "$ROOT/bin/pi" <<WRAPPER_END
#!/bin/sh
REEF_PI_SESSION="pi-\$(date +%Y%m%dT%H%M%S)-\$\$"
export REEF_PI_SESSION
printf '%s\n' "\$REEF_PI_SESSION" >"$ROOT/last-session"
exec "$PI" --provider reef --model "$MODEL" "\$@"
WRAPPER_END
chmod +x "$ROOT/bin/reef-pi" "$ROOT/bin/pi"

node "$ROOT/reef-pi.mjs" update
say "ready: put $ROOT/bin first on your PATH, then run pi (or reef-pi report --score 1)"
