"""One module per operator family; each tells its whole story top to bottom (see ARCHITECTURE.md)."""
