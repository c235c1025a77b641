"""Generators of every part of the docs that code or measurements own.

- the configuration reference, from the pydantic settings classes and the stack YAML model;
- the CLI reference, from the typer app;
- every figure block in README.md and docs/, from the measured runs in docs/benchmarks/*.json,
  and the plots those runs draw.

``python -m docs.gen`` rewrites them all; ``python -m docs.gen --check`` lists the stale ones.
"""
