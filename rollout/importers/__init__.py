"""Importers of other tools' rollout data (Harbor job dirs, SkyRL generator dumps) into the lake."""
