"""HTTP routes, one module per wire format or concern."""
