"""From a plan to the trainers people use, and back.

`paraplan export PLAN --to torchtitan|megatron|deepspeed` writes the plan as that trainer's
configuration (`exporter.export_plan`); `paraplan plan --from-config FILE` reads a trainer's
configuration, evaluates it pinned under the cost model and sets it beside the best plan
(`judge`). One module per trainer (`torchtitan`, `megatron`, `deepspeed`) maps the plan's
fields to that trainer's own option names, both ways; `setup` holds the types they share.
What a trainer cannot express is mapped to the nearest it has, with a warning and the
predicted cost of the difference (`costing`), or refused naming the feature. docs/export.md
has the table of every field per trainer and the versions it was checked against.
"""
