"""One module per experiment kind (``registry.ALL`` names their classes)."""
