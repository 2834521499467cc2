# Codex reads its provider's key from REEF_API_KEY (env_key) and needs it set: Reef without
# tokens ignores the placeholder.
REEF_API_KEY="\${REEF_API_KEY:-none}"
export REEF_API_KEY
exec "$AGENT_BIN" --profile reef "\$@"
