"""``gputui plan``: will a model fit, and how fast will it go, on devices this machine does not
have, for every mesh of their count (torch-free: the tracing is a spawned child's,
``gputui.train.plan_trace``). ``profiles``: the devices; ``tracing``: the child and the kept
traces; ``estimate``: the meshes, the time model and the rows; ``planner``: one plan end to
end, ``--check`` against a recorded run, the preset a chosen row becomes and the plan's PNG;
``measure``: the plan's error, a mesh measured on real CPU ranks. docs/planning.md
says how it works and how far off it is."""
