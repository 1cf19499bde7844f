"""The scale-out processes: a supervisor, one executor, front ends (DESIGN.md "Processes")."""
