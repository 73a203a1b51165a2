"""One module per CLI command family; each exposes a click command or group."""
