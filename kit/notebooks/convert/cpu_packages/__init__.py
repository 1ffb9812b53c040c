"""CPU stand-ins for packages that need a CUDA GPU, put first on sys.path by a dry run without one
(`kit.notebooks.convert.standins`); each is imported by its own top-level name there, not from here."""
