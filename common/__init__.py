"""Shared runtime helpers below every other package: settings and their options, retry, threads,
the terminal. Imports no other trajlake package."""
