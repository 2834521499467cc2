"""Durable storage of scenarios, records, reports and release chains."""
