"""Live adapters for RL frameworks: each records what its framework runs into the lake.

A framework is imported only inside its own module (or not at all, where the adapter talks to
its server over HTTP), so trajlake installs and imports without any of them; each framework's
own venv is built by scripts/framework-venv.sh from scripts/frameworks.toml.
"""
