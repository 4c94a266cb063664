"""trajlake: an event-sourced trajectory lakehouse for agent reinforcement learning."""

__version__ = "0.1.0"
