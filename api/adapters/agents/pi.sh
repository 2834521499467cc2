exec "$AGENT_BIN" --provider reef --model "$MODEL" "\$@"
