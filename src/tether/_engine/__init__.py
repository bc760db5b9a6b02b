"""The run engine: the services an Engine holds (one module each), attempt/ (one attempt of a run), rules/
(what a run is held to), calls/ (one host call's path), approvals/ (docs/architecture.md draws the tree)."""
