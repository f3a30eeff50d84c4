"""Reading results folders, Pareto fronts, significance tests, tables, figures and the report document."""
