#!/bin/sh
# Installs @AGENT_NAME@ (@PACKAGE@@@VERSION@) with the harness of Reef scenario '@SCENARIO@'
# from @REEF_URL@, a `@BIN@` wrapper that sends it through Reef, and reef-@AGENT@. It carries no
# secret: when Reef needs a token, the agent and reef-@AGENT@ read it from REEF_API_KEY in your
# environment.
#
#   curl -fsS '@REEF_URL@/reef/harness/install?adapter=@AGENT@&scenario=@SCENARIO@' | sh
#   REEF_AGENT_ROOT=/somewhere/else sh install.sh      # install root (default: ~/.reef-@AGENT@)
#
# Rerunning it installs a newer harness release if there is one and otherwise changes nothing.
set -eu

REEF_URL='@REEF_URL@'
SCENARIO='@SCENARIO@'
MODEL='@MODEL@'
CONTEXT_WINDOW='@CONTEXT_WINDOW@'
MAX_TOKENS='@MAX_TOKENS@'
PACKAGE='@PACKAGE@'
VERSION='@VERSION@'
ROOT="${REEF_AGENT_ROOT:-$HOME/.reef-@AGENT@}"

say() { printf 'reef-@AGENT@: %s\n' "$*"; }
die() { printf 'reef-@AGENT@: %s\n' "$*" >&2; exit 1; }

command -v node >/dev/null 2>&1 || die "Node.js >= 20.6 is needed (https://nodejs.org)"
command -v npm >/dev/null 2>&1 || die "npm is needed"
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 6) ? 0 : 1)' \
    || die "Node.js >= 20.6 is needed (found $(node --version))"

mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd -P)
# Never inside the project the agent works on: the agent edits files there.
if top=$(git rev-parse --show-toplevel 2>/dev/null); then
    case "$ROOT/" in
        "$top"/*) die "install root $ROOT is inside the git project $top: set REEF_AGENT_ROOT elsewhere" ;;
    esac
fi

AGENT_BIN="$ROOT/agent/node_modules/.bin/@BIN@"
installed=$(node -p "require('$ROOT/agent/node_modules/$PACKAGE/package.json').version" 2>/dev/null || true)
if [ ! -x "$AGENT_BIN" ] || [ "$installed" != "$VERSION" ]; then
    say "installing $PACKAGE@$VERSION into $ROOT/agent"
    npm install --loglevel=error --no-audit --no-fund --prefix "$ROOT/agent" "$PACKAGE@$VERSION" >/dev/null \
        || die "npm could not install $PACKAGE@$VERSION"
fi

# put FILE: write stdin to FILE only when it differs (a rerun with nothing new changes nothing)
put() {
    tmp="$1.new.$$"
    cat >"$tmp"
    if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

mkdir -p "$ROOT/bin"
put "$ROOT/config.json" <<CONFIG_END
{"agent": "@AGENT@", "bin": "@BIN@", "url": "$REEF_URL", "scenario": "$SCENARIO", "model": "$MODEL", "context_window": $CONTEXT_WINDOW, "max_tokens": $MAX_TOKENS}
CONFIG_END
put "$ROOT/reef-agent.mjs" <<'REEF_AGENT_MJS_END'
@REEF_AGENT_MJS@
REEF_AGENT_MJS_END
put "$ROOT/bin/reef-@AGENT@" <<WRAPPER_END
#!/bin/sh
exec node "$ROOT/reef-agent.mjs" "\$@"
WRAPPER_END
# @BIN@ through Reef: each run is one Reef session (x-reef-session-id), which reef-@AGENT@
# report quotes.
put "$ROOT/bin/@BIN@" <<WRAPPER_END
#!/bin/sh
REEF_SESSION="@AGENT@-\$(date +%Y%m%dT%H%M%S)-\$\$"
export REEF_SESSION
printf '%s\n' "\$REEF_SESSION" >"$ROOT/last-session"
@WRAPPER@
WRAPPER_END
chmod +x "$ROOT/bin/reef-@AGENT@" "$ROOT/bin/@BIN@"

node "$ROOT/reef-agent.mjs" update
say "ready: put $ROOT/bin first on your PATH, then run @BIN@ (or reef-@AGENT@ report --score 1)"
