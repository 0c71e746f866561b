"""The model store: PROBSERVE_HOME, the models probserve prepares (the embedded default, the
tiny test models) and where each lives. Imports nothing of probserve."""
