"""One self-contained engine per phase; each folder differs from the one before by one idea."""
