"""foxhunt's job controller (FastAPI). Never imports torch."""
