# opencode resolves {env:REEF_API_KEY} in its provider entry; Reef without tokens ignores it.
REEF_API_KEY="\${REEF_API_KEY:-none}"
OPENCODE_CONFIG_CONTENT='{"model": "reef/$MODEL", "autoupdate": false, "share": "disabled"}'
OPENCODE_DISABLE_AUTOUPDATE=1
export REEF_API_KEY OPENCODE_CONFIG_CONTENT OPENCODE_DISABLE_AUTOUPDATE
exec "$AGENT_BIN" "\$@"
