"""Sandboxes where tool commands run: a local subprocess, or a Modal sandbox."""

from trajlake.rollout.sandbox.base import ExecResult, Sandbox, sandbox_tool, setup_sandbox

__all__ = ["ExecResult", "Sandbox", "sandbox_tool", "setup_sandbox"]
