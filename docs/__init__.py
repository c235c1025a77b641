"""The documentation site's sources (MkDocs); ``python -m docs.gen`` regenerates its generated parts."""
