"""Study files: YAML reading with line numbers, ``--set`` overrides, typed sections, sweep and scaling studies."""
