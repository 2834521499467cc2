"""Serving engines behind one interface: embedded transformers, or an upstream server."""
