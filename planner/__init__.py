"""paraplan.planner: model + cluster + training config -> plan. Never imports torch."""
