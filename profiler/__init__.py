"""paraplan.profiler: real `nn.Module`s into the planner's `ModelProfile` (issue 3; imports
torch). Nothing is implemented yet: the planner reads models through `planner.model_spec`."""
