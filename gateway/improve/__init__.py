"""From what the trajectories show to what to change: recorded calls replayed against tools as
they are now (replay), and what is loaded to replay them against (targets)."""
