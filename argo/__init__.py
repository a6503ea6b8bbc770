"""Build-time code of the Argo objects: `python -m argo.render` writes the YAML beside it (`make argo`)."""
