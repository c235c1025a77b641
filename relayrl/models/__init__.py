"""Model creation and loading; heavy imports (torch, transformers) happen inside functions."""
