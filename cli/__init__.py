"""The `reef` command, the program's top layer: it builds the engine, wires the app, and calls
the flows and deploy/ for the admin commands; and the evolve worker program (cli.worker)."""
