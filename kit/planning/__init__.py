"""Planning: the run config, model shapes, memory, the fit search and the planner, and what is settled at launch."""
