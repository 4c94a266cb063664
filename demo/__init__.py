"""`trajlake demo`: the recipe (`recipe.py`), its CLI (`commands.py`), its summary (`report.py`) and its toy
environments (`envs/`). Above every other stage: it imports them all, and nothing imports it."""
