"""Programs that run inside a simulated host (standard library only; copied in at layout)."""
