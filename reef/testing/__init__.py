"""Helpers that drive a running Reef from outside, shipped for the tests, the benchmarks and the
demo: `process` (`reef serve` as a subprocess), `traffic` (chat calls and reports through the
openai SDK) and `fleet` (replicas sharing one database, and a load generator across them).
The in-process server, which needs the app and the CLI, is `cli.testing.InProcessReef`."""
